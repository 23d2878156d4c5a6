import CanopyBroker
import CanopyBus
import CanopyMessages
import Foundation
import Testing

/// The broker's routing logic, driven without sockets: the time is an argument.
struct BrokerStateTests {
    let codec = MessageCodec()
    typealias Harness = BrokerHarness

    // MARK: - Routing and balancing

    @Test func routesARequestToAWorkerOfTheNamedServiceAndItsReplyBack() {
        var broker = Harness()
        broker.ready("w1")
        broker.ready("other", service: "images")
        let out = broker.request("c1", 7, principal: "user-1", body: #"{"id":"p1"}"#)
        let sent = dispatches(out)
        #expect(sent.count == 1)
        #expect(sent[0].worker == "w1")
        #expect(sent[0].operation == "get")
        #expect(sent[0].header.principal == "user-1")
        let answer = replies(broker.reply("w1", request: sent[0].id))
        #expect(answer.count == 1)
        #expect(answer[0].client == "c1")
        #expect(answer[0].correlation == Wire.frame(UInt64(7)))
        #expect(answer[0].body == #"{"ok":true}"#)
    }

    @Test func balancesRequestsRoundRobinAcrossWorkers() {
        var broker = Harness()
        broker.ready("w1")
        broker.ready("w2")
        broker.ready("w3")
        let workers = (1...6).map { dispatches(broker.request("c", UInt64($0)))[0].worker }
        #expect(workers == ["w1", "w2", "w3", "w1", "w2", "w3"])
    }

    @Test func honoursEachWorkersCreditAndQueuesTheRest() {
        var broker = Harness()
        broker.ready("w1", credit: 2)
        let first = dispatches(broker.request("c", 1))
        let second = dispatches(broker.request("c", 2))
        let third = dispatches(broker.request("c", 3))
        #expect(first.count == 1 && second.count == 1)
        #expect(third.isEmpty, "a worker with credit 2 holds at most 2 requests")
        #expect(broker.state.statistics(now: broker.now).services[0].queued == 1)
        let afterReply = dispatches(broker.reply("w1", request: first[0].id))
        #expect(afterReply.count == 1, "the queued request goes out when credit comes back")
    }

    /// A worker of several brokers moves its credit between them with CREDIT: more is
    /// dispatched at once, less takes effect as it replies, 0 holds nothing new.
    @Test func aCreditMessageChangesWhatAWorkerHolds() {
        var broker = Harness()
        broker.ready("w1", credit: 1)
        let first = dispatches(broker.request("c", 1))
        #expect(first.count == 1 && dispatches(broker.request("c", 2)).isEmpty && dispatches(broker.request("c", 3)).isEmpty)
        #expect(dispatches(broker.receive(WireMessage.credit(3).encoded, from: "w1")).count == 2, "two more at once")
        _ = broker.request("c", 4)
        #expect(dispatches(broker.receive(WireMessage.credit(0).encoded, from: "w1")).isEmpty)
        #expect(dispatches(broker.reply("w1", request: first[0].id)).isEmpty, "credit 0: nothing new, though one was queued")
        #expect(broker.state.statistics(now: broker.now).services[0].queued == 1)
        #expect(dispatches(broker.receive(WireMessage.credit(5).encoded, from: "w1")).count == 1)
        // From a worker the broker does not know: register again.
        #expect(
            broker.receive(WireMessage.credit(2).encoded, from: "stranger").contains { directive in
                if case .send(let to, .brokerDisconnect) = directive { to == Array("stranger".utf8) } else { false }
            })
    }

