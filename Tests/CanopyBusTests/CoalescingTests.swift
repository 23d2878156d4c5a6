import CanopyBroker
import CanopyBus
import CanopyMessages
import Testing

/// Coalescing at the broker, driven without sockets.
struct CoalescingTests {
    static let operations = [
        OperationDescriptor(name: "get", idempotent: true, coalescable: true),
        OperationDescriptor(name: "add", idempotent: false, coalescable: false),
        OperationDescriptor(name: "list", idempotent: true, coalescable: false),
    ]

    func harness(_ configure: (inout BrokerConfiguration) -> Void = { _ in }) -> BrokerHarness {
        var broker = BrokerHarness(configure)
        broker.ready("w1", operations: Self.operations, credit: 8)
        return broker
    }

    func statistics(_ broker: BrokerHarness, operation: String = "get") -> OperationStatistics? {
        broker.state.statistics(now: broker.now).operations.first { $0.operation == operation }
    }

    @Test func identicalRequestsShareOneWorkerCallAndEveryWaiterGetsTheReplyAtOnce() throws {
        var broker = harness()
        let first = dispatches(broker.request("c1", 1, timeoutMs: 10_000, body: #"{"id":"monstera"}"#))
        let second = dispatches(broker.request("c2", 1, timeoutMs: 10_000, body: #"{"id":"monstera"}"#))
        let third = dispatches(broker.request("c1", 2, timeoutMs: 10_000, body: #"{"id":"monstera"}"#))
        #expect(first.count == 1)
        #expect(second.isEmpty && third.isEmpty, "identical requests join the flight in the air")

        let answers = replies(broker.reply("w1", request: first[0].id, body: #"{"name":"Monstera deliciosa"}"#))
        #expect(answers.map(\.client) == ["c1", "c2", "c1"])
        #expect(answers.map(\.correlation) == [Wire.frame(UInt64(1)), Wire.frame(UInt64(1)), Wire.frame(UInt64(2))])
        #expect(answers.allSatisfy { $0.body == #"{"name":"Monstera deliciosa"}"# && $0.shared })

        let stats = try #require(statistics(broker))
        #expect(stats.requests == 3)
        #expect(stats.coalesced == 2)
        #expect(stats.workerCalls == 1)
        #expect(stats.workerCallsSaved == 2)
        #expect(stats.waitersPerFlightMax == 3)
        #expect(broker.state.pendingCount == 0 && broker.state.flightCount == 0)
    }

    @Test func aReplyToOneWaiterIsNotMarkedShared() {
        var broker = harness()
        let sent = dispatches(broker.request("c1", 1))
        #expect(replies(broker.reply("w1", request: sent[0].id)).map(\.shared) == [false])
    }

    @Test func requestsThatDifferInOneByteOrInPrincipalAreNotMerged() {
        var broker = harness()
        _ = broker.request("c1", 1, principal: "alice", body: #"{"id":"a"}"#)
        #expect(dispatches(broker.request("c2", 1, principal: "alice", body: #"{"id":"b"}"#)).count == 1, "one byte differs")
        #expect(dispatches(broker.request("c3", 1, principal: "bob", body: #"{"id":"a"}"#)).count == 1, "another person")
        #expect(dispatches(broker.request("c4", 1, operation: "list", principal: "alice", body: #"{"id":"a"}"#)).count == 1, "another operation")
        #expect(dispatches(broker.request("c5", 1, principal: "alice", body: #"{"id":"a"}"#)).isEmpty, "the same again joins")
    }

    @Test func operationsThatAreNotCoalescableAreNeverMerged() {
        var broker = harness()
        _ = broker.request("c1", 1, operation: "add")
        #expect(dispatches(broker.request("c2", 1, operation: "add")).count == 1)
        _ = broker.request("c1", 2, operation: "list")
        #expect(dispatches(broker.request("c2", 2, operation: "list")).count == 1, "idempotent alone is not enough")
    }

    @Test func coalescingCanBeTurnedOffGloballyAndPerService() {
        var off = harness { $0.coalescing = false }
        _ = off.request("c1", 1)
        #expect(dispatches(off.request("c2", 1)).count == 1)

        var perService = harness { $0.coalescingDisabledServices = ["plants"] }
        _ = perService.request("c1", 1)
        #expect(dispatches(perService.request("c2", 1)).count == 1)
    }

    @Test func onlyIdempotentOperationsCanBeDeclaredCoalescable() {
        var broker = BrokerHarness()
        broker.ready("w1", operations: [OperationDescriptor(name: "add", idempotent: false, coalescable: true)])
        _ = broker.request("c1", 1, operation: "add")
        #expect(dispatches(broker.request("c2", 1, operation: "add")).count == 1)
    }

    @Test func eachWaiterKeepsItsOwnDeadlineAndTheFlightGoesOnForTheOthers() throws {
        var broker = harness()
        let sent = dispatches(broker.request("impatient", 1, timeoutMs: 100))
        _ = broker.request("patient", 1, timeoutMs: 10_000)
        #expect(sent[0].header.timeoutMilliseconds <= 100)

        let expiry = broker.advance(.milliseconds(150))
        #expect(errors(expiry).map(\.client) == ["impatient"])
        #expect(errors(expiry).map(\.error.code) == [.timeout])
        #expect(!sends(expiry).contains { $0.frames[1] == Wire.Command.cancelDispatch.frame }, "the worker goes on for the patient one")

        #expect(replies(broker.reply("w1", request: sent[0].id)).map(\.client) == ["patient"])
        #expect(try #require(statistics(broker)).detachedWaiters == 1)
    }

    @Test func aCancelDetachesOneWaiterAndTheWorkerIsCancelledOnlyWhenTheLastLeaves() {
        var broker = harness()
        let sent = dispatches(broker.request("c1", 1))
        _ = broker.request("c2", 1)
        let firstLeaves = broker.receive([Wire.version, Wire.Command.cancel.frame, Wire.frame(UInt64(1))], from: "c1")
        #expect(firstLeaves.isEmpty)
        let lastLeaves = broker.receive([Wire.version, Wire.Command.cancel.frame, Wire.frame(UInt64(1))], from: "c2")
        #expect(sends(lastLeaves).map(\.peer) == ["w1"])
        #expect(sends(lastLeaves).first?.frames[1] == Wire.Command.cancelDispatch.frame)
        #expect(Wire.uint64(sends(lastLeaves)[0].frames[2]) == sent[0].id)
        #expect(broker.state.flightCount == 0)
        // A new identical request is a new flight.
        #expect(dispatches(broker.request("c3", 1)).count == 1)
    }

    @Test func anErrorFansOutToEveryWaiterAndIsNotCached() {
        var broker = harness()
        let sent = dispatches(broker.request("c1", 1))
        _ = broker.request("c2", 1)
        let error = #"{"code":"notFound","message":"no such plant"}"#
        let failed = errors(broker.reply("w1", request: sent[0].id, body: error, status: Wire.Status.error))
        #expect(failed.map(\.client) == ["c1", "c2"])
        #expect(failed.allSatisfy { $0.error == CanopyError(.notFound, "no such plant") })
        #expect(dispatches(broker.request("c3", 1)).count == 1, "the next identical request goes to a worker")
    }

    @Test func aLostWorkersFlightGoesToAnotherWorkerWithItsWaitersAttached() throws {
        var broker = harness()
        let sent = dispatches(broker.request("c1", 1, timeoutMs: 10_000))
        _ = broker.request("c2", 1, timeoutMs: 10_000)
        broker.ready("w2", operations: Self.operations)
        let lost = broker.receive([Wire.version, Wire.Command.workerDisconnect.frame], from: "w1")
        let again = dispatches(lost)
        #expect(again.map(\.worker) == ["w2"])
        #expect(again[0].id == sent[0].id)
        #expect(errors(lost).isEmpty)
        #expect(replies(broker.reply("w2", request: again[0].id)).map(\.client) == ["c1", "c2"])
        #expect(try #require(statistics(broker)).redispatchedFlights == 1)
    }

    @Test func aFlightOlderThanTheStuckAgeTakesNoNewWaiters() {
        var broker = harness { $0.stuckFlightAge = .seconds(2) }
        let old = dispatches(broker.request("c1", 1, timeoutMs: 60_000))
        broker.now += .seconds(1)
        #expect(dispatches(broker.request("c2", 1, timeoutMs: 60_000)).isEmpty, "younger than the stuck age: joins")
        broker.now += .seconds(1)
        let fresh = dispatches(broker.request("c3", 1, timeoutMs: 60_000))
        #expect(fresh.count == 1, "the stuck flight takes no one new; a fresh flight starts")
        #expect(dispatches(broker.request("c4", 1, timeoutMs: 60_000)).isEmpty, "and the fresh one takes the next")
        #expect(replies(broker.reply("w1", request: old[0].id)).map(\.client) == ["c1", "c2"])
        #expect(replies(broker.reply("w1", request: fresh[0].id)).map(\.client) == ["c3", "c4"])
    }

    @Test func waitersPerFlightAndOpenFlightsAreBounded() {
        var waiters = harness { $0.maximumWaitersPerFlight = 2 }
        _ = waiters.request("c1", 1)
        _ = waiters.request("c2", 1)
        #expect(errors(waiters.request("c3", 1)).map(\.error.code) == [.busy])

        var flights = harness { $0.maximumOpenFlights = 1 }
        _ = flights.request("c1", 1, body: "1")
        #expect(errors(flights.request("c2", 1, body: "2")).map(\.error.code) == [.busy])
        #expect(errors(flights.request("c3", 1, body: "1")).isEmpty, "joining an open flight is still fine")
        #expect(dispatches(flights.request("c4", 1, operation: "add")).count == 1, "operations that are not coalescable are not counted")
    }
}
