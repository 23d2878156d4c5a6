import CanopyMessages
import CanopyWire
import Testing

@testable import CanopyBroker

/// The parts ``BrokerState`` routes over, each on its own: the flight table, the worker
/// table, the snapshot hold, the Majordomo bridge and the management operations.
struct BrokerPartsTests {
    typealias State = BrokerState
    let now = ContinuousClock.now
    let codec = MessageCodec()

    func descriptor(_ name: String, coalescable: Bool = false) -> OperationDescriptor {
        OperationDescriptor(name: name, idempotent: true, coalescable: coalescable)
    }

    func flight(service: State.ServiceEntry, body: String = "{}", key: State.FlightKey? = nil) -> State.Flight {
        State.Flight(
            service: service, operation: "get", header: RequestHeader(timeoutMilliseconds: 1_000),
            payload: State.Payload(body: Array(body.utf8)), key: key, createdAt: now, counters: State.OperationCounters(service: service.name, operation: "get")
        )
    }

    func waiter(on flight: SlabHandle, service: String, client: String, correlation: UInt8, after timeout: Duration) -> State.Waiter {
        let (client, correlation) = (Array(client.utf8), [correlation])
        return State.Waiter(
            client: client, correlation: correlation, clientHash: ClientTable.hash(client: client, correlation: correlation),
            dialect: .canopy, serviceName: service, receivedAt: now, deadline: now + timeout, flight: flight)
    }

    // MARK: - Flight table

    @Test func theFlightTableFindsWaitersByClientAndDeadlineAndCountsEveryByte() throws {
        let table = State.FlightTable(startedAt: now)
        let service = State.ServiceEntry(name: "care")
        let key = State.FlightKey(service: "care", operation: "get", principal: "alice", payload: State.Payload(body: Array("{}".utf8)))
        let sharedAdded = table.add(flight(service: service, key: key))
        let shared = try #require(sharedAdded)
        let early = waiter(on: shared, service: "care", client: "phone", correlation: 1, after: .seconds(1))
        let late = waiter(on: shared, service: "care", client: "tablet", correlation: 1, after: .seconds(5))
        let earlyIDAdded = table.add(early, to: shared, timeout: 1_000)
        let earlyID = try #require(earlyIDAdded)
        let lateIDAdded = table.add(late, to: shared, timeout: 5_000)
        let lateID = try #require(lateIDAdded)

        #expect(table.heldBytes == table[shared].bytes + early.bytes + late.bytes)
        #expect(table.open(key) == shared, "identical requests join it")
        #expect(table.waiter(client: Array("tablet".utf8), correlation: [1], hash: late.clientHash) == lateID)
        #expect(table.waiter(client: Array("tablet".utf8), correlation: [2], hash: ClientTable.hash(client: Array("tablet".utf8), correlation: [2])) == nil)
        #expect(table.nextDeadline() == early.deadline)
        #expect(table.nextExpired(now: now + .milliseconds(999)) == nil)
        #expect(table.nextExpired(now: now + .seconds(2)) == earlyID, "due, and still held for the router to answer")

        table.forget(earlyID)
        table[shared].waiters.remove(earlyID)
        #expect(!table.containsWaiter(earlyID), "its handle is stale from now on")
        #expect(table.nextDeadline() == late.deadline)
        table.stopJoining(shared)
        #expect(table.open(key) == nil && table[shared].key == nil, "a stuck flight takes no new waiters")
        table.forget(lateID)
        #expect(table[shared].totalWaiters == 2)
        let counters = table[shared].counters
        let removed = table.remove(shared), again = table.remove(shared)
        #expect(removed && !again, "removed once")
        #expect(table.heldBytes == 0 && table.count == 0 && table.waiterCount == 0)
        #expect(counters.mostWaiters == 2, "its waiters counted in its operation's histogram")
    }

