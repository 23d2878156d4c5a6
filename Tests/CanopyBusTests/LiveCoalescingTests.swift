import CZeroMQ
import CanopyBus
import CanopyMessages
import CanopyTesting
import Foundation
import Synchronization
import Testing

/// Coalescing and Majordomo through the real broker on tcp://127.0.0.1.
@Suite(.serialized)
struct LiveCoalescingTests {
    let codec = MessageCodec()

    @Test func aThousandConcurrentIdenticalRequestsMakeOneWorkerCallAndAThousandReplies() async throws {
        try await withLiveBus { bus in
            let worker = bus.startWorker(name: "w1", credit: 8)
            try await bus.waitForWorkers(1)
            let clients = try (0..<10).map { _ in try bus.client() }
            let body = try codec.encode(TestService.Request(text: "Monstera deliciosa", sleepMilliseconds: 1_500))
            let replies = try await withThrowingTaskGroup(of: RawReply.self) { group in
                for index in 0..<1_000 {
                    let client = clients[index % clients.count]
                    group.addTask {
                        try await client.call(service: TestService.name, operation: TestService.Lookup.name, body: body, principal: "user-1", idempotent: true)
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(replies.count == 1_000)
            #expect(worker.counters.calls.load(ordering: .relaxed) == 1)
            let decoded = try replies.map { try codec.decode(TestService.Reply.self, from: $0.body) }
            #expect(decoded.allSatisfy { $0.text == "Monstera deliciosa" && $0.principal == "user-1" })
            #expect(replies.allSatisfy { $0.shared })

            let stats = try await clients[0].call(Broker.Stats.self, .init())
            let lookup = try #require(stats.operations.first { $0.operation == TestService.Lookup.name })
            #expect(lookup.requests == 1_000)
            #expect(lookup.coalesced == 999)
            #expect(lookup.workerCalls == 1)
            #expect(lookup.waitersPerFlightMax == 1_000)
        }
    }

    @Test func requestsForAnotherPersonOrAnotherBodyAreNotMerged() async throws {
        try await withLiveBus { bus in
            let worker = bus.startWorker(name: "w1", credit: 8)
            try await bus.waitForWorkers(1)
            let client = try bus.client()
            async let alice = client.call(TestService.Lookup.self, .init(text: "fern", sleepMilliseconds: 300), principal: "alice")
            async let bob = client.call(TestService.Lookup.self, .init(text: "fern", sleepMilliseconds: 300), principal: "bob")
            async let other = client.call(TestService.Lookup.self, .init(text: "ferm", sleepMilliseconds: 300), principal: "alice")
            let answers = try await [alice, bob, other]
            #expect(answers.map(\.principal) == ["alice", "bob", "alice"])
            #expect(answers.map(\.text) == ["fern", "fern", "ferm"])
            #expect(worker.counters.calls.load(ordering: .relaxed) == 3)
        }
    }

    @Test func aCoalescedFlightSurvivesItsWorkerBeingKilled() async throws {
        try await withLiveBus { bus in
            let doomed = try bus.startWorkerProcess(name: "doomed")
            try await bus.waitForWorkers(1)
            let client = try bus.client(timeout: .seconds(90))
            let calls = (0..<20).map { _ in
                // Long enough for the survivor to start and register on a busy machine first
                // (the whole suite on two cores: several seconds).
                Task { try await client.call(TestService.Lookup.self, .init(text: "shared", sleepMilliseconds: 20_000)) }
            }
            try await bus.waitForLoad(inFlight: 1)
            let survivor = try bus.startWorkerProcess(name: "survivor")
            try await bus.waitForWorkers(2)
            kill(doomed.processIdentifier, SIGKILL)
            for call in calls {
                let reply = try await call.value
                #expect(reply.pid == survivor.processIdentifier)
            }
            let stats = try await client.call(Broker.Stats.self, .init())
            let lookup = try #require(stats.operations.first { $0.operation == TestService.Lookup.name })
            #expect(lookup.redispatchedFlights == 1)
            #expect(lookup.workerCalls == 2)
        }
    }

    @Test func anErrorFansOutToEveryWaiter() async throws {
        try await withLiveBus { bus in
            let worker = bus.startWorker(name: "w1")
            try await bus.waitForWorkers(1)
            let client = try bus.client()
            let outcomes = await withTaskGroup(of: CanopyError?.self) { group in
                for _ in 0..<50 {
                    group.addTask {
                        do {
                            _ = try await client.call(TestService.Fail.self, .init(text: "notFound", sleepMilliseconds: 300))
                            return nil
                        } catch { return error as? CanopyError }
                    }
                }
                return await group.reduce(into: []) { $0.append($1) }
            }
            #expect(outcomes.allSatisfy { $0?.code == .notFound })
            #expect(worker.counters.calls.load(ordering: .relaxed) == 1)
            // Not cached: the next one reaches the worker.
            await #expect(throws: CanopyError.self) { _ = try await client.call(TestService.Fail.self, .init(text: "notFound")) }
            #expect(worker.counters.calls.load(ordering: .relaxed) == 2)
        }
    }

    @Test func oneWaitersCancelAndDeadlineLeaveTheOthersWaiting() async throws {
        try await withLiveBus { bus in
            let worker = bus.startWorker(name: "w1")
            try await bus.waitForWorkers(1)
            let client = try bus.client()
            // The flight stays in the air 5 s: what follows (a join, a cancel, a hurried call) has
            // that long on a loaded machine, where 800 ms was sometimes not enough.
            let patient = Task { try await client.call(TestService.Lookup.self, .init(text: "slow", sleepMilliseconds: 5_000)) }
            #expect(try await eventually { worker.counters.running.load(ordering: .relaxed) == 1 })
            let cancelled = Task { try await client.call(TestService.Lookup.self, .init(text: "slow", sleepMilliseconds: 5_000)) }
            #expect(
                try await eventually { // it joined the flight in the air
                    try await client.call(Broker.Stats.self, .init()).operations.first { $0.operation == TestService.Lookup.name }?.coalesced == 1
                })
            cancelled.cancel()
            await #expect(throws: CancellationError.self) { _ = try await cancelled.value }
            let hurried = await #expect(throws: CanopyError.self) {
                _ = try await client.call(TestService.Lookup.self, .init(text: "slow", sleepMilliseconds: 5_000), timeout: .milliseconds(100))
            }
            #expect(hurried?.code == .timeout)
            #expect(try await patient.value.text == "slow")
            #expect(worker.counters.calls.load(ordering: .relaxed) == 1)
            #expect(worker.counters.cancellations.load(ordering: .relaxed) == 0)
        }
    }

    // MARK: - Majordomo, with clients and workers written from the 7/MDP specification

    @Test func aMajordomoClientCallsACanopyServiceAndAsksMMI() async throws {
        try await withLiveBus { bus in
            bus.startWorker(name: "w1")
            try await bus.waitForWorkers(1)
            let context = ZMQContext()
            let client = try ZMQSocket(context, type: .req) // REQ adds the empty delimiter frame itself
            defer { client.close() }
            try client.connect(bus.endpoint)

            let body = try codec.encode(TestService.Request(text: "aloe"))
            let reply = try await roundTrip(client, [Array("MDPC01".utf8), Array("test".utf8), Array("lookup".utf8), body])
            #expect(reply.count == 4)
            #expect(reply[0] == Array("MDPC01".utf8) && reply[1] == Array("test".utf8))
            #expect(reply[2] == Array("ok".utf8))
            #expect(try codec.decode(TestService.Reply.self, from: reply[3]).text == "aloe")

            let found = try await roundTrip(client, [Array("MDPC01".utf8), Array("mmi.service".utf8), Array("test".utf8)])
            #expect(found.last == Array("200".utf8))
            let missing = try await roundTrip(client, [Array("MDPC01".utf8), Array("mmi.service".utf8), Array("nothing".utf8)])
            #expect(missing.last == Array("404".utf8))
        }
    }

    @Test func aCanopyClientAndAMajordomoClientCallAMajordomoWorker() async throws {
        try await withLiveBus { bus in
            let worker = try MajordomoWorker(endpoint: bus.endpoint, service: "legacy-echo")
            defer { worker.stop() }
            try await bus.waitForWorkers(1, service: "legacy-echo")

            let canopy = try bus.client()
            let reply = try await canopy.call(service: "legacy-echo", operation: "shout", body: Array("hello".utf8))
            #expect(String(decoding: reply.body, as: UTF8.self) == "SHOUT:HELLO")

            let context = ZMQContext()
            let client = try ZMQSocket(context, type: .req)
            defer { client.close() }
            try client.connect(bus.endpoint)
            let passthrough = try await roundTrip(client, [Array("MDPC01".utf8), Array("legacy-echo".utf8), Array("a".utf8), Array("b".utf8)])
            #expect(passthrough.map { String(decoding: $0, as: UTF8.self) } == ["MDPC01", "legacy-echo", "A:B"])
        }
    }

    /// Sends on a REQ socket and waits for the answer, for at most 5 s.
    func roundTrip(_ socket: ZMQSocket, _ frames: [[UInt8]]) async throws -> [[UInt8]] {
        try socket.send(frames, dontWait: false)
        guard let reply = try await socket.receive(within: .seconds(5)) else { throw CanopyError(.timeout, "no Majordomo reply within 5 s") }
        return reply
    }
}

/// A Majordomo worker written from the 7/MDP specification on a raw DEALER socket: it
/// upper-cases its body frames and joins them with ':'.
final class MajordomoWorker: @unchecked Sendable {
    private let context = ZMQContext()
    private let stopped = Mutex(false)
    private let done = DispatchSemaphore(value: 0)

