import CZeroMQ
import CanopyBroker
import CanopyBus
import CanopyMessages
import CanopyTesting
import Foundation
import Testing

/// The real broker, workers and clients on tcp://127.0.0.1 with ephemeral ports.
/// Serialized: each test starts its own broker, and heartbeat timing wants the CPU.
@Suite(.serialized)
struct LiveBusTests {
    @Test func aCallRoundTripsWithItsPrincipal() async throws {
        try await withLiveBus { bus in
            bus.startWorker(name: "w1")
            try await bus.waitForWorkers(1)
            let client = try bus.client()
            let reply = try await client.call(TestService.Echo.self, .init(text: "monstera"), principal: "user-42")
            #expect(reply.text == "monstera")
            #expect(reply.principal == "user-42")
            #expect(reply.worker == "w1")
        }
    }

    @Test func manyConcurrentCallsShareOneClientAndAreBalancedAcrossWorkers() async throws {
        try await withLiveBus { bus in
            let first = bus.startWorker(name: "w1", credit: 4)
            let second = bus.startWorker(name: "w2", credit: 4)
            try await bus.waitForWorkers(2)
            // What is checked is balance, not time: a deadline well past what a machine
            // busy with the other suites' stacks may take for 200 calls.
            let client = try bus.client(timeout: .seconds(60))
            let replies = try await withThrowingTaskGroup(of: TestService.Reply.self) { group in
                for index in 0..<200 {
                    group.addTask { try await client.call(TestService.Echo.self, .init(text: "\(index)", sleepMilliseconds: 2)) }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(Set(replies.map(\.text)) == Set((0..<200).map(String.init)))
            let one = first.counters.calls.load(ordering: .relaxed), two = second.counters.calls.load(ordering: .relaxed)
            #expect(one + two == 200)
            #expect(one >= 50 && two >= 50, "both workers served: \(one) and \(two)")
        }
    }

    @Test func aWorkerNeverHoldsMoreThanItsCredit() async throws {
        try await withLiveBus { bus in
            let worker = bus.startWorker(name: "w1", credit: 2)
            try await bus.waitForWorkers(1)
            let client = try bus.client()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<8 {
                    group.addTask { _ = try await client.call(TestService.Echo.self, .init(text: "\(index)", sleepMilliseconds: 50)) }
                }
                try await group.waitForAll()
            }
            #expect(worker.counters.calls.load(ordering: .relaxed) == 8)
            #expect(worker.counters.mostRunning.load(ordering: .relaxed) == 2)
        }
    }

    @Test func aFullQueueIsAnsweredBusy() async throws {
        var configuration = BrokerConfiguration.testing
        configuration.maximumQueuedPerService = 1
        try await withLiveBus(configuration: configuration) { bus in
            let worker = bus.startWorker(name: "w1", credit: 1)
            try await bus.waitForWorkers(1)
            let client = try bus.client()
            // Each step waits for the state it needs instead of sleeping, so a busy machine
            // cannot reorder them: one call held by the worker, one queued, then the third.
            let held = Task { try await client.call(TestService.Echo.self, .init(text: "held", sleepMilliseconds: 30_000)) }
            #expect(try await eventually(within: .seconds(20)) { worker.counters.running.load(ordering: .relaxed) == 1 })
            let queued = Task { try await client.call(TestService.Echo.self, .init(text: "queued", sleepMilliseconds: 0)) }
            try await bus.waitForLoad(inFlight: 1, queued: 1)
            let refused = await #expect(throws: CanopyError.self) {
                _ = try await client.call(TestService.Echo.self, .init(text: "third", sleepMilliseconds: 0))
            }
            #expect(refused?.code == .busy, "one held by the worker, one queued: the third is refused")
            held.cancel() // the worker's credit comes back and the queued call runs
            #expect(try await queued.value.text == "queued")
            #expect(worker.counters.calls.load(ordering: .relaxed) == 2)
        }
    }