    @Test func aQueuedFlightCountsInItsServiceUntilDispatchedAndTheQueueIsCompacted() throws {
        let table = State.FlightTable(startedAt: now)
        let service = State.ServiceEntry(name: "images")
        var flights: [SlabHandle] = []
        for index in 0..<3 {
            let idAdded = table.add(flight(service: service, body: "{\"n\":\(index)}"))
            let id = try #require(idAdded)
            table.enqueue(id)
            flights.append(id)
        }
        #expect(service.queuedCount == 3)
        #expect(service.queuedBytes == flights.reduce(0) { $0 + table[$1].bytes })
        table.unqueue(flights[1]) // dispatched: its handle stays, skipped
        #expect(service.queuedCount == 2 && service.queue.count == 3)
        #expect(table.queued(in: service) == [flights[0], flights[2]])
        _ = table.remove(flights[1])
        table.compactQueue(of: service)
        #expect(service.queue.count == 2)
    }

    @Test func aWorkersAnswerForAFlightWhoseSlotWasReusedIsStaleAndCounted() throws {
        let table = State.FlightTable(startedAt: now)
        let service = State.ServiceEntry(name: "care")
        let goneAdded = table.add(flight(service: service, body: "{\"n\":1}"))
        let gone = try #require(goneAdded)
        _ = table.remove(gone) // its last waiter left
        let nextAdded = table.add(flight(service: service, body: "{\"n\":2}"))
        let next = try #require(nextAdded)
        #expect(next.index == gone.index, "the freed slot is taken again")
        #expect(next != gone)
        #expect(table.answered(gone.raw) == nil, "the late answer names the old flight, not the one in its slot now")
        #expect(table.answered(next.raw) == next)
        #expect(table.answered(0) == nil && table.answered(12_345) == nil, "a forged id names nothing")
        #expect(table.staleAnswers == 3)
    }

    @Test func aClientsIdentityIsKeptOnceAndBoundedAndTheCallersBufferStaysItsOwn() {
        var names = State.ClientNames(maximumCount: 2)
        let read: [UInt8] = [0, 1, 2, 3, 4]
        let kept = names.intern(read, now: now)
        func address(_ bytes: [UInt8]) -> UnsafeRawPointer? { bytes.withUnsafeBytes { $0.baseAddress } }
        #expect(kept == read && address(kept) != address(read), "a copy of its own: the socket's buffer is not shared")
        #expect(address(names.intern([0, 1, 2, 3, 4], now: now)) == address(kept), "the same identity again: the one copy")
        _ = names.intern([9], now: now)
        let unkept = names.intern([7, 7], now: now + .seconds(1))
        #expect(names.count == 2 && unkept == [7, 7], "past the bound with none idle: the request keeps its own")
        _ = names.intern([0, 1, 2, 3, 4], now: now + .seconds(40))
        #expect(names.intern([7, 7], now: now + .seconds(40)) == [7, 7] && names.count == 2, "the identity idle longest made room")
    }

    // MARK: - Worker table

    @Test func theWorkerTableTakesTurnsKeepsOneProtocolAServiceAndForgetsWhatItResolved() throws {
        var table = State.WorkerTable()
        let expiry = now + .seconds(3)
        let first = try table.add(
            State.PeerKey([1]), dialect: .canopy, service: "care", operations: ["get": descriptor("get")], credit: 2, key: nil,
            expiry: expiry
        ).get()
        let second = try table.add(
            State.PeerKey([2]), dialect: .canopy, service: "care", operations: ["get": descriptor("get"), "put": descriptor("put")],
            credit: 2, key: nil, expiry: expiry
        ).get()
        let service = try #require(table.service("care"))
        #expect(service.freeWorker(for: "get") === first)
        #expect(service.freeWorker(for: "get") === second, "round robin")
        #expect(service.freeWorker(for: "put") === second, "only the worker that declared it")

        let resolvedGet = table.resolve("get", of: service)
        let get = try #require(resolvedGet)
        let put = table.resolve("put", of: service), delete = table.resolve("delete", of: service)
        #expect(get.servedByAll)
        #expect(put?.servedByAll == false)
        #expect(delete == nil)

        guard
            case .failure(let refusal) = table.add(
                State.PeerKey([3]), dialect: .majordomo, service: "care", operations: [:], credit: 1, key: nil,
                expiry: expiry)
        else {
            Issue.record("a Majordomo worker joined a Canopy service")
            return
        }
        #expect(refusal.reason.contains("one service speaks one protocol"))

        #expect(table.remove(State.PeerKey([1])) === first)
        #expect(!get.servedByAll, "the workers changed: what was resolved is forgotten")
        #expect(table.count == 1 && service.workers.count == 1)
        #expect(table.expired(now: expiry + .seconds(1)).map(\.identity) == [State.PeerKey([2])])
        #expect(table.descriptions().map(\.name) == ["care"])
    }