    @Test func cancelsAnywhereInALongQueueLeaveTheRestInOrderAndTheQueueBounded() {
        var broker = Harness()
        broker.ready("w1", credit: 1)
        let held = dispatches(broker.request("c", 0))
        #expect(held.count == 1)
        let count: UInt64 = 20_000
        for index in 1...count { _ = broker.request("c", index, timeoutMs: 600_000) }
        // Cancelled from the back, as a client that gives up on its newest first: each one is
        // taken out without a search of the queue.
        for index in stride(from: count, through: 2, by: -1) where index % 4 != 0 {
            _ = broker.receive(WireMessage.cancel(correlation: Wire.frame(index)).encoded, from: "c")
        }
        let statistics = broker.state.statistics(now: broker.now).services[0]
        #expect(statistics.queued == Int(count / 4) + 1, "the live ones: every fourth, and the first")
        #expect(broker.state.queueLength(of: "plants") <= 2 * (Int(count / 4) + 1) + 1_024, "cancelled ids do not pile up")
        // What is left goes out in its order.
        var next = dispatches(broker.reply("w1", request: held[0].id))
        var order: [UInt64] = []
        while let sent = next.first {
            order.append(sent.id)
            next = dispatches(broker.reply("w1", request: sent.id))
        }
        #expect(order.count == Int(count / 4) + 1 && order == order.sorted(), "every live one, oldest first")
    }

    @Test func everyByteAHeldRequestCostsIsCountedAndBoundedEvenWithEmptyBodies() {
        var broker = Harness { $0.maximumHeldBytes = 256 * 1024 }
        let configuration = broker.state.configuration
        broker.ready("w1", credit: 1)
        let principal = String(repeating: "p", count: 256)
        var refused = 0
        for index in 0..<2_000 {
            // An empty body, a 256-byte principal, a 64-byte correlation id.
            let header = RequestHeader(timeoutMilliseconds: 600_000, principal: principal)
            let request = WireRequest(
                correlation: Array(repeating: UInt8(index % 250), count: 56) + Wire.frame(UInt64(index)), service: "plants",
                operation: "get", header: header, body: [], attachments: [])
            refused += errors(broker.receive(WireMessage.request(request).encoded, from: "client-\(index % 7)")).filter { $0.error.code == .busy }.count
        }
        let held = broker.state.heldBytes
        #expect(held > 0 && held <= configuration.maximumHeldBytes, "\(held)")
        #expect(refused > 0, "empty bodies are not free: the bound refuses some")
        let accepted = 2_000 - refused
        #expect(held >= accepted * (256 + 64), "each counts at least its principal and correlation id: \(held) for \(accepted)")
        // Cancelled, everything is given back to the count.
        for index in 0..<2_000 {
            let correlation = Array(repeating: UInt8(index % 250), count: 56) + Wire.frame(UInt64(index))
            _ = broker.receive(WireMessage.cancel(correlation: correlation).encoded, from: "client-\(index % 7)")
        }
        #expect(broker.state.heldBytes == 0, "\(broker.state.heldBytes) bytes left counted after every request went")
    }

    @Test func dispatchesOnlyToWorkersThatDeclaredTheOperation() {
        var broker = Harness()
        broker.ready("reader", operations: [OperationDescriptor(name: "get", idempotent: true, coalescable: false)])
        broker.ready("writer", operations: [OperationDescriptor(name: "add", idempotent: false, coalescable: false)])
        #expect(dispatches(broker.request("c", 1, operation: "add")).map(\.worker) == ["writer"])
        #expect(dispatches(broker.request("c", 2, operation: "add")).map(\.worker) == ["writer"])
        #expect(dispatches(broker.request("c", 3, operation: "get")).map(\.worker) == ["reader"])
    }

    @Test func aWorkerThatJoinsWithoutAnOperationIsNeverSentIt() {
        var broker = Harness()
        let get = OperationDescriptor(name: "get", idempotent: true, coalescable: false)
        let add = OperationDescriptor(name: "add", idempotent: false, coalescable: false)
        broker.ready("both", operations: [get, add], credit: 100)
        #expect(dispatches(broker.request("c", 1, operation: "add")).map(\.worker) == ["both"]) // resolved: every worker serves it
        broker.ready("reader", operations: [get], credit: 100)
        let adds = (2...9).flatMap { dispatches(broker.request("c", UInt64($0), operation: "add")).map(\.worker) }
        #expect(adds == Array(repeating: "both", count: 8), "\(adds)")
        let gets = (10...13).flatMap { dispatches(broker.request("c", UInt64($0), operation: "get")).map(\.worker) }
        #expect(Set(gets) == ["both", "reader"])
        _ = broker.receive([Wire.version, Wire.Command.workerDisconnect.frame], from: "both")
        #expect(errors(broker.request("c", 14, operation: "add")).map(\.error.code) == [.badRequest])
        #expect(dispatches(broker.request("c", 15, operation: "get")).map(\.worker) == ["reader"])
    }