    @Test func aCallPastItsDeadlineIsAnsweredTimeoutAndCancelledAtTheWorker() async throws {
        try await withLiveBus { bus in
            let worker = bus.startWorker(name: "w1")
            try await bus.waitForWorkers(1)
            let client = try bus.client()
            let started = ContinuousClock.now
            let error = await #expect(throws: CanopyError.self) {
                _ = try await client.call(TestService.Echo.self, .init(text: "slow", sleepMilliseconds: 5_000), timeout: .milliseconds(200))
            }
            #expect(error?.code == .timeout)
            #expect(ContinuousClock.now - started < .seconds(5), "answered before the worker would have (at 5 s)")
            #expect(try await eventually { worker.counters.cancellations.load(ordering: .relaxed) == 1 })
        }
    }

    @Test func cancellingTheCallingTaskSendsACancel() async throws {
        try await withLiveBus { bus in
            let worker = bus.startWorker(name: "w1")
            try await bus.waitForWorkers(1)
            let client = try bus.client()
            let call = Task { try await client.call(TestService.Echo.self, .init(text: "slow", sleepMilliseconds: 5_000)) }
            #expect(try await eventually { worker.counters.running.load(ordering: .relaxed) == 1 })
            call.cancel()
            await #expect(throws: CancellationError.self) { _ = try await call.value }
            #expect(try await eventually { worker.counters.cancellations.load(ordering: .relaxed) == 1 })
            // The worker's credit came back: it still serves.
            #expect(try await client.call(TestService.Echo.self, .init(text: "after")).text == "after")
        }
    }

    @Test func aTenMebibyteFrameArrivesWholeAndOneOverTheLimitIsTooLarge() async throws {
        var configuration = BrokerConfiguration.testing
        configuration.maximumFrameBytes = 12 * 1024 * 1024
        try await withLiveBus(configuration: configuration) { bus in
            bus.startWorker(name: "w1")
            try await bus.waitForWorkers(1)
            let client = try bus.client()
            let big = String(repeating: "a", count: 10 * 1024 * 1024)
            #expect(try await client.call(TestService.Echo.self, .init(text: big)).text == big)
            let error = await #expect(throws: CanopyError.self) {
                _ = try await client.call(TestService.Echo.self, .init(text: big + big))
            }
            #expect(error?.code == .tooLarge)
        }
    }

    @Test func aKilledWorkerProcessesIdempotentRequestIsAnsweredByAnotherAndTheOtherIsLost() async throws {
        try await withLiveBus { bus in
            let doomed = try bus.startWorkerProcess(name: "doomed")
            try await bus.waitForWorkers(1)
            // Patient: a survivor process started on a loaded machine, the 1 s expiry and the 3 s
            // handler all fit in it.
            let client = try bus.client(timeout: .seconds(60))
            // Both go to the only worker, which will hold them for 3 s.
            let idempotent = Task { try await client.call(TestService.Echo.self, .init(text: "again", sleepMilliseconds: 3_000)) }
            let once = Task { try await client.call(TestService.Append.self, .init(text: "once", sleepMilliseconds: 3_000)) }
            try await bus.waitForLoad(inFlight: 2)
            let survivor = try bus.startWorkerProcess(name: "survivor")
            try await bus.waitForWorkers(2)
            kill(doomed.processIdentifier, SIGKILL)

            let reply = try await idempotent.value
            #expect(reply.worker == "survivor")
            #expect(reply.pid == survivor.processIdentifier)
            let error = await #expect(throws: CanopyError.self) { _ = try await once.value }
            #expect(error?.code == .workerLost)
            try await bus.waitForWorkers(1)
        }
    }

    @Test func workersAndClientsReconnectWhenTheBrokerRestarts() async throws {
        var configuration = BrokerConfiguration.testing
        configuration.drainTimeout = .zero // the old broker leaves its requests unanswered
        // The resent call may reach the new broker before the worker, on a loaded machine
        // later than the tests' 1 s worker expiry: the grace holds it for the worker.
        configuration.startupGrace = .seconds(30)
        try await withLiveBus(configuration: configuration) { bus in
            let worker = bus.startWorker(name: "w1")
            try await bus.waitForWorkers(1)
            let client = try bus.client()
            #expect(try await client.call(TestService.Echo.self, .init(text: "before")).text == "before")

            let inFlight = Task { try await client.call(TestService.Echo.self, .init(text: "during", sleepMilliseconds: 400)) }
            let lost = Task { try await client.call(TestService.Append.self, .init(text: "during", sleepMilliseconds: 400)) }
            #expect(try await eventually { worker.counters.running.load(ordering: .relaxed) == 2 }, "both at the worker")
            try await bus.restartBroker()

            #expect(try await inFlight.value.text == "during", "an idempotent call is sent again to the new broker")
            let error = await #expect(throws: CanopyError.self) { _ = try await lost.value }
            #expect(error?.code == .brokerLost)
            try await bus.waitForWorkers(1)
            #expect(try await client.call(TestService.Echo.self, .init(text: "after")).text == "after")
        }
    }

    @Test func theBrokerSurvivesThousandsOfRandomAndTruncatedMessages() async throws {
        try await withLiveBus { bus in
            bus.startWorker(name: "w1")
            try await bus.waitForWorkers(1)
            let context = ZMQContext()
            let attacker = try ZMQSocket(context, type: .dealer)
            defer { attacker.close() }
            try attacker.connect(bus.endpoint)
            var generator = SystemRandomNumberGenerator()
            let valid: [[UInt8]] = [
                Wire.version, Wire.Command.request.frame, Wire.frame(UInt64(1)), Array("test".utf8), Array("echo".utf8),
                RequestHeader(timeoutMilliseconds: 1_000).frame, Array(#"{"text":"x","sleepMilliseconds":0}"#.utf8),
            ]
            for round in 0..<5_000 {
                var frames: [[UInt8]]
                switch round % 4 {
                case 0: // random frames
                    frames = (0..<Int.random(in: 1...8, using: &generator)).map { _ in
                        (0..<Int.random(in: 0...40, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
                    }
                case 1: // a valid request cut short
                    frames = Array(valid.prefix(Int.random(in: 1...6, using: &generator)))
                case 2: // a valid shape with one frame scrambled
                    frames = valid
                    let index = Int.random(in: 1..<valid.count, using: &generator)
                    frames[index] = (0..<Int.random(in: 0...12, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
                default: // worker commands from a stranger, and other commands
                    frames =
                        [Wire.version, [UInt8.random(in: 0...0x30, using: &generator)]]
                        + (0..<Int.random(in: 0...5, using: &generator)).map { _ in Array("x".utf8) }
                }
                try attacker.send(frames)
            }
            // Still serving, and still answering the management operations (a call may be lost
            // with the worker's connection if, on a loaded machine, the flood held its heartbeats
            // past the tests' 1 s expiry: the next one is served).
            let client = try bus.client()
            #expect(
                try await eventually(within: .seconds(60)) {
                    (try? await client.call(TestService.Echo.self, .init(text: "still here"), timeout: .seconds(5)))?.text == "still here"
                }, "the broker serves after the flood")
            let stats = try await client.call(Broker.Stats.self, .init())
            #expect(stats.rejected > 1_000)
            // One worker, none added by the flood (on a loaded machine the worker may have
            // reconnected once under it, and its old registration expires within a second).
            try await bus.waitForWorkers(1, within: .seconds(10))
        }
    }

    @Test func callsOnAClosedClientFailAtOnceInsteadOfWaiting() async throws {
        try await withLiveBus { bus in
            let client = try bus.client()
            client.close() // a call posted now meets the close first, or the stopped loop: failed either way
            let started = ContinuousClock.now
            let error = await #expect(throws: CanopyError.self) { _ = try await client.call(Broker.Services.self, .init()) }
            #expect(error?.message.contains("closed") == true)
            #expect(ContinuousClock.now - started < .seconds(10), "not at the call's deadline (10 s): it did not wait")
        }
    }

    @Test func requestsFreedTogetherGoToAWorkerInOneBatchAndItsBatchOfRepliesAnswersEach() async throws {
        // The worker below sends no heartbeats: the broker counts it gone only after 30 s.
        var patient = BrokerConfiguration.testing
        patient.liveness = 300
        try await withLiveBus(configuration: patient) { bus in
            let context = ZMQContext()
            let worker = try ZMQSocket(context, type: .dealer)
            let caller = try ZMQSocket(context, type: .dealer)
            defer {
                worker.close()
                caller.close()
            }
            try worker.connect(bus.endpoint)
            try caller.connect(bus.endpoint)
            let operations = [OperationDescriptor(name: "echo", idempotent: true, coalescable: false)]
            try worker.send(WireMessage.ready(service: "batch", operations: operations, credit: 1).encoded)
            /// The worker's next message other than the broker's heartbeats (every 100 ms here).
            func nextForWorker() async throws -> WireMessage? {
                while let frames = try await worker.receive(within: .seconds(5)) {
                    let message = try WireMessage(frames: frames)
                    if message.command != .brokerHeartbeat { return message }
                }
                return nil
            }
            // 21 requests: the first takes the worker's one credit, the other 20 wait in the queue.
            for index in 1...21 {
                let request = WireRequest(
                    correlation: Wire.frame(UInt64(index)), service: "batch", operation: "echo", header: RequestHeader(timeoutMilliseconds: 30_000),
                    body: Array("{\"n\":\(index)}".utf8))
                try caller.send(WireMessage.request(request).encoded)
            }
            let first = try #require(try await nextForWorker())
            guard case .dispatch(let firstID, _, _, _, _) = first else {
                Issue.record("the first request came as \(first.command)")
                return
            }
            let observer = try bus.client()
            let queued = try await eventually {
                try await observer.call(Broker.Stats.self, .init()).services.first { $0.name == "batch" }?.queued == 20
            }
            try #require(queued, "the other 20 wait in the queue")
            // Credit for all of them at once: the broker hands the 20 over in one message.
            try worker.send(WireMessage.credit(21).encoded)
            var batch: [WireMessage.BatchedDispatch] = []
            switch try #require(try await nextForWorker()) {
            case .dispatchBatch(let requests): batch = requests
            case let other: Issue.record("expected one batch, got \(other.command)")
            }
            #expect(batch.count == 20 && batch.allSatisfy { $0.operation == "echo" })
            #expect(Set(batch.map(\.body)).count == 20, "each request once")
            // The worker answers all 21 in one batch; each caller gets its own body back.
            let replies =
                [WireMessage.BatchedReply(requestID: firstID, failed: false, body: Array("{\"n\":1}".utf8))]
                + batch.map { WireMessage.BatchedReply(requestID: $0.requestID, failed: false, body: $0.body) }
            try worker.send(WireMessage.workerReplyBatch(replies).encoded)
            var answered: [UInt64: [UInt8]] = [:]
            while answered.count < 21 {
                let frames = try #require(try await caller.receive(within: .seconds(5)))
                guard case .reply(let correlation, _, let body, _) = try WireMessage(frames: frames) else {
                    Issue.record("expected replies only")
                    return
                }
                answered[Wire.uint64(correlation) ?? 0] = body
            }
            #expect(answered.allSatisfy { $0.value == Array("{\"n\":\($0.key)}".utf8) }, "each answer to its own caller")
        }
    }

    @Test func anotherProtocolVersionIsRefusedWithAnErrorFrame() async throws {
        try await withLiveBus { bus in
            let context = ZMQContext()
            let peer = try ZMQSocket(context, type: .dealer)
            defer { peer.close() }
            try peer.connect(bus.endpoint)
            try peer.send([Array("canopy/9".utf8), Wire.Command.request.frame, [7]])
            let frames = try #require(try await peer.receive(within: .seconds(5)))
            #expect(frames[0] == Wire.version)
            #expect(frames[1] == Wire.Command.error.frame)
            #expect(frames[2] == [7])
            let error = try MessageCodec().decode(CanopyError.self, from: frames[3])
            #expect(error.code == .badRequest)
            #expect(error.message.contains("canopy/9"))
        }
    }
}