    @Test func operationCountersStayBoundedForWorkersThatTakeAnyName() {
        var table = State.WorkerTable()
        for index in 0..<1_100 { _ = table.counters(service: "legacy", operation: "op\(index)") }
        #expect(table.operationStatistics.count == 1_025, "1,024 names, then one legacy.* for the rest")
        let (first, again) = (table.counters(service: "legacy", operation: "op5"), table.counters(service: "legacy", operation: "op5"))
        #expect(first === again)
    }

    @Test func theStartUpGraceMakesABoundedNumberOfAwaitedServices() {
        var table = State.WorkerTable()
        let made = ["a", "b", "c"].map { table.awaitedService($0, limit: 2) != nil }
        #expect(made == [true, true, false])
        table.drop(table.service("a")!)
        let afterOneWent = table.awaitedService("c", limit: 2)
        #expect(table.service("a") == nil && afterOneWent != nil)
    }

    // MARK: - Hold

    func intake(_ body: String = "{}", client: String = "phone", correlation: UInt8 = 1) -> State.Intake {
        State.Intake(
            client: Array(client.utf8), correlation: [correlation], dialect: .canopy, serviceName: "care", operation: "get",
            header: RequestHeader(timeoutMilliseconds: 1_000), payload: State.Payload(body: Array(body.utf8)))
    }

    @Test func aHoldCutsOnceItsFlightsAreAnsweredAndEndsAtItsLimit() {
        var hold = State.Hold(inTheAir: [7, 8], limit: .seconds(2), client: [9], correlation: [1], forCapture: false, now: now)
        guard case .nothing = hold.check(now: now) else {
            Issue.record("cut before the flights in the air were answered")
            return
        }
        hold.flightClosed(7)
        hold.flightClosed(8)
        guard case .cut(let client, _) = hold.check(now: now + .seconds(1)) else {
            Issue.record("no cut once drained")
            return
        }
        #expect(client == [9])
        #expect(hold.nextWakeup == now + .seconds(3), "the caller has the limit again after the cut")
        guard case .nothing = hold.check(now: now + .milliseconds(2_999)) else {
            Issue.record("ended early")
            return
        }
        guard case .expired = hold.check(now: now + .seconds(3)) else {
            Issue.record("did not end at its limit")
            return
        }
    }

    @Test func aHoldFailsWhenTheRequestsInTheAirOutlastItAndHoldsWithinItsBudget() {
        var hold = State.Hold(inTheAir: [7], limit: .seconds(2), client: [9], correlation: [1], forCapture: true, now: now)
        guard case .failed(let error) = hold.check(now: now + .seconds(2)) else {
            Issue.record("no failure past the drain deadline")
            return
        }
        #expect(error.code == .timeout)

        let small = intake(), cost = small.payload.byteCount + State.waiterBytes(small)
        let taken = [small, intake(correlation: 2), intake(correlation: 3)].map { hold.take($0, bytes: cost, budget: 2 * cost, now: now) }
        #expect(taken == [true, true, false], "the third is over the budget")
        let cancelled = [hold.cancel(client: Array("phone".utf8), correlation: [1]), hold.cancel(client: Array("phone".utf8), correlation: [1])]
        #expect(cancelled == [true, false])
        #expect(hold.held.count == 1 && hold.heldBytes == cost)
    }