    // MARK: - Refusals

    @Test func aFullQueueIsAnsweredBusyAtOnce() {
        var broker = Harness { $0.maximumQueuedPerService = 1 }
        broker.ready("w1", credit: 1)
        _ = broker.request("c", 1)
        _ = broker.request("c", 2)
        let refused = errors(broker.request("c", 3))
        #expect(refused.map(\.error.code) == [.busy])
        #expect(refused[0].correlation == Wire.frame(UInt64(3)))
    }

    @Test func aServiceWithoutWorkersIsAnsweredNoWorkers() {
        var broker = Harness()
        #expect(errors(broker.request("c", 1, service: "care")).map(\.error.code) == [.noWorkers])
    }

    @Test func aFreshBrokerHoldsRequestsUntilWorkersHaveHadTimeToRegister() {
        var broker = Harness(fresh: true)
        // Clients reconnect to a restarted broker before workers do.
        #expect(errors(broker.request("c", 1, timeoutMs: 10_000)).isEmpty)
        #expect(errors(broker.request("c", 2, service: "nobody", timeoutMs: 10_000)).isEmpty)
        #expect(broker.state.serviceDescriptions().isEmpty)
        let registered = dispatches(broker.ready("w1"))
        #expect(registered.map(\.worker) == ["w1"], "the waiting request goes to the worker that registers")
        let graceOver = errors(broker.advance(broker.state.configuration.workerExpiry))
        #expect(graceOver.map(\.error.code) == [.noWorkers])
        #expect(graceOver[0].correlation == Wire.frame(UInt64(2)))
        #expect(errors(broker.request("c", 3, service: "nobody")).map(\.error.code) == [.noWorkers])
    }

    @Test func anUnknownOperationIsABadRequestNamingTheKnownOnes() {
        var broker = Harness()
        broker.ready("w1")
        let refused = errors(broker.request("c", 1, operation: "nope"))
        #expect(refused.map(\.error.code) == [.badRequest])
        #expect(refused[0].error.message.contains("add, get"))
    }

    @Test func anotherProtocolVersionGetsAClearError() {
        var broker = Harness()
        // A peer of the version before attachments.
        let out = broker.receive([Array("canopy/2".utf8), Wire.Command.request.frame, [1, 2]], from: "c")
        let refused = errors(out)
        #expect(refused.count == 1)
        #expect(refused[0].error.code == .badRequest)
        #expect(refused[0].error.message.contains("'canopy/2'") && refused[0].error.message.contains("canopy/4"))
        #expect(refused[0].correlation == [1, 2])
    }

    @Test func malformedRequestsAreAnsweredAndChangeNothing() {
        var broker = Harness()
        broker.ready("w1")
        let cases: [[[UInt8]]] = [
            [Wire.version, [0x7F]],
            [Wire.version, Wire.Command.request.frame, [1]],
            [Wire.version, Wire.Command.request.frame, [1], Array("plants".utf8), Array("get".utf8), [0], []],
            [Wire.version, Wire.Command.request.frame, [1], Array("Plants!".utf8), Array("get".utf8), RequestHeader(timeoutMilliseconds: 0).frame, []],
            [Wire.version, Wire.Command.request.frame, [], Array("plants".utf8), Array("get".utf8), RequestHeader(timeoutMilliseconds: 0).frame, []],
            [Wire.version, Wire.Command.dispatch.frame],
        ]
        for frames in cases {
            let out = broker.receive(frames, from: "c")
            #expect(errors(out).map(\.error.code) == [.badRequest])
            #expect(dispatches(out).isEmpty)
        }
        #expect(broker.state.pendingCount == 0)
    }

    @Test func framesOverTheLimitAreAnsweredTooLarge() {
        var broker = Harness { $0.maximumFrameBytes = 1024 }
        broker.ready("w1")
        let out = broker.request("c", 1, body: String(repeating: "x", count: 2000))
        #expect(errors(out).map(\.error.code) == [.tooLarge])
        #expect(dispatches(out).isEmpty)
    }

