import CanopyBroker
import CanopyBus
import CanopyMessages
import CanopyTesting
import Synchronization
import Testing

/// Who may call an operation is declared in its type and checked by the runtime before the
/// handler runs: on the in-process bus and over the live broker alike.
@Suite(.serialized)
struct AccessTests {
    struct Text: Codable, Sendable, Equatable {
        var text: String
    }

    /// `access.mine`: one person's own data; the handler is handed the owner.
    enum Mine: BusOperation {
        typealias Request = Text
        typealias Reply = Text
        static let service = "access"
        static let name = "mine"
    }

    /// `access.figures`: the operator's.
    enum Figures: BusOperation {
        typealias Request = Text
        typealias Reply = Text
        static let service = "access"
        static let name = "figures"
        static let access = Access.operator
    }

    /// `access.open`: anyone's.
    enum Open: BusOperation {
        typealias Request = Text
        typealias Reply = Text
        static let service = "access"
        static let name = "open"
        static let access = Access.public
    }

    /// `access.follow-up`: one service's to another, for a person.
    enum FollowUp: BusOperation {
        typealias Request = Text
        typealias Reply = Text
        static let service = "access"
        static let name = "follow-up"
        static let access = Access.service
    }

    struct AccessService: BusService {
        let name = "access"
        let ran = Calls()
        final class Calls: Sendable {
            let count = Atomic<Int>(0)
        }

        func register(_ handlers: inout OperationHandlers) {
            handlers.on(Mine.self) { [ran] request, owner, _ in
                ran.count.add(1, ordering: .relaxed)
                return Text(text: "\(owner): \(request.text)")
            }
            handlers.on(Figures.self) { [ran] request, context in
                ran.count.add(1, ordering: .relaxed)
                return Text(text: "figures \(context.principal ?? "none")")
            }
            handlers.on(Open.self) { [ran] request, context in
                ran.count.add(1, ordering: .relaxed)
                return Text(text: "open \(context.principal ?? "none")")
            }
            handlers.on(FollowUp.self) { [ran] request, owner, context in
                ran.count.add(1, ordering: .relaxed)
                return Text(text: "follow-up for \(owner), by a service: \(context.byService)")
            }
        }
    }

    static func refusal(_ body: () async throws -> Text) async -> CanopyError? {
        do {
            _ = try await body()
            return nil
        } catch {
            return error as? CanopyError
        }
    }

    @Test(arguments: BusMode.allCases) func eachOperationIsCalledOnlyAsItsTypeDeclares(_ mode: BusMode) async throws {
        try await withTestBus(mode) { bus in
            let service = AccessService()
            try await bus.serve(service)
            let client = try bus.client()

            #expect(try await client.call(Mine.self, .init(text: "fern"), principal: "alice").text == "alice: fern", "the owner is handed over")
            let anonymous = await Self.refusal { try await client.call(Mine.self, .init(text: "fern")) }
            #expect(anonymous?.code == .unauthorized && anonymous?.message.contains("needs a principal") == true)

            #expect(try await client.call(Figures.self, .init(text: "")).text == "figures none")
            let onBehalf = await Self.refusal { try await client.call(Figures.self, .init(text: ""), principal: "alice") }
            #expect(onBehalf?.code == .unauthorized && onBehalf?.message.contains("operator") == true)

            #expect(try await client.call(Open.self, .init(text: "")).text == "open none")
            #expect(try await client.call(Open.self, .init(text: ""), principal: "bob").text == "open bob")

            // Service to service: only a service's own client, and for a person.
            let services = try bus.client(asService: true)
            #expect(try await services.call(FollowUp.self, .init(text: ""), principal: "alice").text == "follow-up for alice, by a service: true")
            let fromTheEdge = await Self.refusal { try await client.call(FollowUp.self, .init(text: ""), principal: "alice") }
            #expect(fromTheEdge?.code == .unauthorized && fromTheEdge?.message.contains("only a service's own bus client") == true)
            let forNobody = await Self.refusal { try await services.call(FollowUp.self, .init(text: "")) }
            #expect(forNobody?.code == .unauthorized && forNobody?.message.contains("needs a principal") == true)

            // A refused call is refused before its body is read, and its handler never runs.
            let garbled = await #expect(throws: CanopyError.self) {
                try await client.call(service: "access", operation: "mine", body: Array("{not json".utf8))
            }
            #expect(garbled?.code == .unauthorized)
            #expect(service.ran.count.load(ordering: .relaxed) == 5, "only the five allowed calls ran")
        }
    }

    @Test func theBrokersOwnOperationsAreCheckedToo() async throws {
        try await withLiveBus { bus in
            let client = try bus.client()
            #expect(try await client.call(Broker.Stats.self, .init()).services.isEmpty)
            let onBehalf = await #expect(throws: CanopyError.self) { try await client.call(Broker.Stats.self, .init(), principal: "alice") }
            #expect(onBehalf?.code == .unauthorized)
            _ = try await client.call(Broker.Services.self, .init(), principal: "alice") // public: the edge's health asks it
        }
    }

    @Test func withCurveOnlyAWorkersKeyMayCallAsAService() async throws {
        guard Curve.isAvailable else { return }
        let broker = try CurveKeyPair.generate(), worker = try CurveKeyPair.generate(), client = try CurveKeyPair.generate()
        let curve = CurveServerSettings(
            keyPair: broker, allowList: CurveAllowList(workers: WorkerKeys([worker.publicKey: ["access"]]), clients: [client.publicKey]))
        func peer(_ pair: CurveKeyPair) -> CurveClientSettings { CurveClientSettings(serverKey: broker.publicKey, keyPair: pair) }
        try await withLiveBus(curve: curve) { bus in
            bus.startRunner(AccessService(), curve: peer(worker))
            try await bus.waitForWorkers(1, service: "access", curve: peer(client))
            // A client key that claims to be a service is refused by the broker itself.
            let pretender = try bus.client(curve: peer(client), asService: true)
            let refused = await Self.refusal { try await pretender.call(FollowUp.self, .init(text: ""), principal: "alice") }
            #expect(refused?.code == .unauthorized && refused?.message.contains("worker key") == true, "\(refused?.message ?? "")")
            // A service's key (its worker key: a service calls with the key it serves with) may.
            let service = try bus.client(curve: peer(worker), asService: true)
            #expect(try await service.call(FollowUp.self, .init(text: ""), principal: "alice").text == "follow-up for alice, by a service: true")
            // The same client key, as itself, still calls what a person may.
            #expect(try await bus.client(curve: peer(client)).call(Mine.self, .init(text: "fern"), principal: "alice").text == "alice: fern")
        }
    }
}
