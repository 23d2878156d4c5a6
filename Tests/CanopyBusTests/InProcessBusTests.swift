import CanopyBroker
import CanopyBus
import CanopyMessages
import CanopyTesting
import Foundation
import Testing

/// The in-process bus answers as the wire path does: every case below is called on a live
/// broker with a worker and on an `InProcessBus`, and the two answers must be the same.
@Suite(.serialized)
struct InProcessBusTests {
    /// One call, as its answer: the reply's text and principal, or the error's code,
    /// message and field.
    enum Answer: Equatable {
        case reply(text: String, principal: String?)
        case blobs(label: String, blobs: [Data])
        case error(CanopyError)
    }

    typealias Case = @Sendable (any BusCalling) async throws -> Answer

    static func answer(_ body: () async throws -> Answer) async -> Answer {
        do {
            return try await body()
        } catch let error as CanopyError {
            return .error(error)
        } catch {
            return .error(CanopyError(.internal, "\(error)"))
        }
    }

    static func echo(_ bus: any BusCalling, _ request: TestService.Request, principal: String? = nil, timeout: Duration? = nil) async throws -> Answer {
        let reply = try await bus.call(TestService.Echo.self, request, principal: principal, timeout: timeout)
        return .reply(text: reply.text, principal: reply.principal)
    }

    static let cases: [(String, Case)] = [
        ("a plain call", { bus in try await echo(bus, .init(text: "hello")) }),
        ("a principal reaches the handler", { bus in try await echo(bus, .init(text: "p"), principal: "alice") }),
        ("a Unicode-equivalent principal is refused", { bus in try await echo(bus, .init(text: "p"), principal: "jose\u{301}") }),
        ("a principal with a space is refused", { bus in try await echo(bus, .init(text: "p"), principal: "two words") }),
        (
            "an unknown operation",
            { bus in
                let raw = try await bus.call(
                    service: "test", operation: "nope", body: Array("{}".utf8), attachments: [], principal: nil, timeout: nil, idempotent: false)
                return .reply(text: String(decoding: raw.body, as: UTF8.self), principal: nil)
            }
        ),
        (
            "an unknown service",
            { bus in
                let raw = try await bus.call(
                    service: "nobody", operation: "echo", body: Array("{}".utf8), attachments: [], principal: nil, timeout: nil, idempotent: false)
                return .reply(text: String(decoding: raw.body, as: UTF8.self), principal: nil)
            }
        ),
        (
            "an invalid service name",
            { bus in
                _ = try await bus.call(
                    service: "Bad Name", operation: "echo", body: Array("{}".utf8), attachments: [], principal: nil, timeout: nil, idempotent: false)
                return .reply(text: "", principal: nil)
            }
        ),
        (
            "invalid JSON",
            { bus in
                _ = try await bus.call(
                    service: "test", operation: "echo", body: Array("{not json".utf8), attachments: [], principal: nil, timeout: nil, idempotent: false)
                return .reply(text: "", principal: nil)
            }
        ),
        (
            "duplicate keys",
            { bus in
                _ = try await bus.call(
                    service: "test", operation: "echo", body: Array(#"{"text":"a","text":"b","sleepMilliseconds":0}"#.utf8), attachments: [],
                    principal: nil, timeout: nil, idempotent: false)
                return .reply(text: "", principal: nil)
            }
        ),
        ("a request frame over the limit", { bus in try await echo(bus, .init(text: String(repeating: "y", count: 80_000))) }),
        ("a reply frame over the limit", { bus in try await echo(bus, .init(text: "big", replyPaddingBytes: 80_000)) }),
        (
            "a handler's own error, as it wrote it",
            { bus in
                let reply = try await bus.call(TestService.Fail.self, .init(text: "conflict"))
                return .reply(text: reply.text, principal: nil)
            }
        ),
        ("a deadline that passes", { bus in try await echo(bus, .init(text: "slow", sleepMilliseconds: 5_000), timeout: .milliseconds(200)) }),
        (
            "attachments both ways",
            { bus in
                let reply = try await bus.call(TestService.ReverseBlobs.self, .init(label: "two", blobs: [Data([1, 2, 3]), Data([9])]))
                return .blobs(label: reply.label, blobs: reply.blobs)
            }
        ),
    ]

    @Test func everyCaseIsAnsweredAsTheLiveBusAnswersIt() async throws {
        var configuration = BrokerConfiguration.testing
        configuration.maximumFrameBytes = 64 * 1024
        let inProcess = InProcessBus(maximumFrameBytes: configuration.maximumFrameBytes)
        inProcess.register(TestWorkerService(workerName: "w1")) // the same name: replies of the same size
        try await withLiveBus(configuration: configuration) { bus in
            bus.startWorker(name: "w1")
            try await bus.waitForWorkers(1)
            let live = try bus.client()
            for (name, call) in Self.cases {
                let overTheWire = await Self.answer { try await call(live) }
                let direct = await Self.answer { try await call(inProcess) }
                #expect(direct == overTheWire, "\(name): in process \(direct), live \(overTheWire)")
            }
        }
    }

    @Test func aDeadlineCancelsTheHandlerAndACancelledCallerToo() async throws {
        let service = TestWorkerService(workerName: "in-process")
        let bus = InProcessBus(serving: service)
        let started = ContinuousClock.now
        let error = await #expect(throws: CanopyError.self) {
            try await bus.call(TestService.Echo.self, .init(text: "slow", sleepMilliseconds: 10_000), timeout: .milliseconds(100))
        }
        #expect(error?.code == .timeout)
        #expect(ContinuousClock.now - started < .seconds(5), "answered at the deadline, not when the handler would end")
        let call = Task { try await bus.call(TestService.Echo.self, .init(text: "slow", sleepMilliseconds: 10_000)) }
        #expect(try await eventually { service.counters.running.load(ordering: .relaxed) == 1 })
        call.cancel()
        await #expect(throws: CancellationError.self) { try await call.value }
        #expect(try await eventually { service.counters.cancellations.load(ordering: .relaxed) == 2 }, "both handlers were cancelled")
    }

    @Test func aServiceThatLeavesIsAnsweredNoWorkers() async throws {
        let bus = InProcessBus(serving: TestWorkerService(workerName: "in-process"))
        #expect(try await bus.call(TestService.Echo.self, .init(text: "here")).text == "here")
        #expect(bus.descriptors(of: TestService.name).map(\.name).contains("echo"))
        bus.unregister(TestService.name)
        let error = await #expect(throws: CanopyError.self) { try await bus.call(TestService.Echo.self, .init(text: "gone")) }
        #expect(error?.code == .noWorkers)
    }
}