    @Test func workersCannotRegisterTheReservedBrokerNamespace() {
        var broker = Harness()
        let out = broker.ready("w1", service: "broker")
        #expect(sends(out).map { $0.frames[1] } == [Wire.Command.brokerDisconnect.frame])
        #expect(broker.state.workerCount == 0)
        broker.ready("w2", service: "broker.x")
        #expect(broker.state.workerCount == 0)
    }

    // MARK: - Deadlines and cancel

    @Test func anExpiredQueuedRequestIsAnsweredTimeoutAndNeverSentToAWorker() {
        var broker = Harness()
        broker.ready("w1", credit: 1)
        let first = dispatches(broker.request("c", 1, timeoutMs: 10_000))
        _ = broker.request("c", 2, timeoutMs: 100)
        let expired = errors(broker.advance(.milliseconds(150)))
        #expect(expired.map(\.error.code) == [.timeout])
        #expect(expired[0].correlation == Wire.frame(UInt64(2)))
        #expect(dispatches(broker.reply("w1", request: first[0].id)).isEmpty)
    }

    @Test func requestsExpireInTheOrderOfTheirDeadlinesWhateverOrderTheyCameIn() {
        var broker = Harness()
        broker.ready("w1", credit: 100)
        let timeouts: [UInt32] = [500, 300, 800, 100, 350, 900, 200, 700, 50, 600]
        for (index, timeout) in timeouts.enumerated() { _ = broker.request("c", UInt64(index + 1), timeoutMs: timeout) }
        var expired: [UInt64] = []
        for _ in 0..<20 {
            for error in errors(broker.advance(.milliseconds(50))) where error.error.code == .timeout {
                expired.append(error.correlation.reduce(0) { $0 << 8 | UInt64($1) })
            }
        }
        let expected = timeouts.indices.sorted { timeouts[$0] < timeouts[$1] }.map { UInt64($0 + 1) }
        #expect(expired == expected)
        #expect(broker.state.deadlineCount == 0)
    }

    @Test func answeredDeadlinesDoNotPileUpBehindASlowRequest() async {
        var broker = Harness()
        broker.ready("w1", credit: 2)
        let slow = dispatches(broker.request("c", 1, timeoutMs: 600_000))
        #expect(slow.count == 1)
        for correlation in 2...20_001 as ClosedRange<UInt64> {
            if correlation % 2_000 == 0 { await Task.yield() } // CPU-bound: leave the shared pool to live tests now and then
            let sent = dispatches(broker.request("c", correlation, timeoutMs: 30_000))
            for dispatch in sent { _ = broker.reply("w1", request: dispatch.id) }
        }
        #expect(broker.state.flightCount == 1)
        #expect(broker.state.deadlineCount <= 2 + 4_096, "\(broker.state.deadlineCount) deadlines kept for 1 request held")
        let out = broker.advance(.seconds(601))
        #expect(errors(out).map(\.error.code) == [.timeout])
    }

    @Test func anExpiredRequestAtAWorkerIsAnsweredTimeoutAndCancelledThere() {
        var broker = Harness()
        broker.ready("w1", credit: 1)
        let sent = dispatches(broker.request("c", 1, timeoutMs: 100))
        #expect(sent[0].header.timeoutMilliseconds <= 100)
        let out = broker.advance(.milliseconds(101))
        #expect(errors(out).map(\.error.code) == [.timeout])
        #expect(sends(out).contains { $0.peer == "w1" && $0.frames[1] == Wire.Command.cancelDispatch.frame })
        // The worker keeps its credit until it answers the cancel; the late answer is dropped.
        _ = broker.request("c", 2)
        #expect(replies(broker.reply("w1", request: sent[0].id)).isEmpty)
    }

    @Test func aClientCancelRemovesAQueuedRequestOrCancelsItAtTheWorker() {
        var broker = Harness()
        broker.ready("w1", credit: 1)
        let held = dispatches(broker.request("c", 1))
        _ = broker.request("c", 2)
        let cancelQueued = broker.receive([Wire.version, Wire.Command.cancel.frame, Wire.frame(UInt64(2))], from: "c")
        #expect(cancelQueued.isEmpty)
        let cancelHeld = broker.receive([Wire.version, Wire.Command.cancel.frame, Wire.frame(UInt64(1))], from: "c")
        #expect(sends(cancelHeld).map(\.peer) == ["w1"])
        #expect(dispatches(broker.reply("w1", request: held[0].id)).isEmpty, "the cancelled queued request is gone")
        #expect(broker.state.pendingCount == 0)
    }