    @Test func holdsAreBetweenAMillisecondAndTheMaximum() {
        let long = State.Hold(inTheAir: [], limit: .seconds(3_600), client: [], correlation: [], forCapture: false, now: now)
        #expect(long.limit == State.maximumHold)
        let short = State.Hold(inTheAir: [], limit: .zero, client: [], correlation: [], forCapture: false, now: now)
        #expect(short.limit == .milliseconds(1))
    }

    // MARK: - Majordomo bridge

    @Test func majordomoClientsAreReadAsCanopyRequestsOrAnsweredAtOnce() {
        func read(_ service: String, _ body: [String], dialect: State.Dialect? = .canopy) -> State.MajordomoBridge.ClientRequest {
            State.MajordomoBridge.clientRequest(
                service: Array(service.utf8), body: body.map { Array($0.utf8) }, from: [1], dialect: { _ in dialect },
                hasWorkers: { $0 == "care" }, codec: codec)
        }
        guard case .intake(let toCanopy) = read("care", ["plants.get", "{}", "photo"]) else {
            Issue.record("not admitted")
            return
        }
        #expect(toCanopy.operation == "plants.get" && toCanopy.payload.frames == [Array("{}".utf8), Array("photo".utf8)])
        guard case .intake(let toMajordomo) = read("echo", ["a", "b"], dialect: .majordomo) else {
            Issue.record("not admitted")
            return
        }
        #expect(toMajordomo.operation == "" && toMajordomo.payload.frames.count == 2, "Majordomo to Majordomo passes untouched")
        guard case .answer(let bad, refused: true) = read("care", ["plants.get"]) else {
            Issue.record("a body without JSON admitted")
            return
        }
        #expect(bad.first == Majordomo.error)
        guard case .answer(let found, refused: false) = read("mmi.service", ["care"]),
            case .answer(let missing, refused: false) = read("mmi.service", ["remind"]),
            case .answer(let unknown, refused: false) = read("mmi.other", [])
        else {
            Issue.record("mmi not answered")
            return
        }
        #expect([found, missing, unknown].map { String(decoding: $0[0], as: UTF8.self) } == ["200", "404", "501"])
    }

    @Test func answersToMajordomoClientsCarryAStatusFrameUnlessAMajordomoWorkerGaveThem() {
        let payload = State.Payload(body: Array("{}".utf8))
        #expect(State.MajordomoBridge.answerBody(.reply(payload, fromMajordomo: false), codec: codec) == [Majordomo.ok, Array("{}".utf8)])
        #expect(State.MajordomoBridge.answerBody(.reply(payload, fromMajordomo: true), codec: codec) == [Array("{}".utf8)])
        #expect(State.MajordomoBridge.answerBody(.failure(CanopyError(.busy, "x")), codec: codec).first == Majordomo.error)
        #expect(State.MajordomoBridge.workerDescriptor(coalesced: false).coalescable == false)
    }

    // MARK: - Management

    @Test func managementCallsAreReadOnlyFromOperatorsAndWithinTheirLimits() throws {
        func read(_ operation: String, _ body: String = "{}", principal: String = "") -> Result<State.Management.Call, CanopyError> {
            State.Management.read(operation, body: Array(body.utf8), header: RequestHeader(timeoutMilliseconds: 1_000, principal: principal), codec: codec)
        }
        #expect(try read("stats").get() == .stats)
        #expect(try read("hold", #"{"holdMilliseconds":500}"#).get() == .hold(.milliseconds(500)))
        #expect(try read("capture.release", #"{"snapshot":"s1"}"#).get() == .captureRelease(snapshot: "s1"))
        func code(_ result: Result<State.Management.Call, CanopyError>) -> CanopyError.Code? {
            if case .failure(let error) = result { error.code } else { nil }
        }
        #expect(code(read("stats", principal: "alice")) == .unauthorized, "an operator's operation, not a person's")
        #expect(code(read("hold", #"{"holdMilliseconds":0}"#)) == .badRequest)
        #expect(code(read("hold", #"{"holdMilliseconds":60001}"#)) == .badRequest)
        #expect(code(read("capture.start", "[]")) == .badRequest)
        #expect(code(read("reboot")) == .badRequest)
    }
}
