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

            // A refused call is refused before its body is read, and its handler never runs.
            let garbled = await #expect(throws: CanopyError.self) {
                try await client.call(service: "access", operation: "mine", body: Array("{not json".utf8))
            }
            #expect(garbled?.code == .unauthorized)
            #expect(service.ran.count.load(ordering: .relaxed) == 4, "only the four allowed calls ran")
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
}