    // MARK: - Heartbeats and lost workers

    @Test func workerExpiresAfterThreeMissedHeartbeats() {
        var broker = Harness {
            $0.heartbeatInterval = .seconds(1)
            $0.liveness = 3
        }
        broker.ready("w1")
        broker.ready("w2")
        let idempotent = dispatches(broker.request("c", 1, operation: "get", timeoutMs: 60_000))[0]
        let other = dispatches(broker.request("c", 2, operation: "add", timeoutMs: 60_000))[0]
        #expect(idempotent.worker == "w1" && other.worker == "w2")

        // w1 keeps beating; w2 falls silent.
        var directives: [BrokerState.Directive] = []
        for _ in 0..<3 {
            directives += broker.advance(.milliseconds(1_000))
            _ = broker.receive([Wire.version, Wire.Command.workerHeartbeat.frame], from: "w1")
        }
        #expect(sends(directives).filter { $0.frames[1] == Wire.Command.brokerHeartbeat.frame }.count == 6, "heartbeats go to busy workers too")
        #expect(broker.state.workerCount == 2, "three intervals of silence are not yet more than three")
        let expiry = broker.advance(.milliseconds(1_000)) // checked on the next heartbeat tick
        #expect(broker.state.workerCount == 1)
        #expect(errors(expiry).map(\.error.code) == [.workerLost])
        #expect(errors(expiry)[0].correlation == Wire.frame(UInt64(2)))
    }

    @Test func aLostWorkersIdempotentRequestGoesOnceMoreToAnotherWorker() {
        var broker = Harness()
        broker.ready("w1")
        broker.ready("w2")
        let first = dispatches(broker.request("c", 1, operation: "get"))[0]
        #expect(first.worker == "w1")
        let out = broker.receive([Wire.version, Wire.Command.workerDisconnect.frame], from: "w1")
        let again = dispatches(out)
        #expect(again.map(\.worker) == ["w2"])
        #expect(again[0].id == first.id)
        #expect(errors(out).isEmpty)
        // Lost a second time: answered workerLost, not sent a third time.
        broker.ready("w3")
        let second = broker.receive([Wire.version, Wire.Command.workerDisconnect.frame], from: "w2")
        #expect(dispatches(second).isEmpty)
        #expect(errors(second).map(\.error.code) == [.workerLost])
    }

    @Test func aServiceDisappearsWithItsLastWorkerAndItsQueueIsAnswered() {
        var broker = Harness()
        broker.ready("w1", credit: 1)
        _ = broker.request("c", 1, operation: "add")
        _ = broker.request("c", 2, operation: "add")
        let out = broker.receive([Wire.version, Wire.Command.workerDisconnect.frame], from: "w1")
        #expect(Set(errors(out).map(\.error.code)) == [.workerLost, .noWorkers])
        #expect(broker.state.serviceDescriptions().isEmpty)
        #expect(errors(broker.request("c", 3)).map(\.error.code) == [.noWorkers])
    }

    @Test func anUnknownWorkerIsToldToRegisterAgain() {
        var broker = Harness()
        let out = broker.receive([Wire.version, Wire.Command.workerHeartbeat.frame], from: "ghost")
        #expect(sends(out).map { $0.frames[1] } == [Wire.Command.brokerDisconnect.frame])
    }

    @Test func aDrainingWorkerGetsNoNewRequestsButItsRepliesStillCount() {
        var broker = Harness()
        broker.ready("w1")
        broker.ready("w2")
        let held = dispatches(broker.request("c", 1))[0]
        _ = broker.receive([Wire.version, Wire.Command.drain.frame], from: "w1")
        #expect((2...4).allSatisfy { dispatches(broker.request("c", UInt64($0)))[0].worker == "w2" })
        #expect(replies(broker.reply("w1", request: held.id)).count == 1)
    }

    // MARK: - Management