    init(endpoint: String, service: String) throws {
        let socket = try ZMQSocket(context, type: .dealer)
        try socket.connect(endpoint)
        let mdpw = Array("MDPW01".utf8)
        try socket.send([[], mdpw, [0x01], Array(service.utf8)], dontWait: false) // READY
        let box = UncheckedSocket(socket)
        Thread { [self] in
            let socket = box.socket
            var poller = Poller()
            poller.add(socket)
            var lastHeartbeat = ContinuousClock.now
            while !stopped.withLock({ $0 }) {
                try? poller.poll(timeout: .milliseconds(20))
                while let frames = try? socket.receive() {
                    // ["", "MDPW01", 0x02, client address, "", body...]
                    guard frames.count >= 5, frames[1] == mdpw, frames[2] == [0x02] else { continue }
                    let answer = frames[5...].map { String(decoding: $0, as: UTF8.self).uppercased() }.joined(separator: ":")
                    _ = try? socket.send([[], mdpw, [0x03], frames[3], [], Array(answer.utf8)])
                }
                if ContinuousClock.now - lastHeartbeat > .milliseconds(100) {
                    _ = try? socket.send([[], mdpw, [0x04]])
                    lastHeartbeat = .now
                }
            }
            _ = try? socket.send([[], mdpw, [0x05]]) // DISCONNECT
            socket.close()
            done.signal()
        }.start()
    }

    func stop() {
        stopped.withLock { $0 = true }
        done.wait()
    }
}

private struct UncheckedSocket: @unchecked Sendable {
    let socket: ZMQSocket
    init(_ socket: ZMQSocket) { self.socket = socket }
}