    @Test func brokerServicesAndStatsDescribeWhatIsConnected() throws {
        var broker = Harness()
        broker.ready("w1")
        let sent = dispatches(broker.request("c", 1))
        broker.now += .milliseconds(3)
        _ = broker.reply("w1", request: sent[0].id)
        _ = broker.request("c", 2, operation: "nope")

        let servicesReply = replies(broker.request("c", 3, service: "broker", operation: "services"))
        let services = try codec.decode([ServiceDescription].self, from: Array(servicesReply[0].body.utf8))
        #expect(
            services == [
                ServiceDescription(
                    name: "plants", workers: 1,
                    operations: [
                        OperationDescriptor(name: "add", idempotent: false, coalescable: false),
                        OperationDescriptor(name: "get", idempotent: true, coalescable: false),
                    ])
            ])

        let statsReply = replies(broker.request("c", 4, service: "broker", operation: "stats"))
        let stats = try codec.decode(BrokerStatistics.self, from: Array(statsReply[0].body.utf8))
        let plants = try #require(stats.services.first)
        #expect(plants.served == 1)
        #expect(plants.errors == 1)
        #expect(plants.p50Micros >= 2_900 && plants.p50Micros <= 3_100)
        #expect(stats.rejected == 1)
        #expect(errors(broker.request("c", 5, service: "broker", operation: "shutdown")).map(\.error.code) == [.badRequest])
    }

    @Test func aShuttingDownBrokerRefusesNewRequestsButAnswersHeldOnes() {
        var broker = Harness()
        broker.ready("w1")
        let held = dispatches(broker.request("c", 1))[0]
        broker.state.beginShutdown()
        #expect(errors(broker.request("c", 2)).map(\.error.code) == [.shuttingDown], "not run: a client of several brokers sends it to another")
        #expect(replies(broker.reply("w1", request: held.id)).count == 1)
        #expect(broker.state.pendingCount == 0)
    }
}

/// Batches of replies from a worker (canopy/4): each reply handled as its own.
struct BrokerBatchTests {
    @Test func aBatchOfRepliesAnswersEachCallerAndGivesEachCreditBack() throws {
        var broker = BrokerHarness()
        broker.ready("w1", credit: 2)
        let ids = [broker.request("c1", 1), broker.request("c2", 2), broker.request("c1", 3)].flatMap { dispatches($0).map(\.id) }
        #expect(ids.count == 2, "credit 2: the third waits")
        let out = broker.receive(
            WireMessage.workerReplyBatch(ids.map { .init(requestID: $0, failed: false, body: Array("{\"id\":\($0)}".utf8)) }).encoded, from: "w1")
        #expect(Set(replies(out).map(\.client)) == ["c1", "c2"] && replies(out).count == 2)
        #expect(dispatches(out).count == 1, "the queued one goes out with the credit given back")
    }

    @Test func aBatchFromAnUnknownWorkerIsToldToRegisterOnceAndAnswersNobody() {
        var broker = BrokerHarness()
        let replies = (1...5).map { WireMessage.BatchedReply(requestID: UInt64($0), failed: false, body: []) }
        let out = broker.receive(WireMessage.workerReplyBatch(replies).encoded, from: "stranger")
        #expect(messages(out).count == 1)
        #expect(messages(out).first?.message == .brokerDisconnect(reason: "unknown worker; send READY again"))
    }

    @Test func aWorkerOfTheVersionBeforeBatchesNeverRegisters() {
        var broker = BrokerHarness()
        var ready = WireMessage.ready(service: "plants", operations: BrokerHarness.defaultOperations, credit: 4).encoded
        ready[0] = Array("canopy/3".utf8)
        let out = broker.receive(ready, from: "old")
        #expect(broker.state.workerCount == 0)
        #expect(errors(out).first?.error.message.contains("'canopy/3'") == true)
        #expect(errors(broker.request("c1", 1)).first?.error.code == .noWorkers)
    }

    @Test func aBatchOfRequestsSentToABrokerIsRefused() {
        var broker = BrokerHarness()
        let batch = WireMessage.dispatchBatch([.init(requestID: 1, operation: "get", header: RequestHeader(timeoutMilliseconds: 1), body: [])])
        let out = broker.receive(batch.encoded, from: "c1")
        #expect(errors(out).first?.error.code == .badRequest)
    }
}
