import CanopyBroker
import CanopyBus
import CanopyMessages
import InMemoryTracing
import Testing
import Tracing

/// The broker's spans of sampled requests, from its state machine with an in-memory tracer:
/// one span per waiter, the flight under the waiter that started it with its waits and
/// dispatches, coalesced waiters linked to the flight that served them, a retry after a
/// worker loss, and nothing for requests that carry no trace.
struct BrokerTracingTests {
    static let caller = TraceContext(traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")!
    static let otherCaller = TraceContext(traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")!
    static let coalescable = [OperationDescriptor(name: "get", idempotent: true, coalescable: true)]

    func tracedBroker() -> (BrokerHarness, InMemoryTracer) {
        let tracer = InMemoryTracer()
        var broker = BrokerHarness()
        broker.state.traceRequests(with: tracer)
        return (broker, tracer)
    }

    func span(_ tracer: InMemoryTracer, _ name: String) throws -> FinishedInMemorySpan {
        try #require(tracer.finishedSpans.first { $0.operationName == name }, "no span '\(name)' in \(tracer.finishedSpans.map(\.operationName))")
    }

    @Test func withoutATracerTheCallersContextGoesToTheWorkerUntouched() {
        var broker = BrokerHarness()
        broker.ready("w1")
        let dispatched = dispatches(broker.request("c", 1, trace: Self.caller))
        #expect(dispatched.first?.header.trace == Self.caller)
    }

    @Test func aRequestIsAWaiterSpanAndItsFlightQueuedThenDispatched() throws {
        var (broker, tracer) = tracedBroker()
        broker.ready("w1", credit: 1)
        let busy = dispatches(broker.request("other", 1)) // the worker's one credit taken
        _ = broker.request("c", 1, trace: Self.caller) // so this one waits
        broker.now += .milliseconds(5)
        let dispatched = dispatches(broker.reply("w1", request: busy[0].id))
        #expect(dispatched.count == 1)
        // The worker continues the caller's trace (the in-memory tracer propagates no
        // traceparent, so the caller's context goes on as it came).
        #expect(dispatched.first?.header.trace == Self.caller)
        _ = broker.reply("w1", request: dispatched[0].id)

        let waiter = try span(tracer, "broker plants/get")
        let flight = try span(tracer, "flight plants/get")
        let queued = try span(tracer, "queued")
        let dispatch = try span(tracer, "dispatch plants/get")
        #expect(waiter.kind == .server && dispatch.kind == .client)
        #expect(flight.parentSpanID == waiter.spanID, "the flight is under the waiter that started it")
        #expect(queued.parentSpanID == flight.spanID && dispatch.parentSpanID == flight.spanID)
        #expect(waiter.attributes["canopy.coalesced"]?.toSpanAttribute() == false)
        #expect(dispatch.attributes["canopy.attempt"]?.toSpanAttribute() == 1)
        #expect(flight.attributes["canopy.waiters"]?.toSpanAttribute() == 1)
        #expect(tracer.activeSpans.isEmpty, "every span ended")
    }

    @Test func aCoalescedWaiterHasItsOwnSpanLinkedToTheFlightThatServedIt() throws {
        var (broker, tracer) = tracedBroker()
        broker.ready("w1", operations: Self.coalescable)
        let dispatched = dispatches(broker.request("a", 1, trace: Self.caller))
        #expect(dispatches(broker.request("b", 1, trace: Self.otherCaller)).isEmpty, "joined the flight in the air")
        let answered = replies(broker.reply("w1", request: dispatched[0].id))
        #expect(answered.count == 2 && answered.allSatisfy(\.shared))

        let waiters = tracer.finishedSpans.filter { $0.operationName == "broker plants/get" }
        let flight = try span(tracer, "flight plants/get")
        #expect(waiters.count == 2)
        let leader = try #require(waiters.first { $0.attributes["canopy.coalesced"]?.toSpanAttribute() == false })
        let joined = try #require(waiters.first { $0.attributes["canopy.coalesced"]?.toSpanAttribute() == true })
        #expect(flight.parentSpanID == leader.spanID)
        #expect(joined.links.count == 1 && joined.links.first?.context.inMemorySpanContext?.spanID == flight.spanID,
                "linked to the one flight that served it")
        #expect(leader.links.isEmpty)
        #expect(waiters.allSatisfy { $0.attributes["canopy.shared"]?.toSpanAttribute() == true })
        #expect(flight.attributes["canopy.waiters"]?.toSpanAttribute() == 2)
        #expect(tracer.finishedSpans.count(where: { $0.operationName == "dispatch plants/get" }) == 1, "one worker call for both")
    }

    @Test func aDispatchLostWithItsWorkerEndsFailedAndTheFlightIsRetried() throws {
        var (broker, tracer) = tracedBroker()
        broker.ready("w1", credit: 1)
        let first = dispatches(broker.request("c", 1, trace: Self.caller))
        broker.ready("w2", credit: 1)
        let second = dispatches(broker.receive(WireMessage.workerDisconnect.encoded, from: "w1"))
        #expect(first.count == 1 && second.first?.worker == "w2")
        _ = broker.reply("w2", request: second[0].id)

        let flight = try span(tracer, "flight plants/get")
        let calls = tracer.finishedSpans.filter { $0.operationName == "dispatch plants/get" }
        #expect(calls.count == 2)
        #expect(calls.contains { $0.status?.code == .error && $0.attributes["canopy.attempt"]?.toSpanAttribute() == 1 }, "the lost call failed")
        #expect(calls.contains { $0.status == nil && $0.attributes["canopy.attempt"]?.toSpanAttribute() == 2 })
        #expect(flight.events.map(\.name) == ["retried after worker loss"])
        #expect(flight.status == nil, "answered in the end")
    }

    @Test func aFlightEveryWaiterLeftEndsCancelled() throws {
        var (broker, tracer) = tracedBroker()
        broker.ready("w1")
        _ = broker.request("c", 1, trace: Self.caller)
        _ = broker.receive(WireMessage.cancel(correlation: Wire.frame(UInt64(1))).encoded, from: "c")
        #expect(try span(tracer, "broker plants/get").events.map(\.name) == ["cancelled by the caller"])
        #expect(try span(tracer, "flight plants/get").events.map(\.name) == ["cancelled: every waiter left"])
        #expect(tracer.activeSpans.isEmpty)
    }

    @Test func aTimeoutEndsTheWaiterFailed() throws {
        var (broker, tracer) = tracedBroker()
        broker.ready("w1")
        _ = broker.request("c", 1, timeoutMs: 100, trace: Self.caller)
        _ = broker.advance(.milliseconds(200))
        let waiter = try span(tracer, "broker plants/get")
        #expect(waiter.status?.code == .error && waiter.attributes["canopy.error.code"]?.toSpanAttribute() == "timeout")
    }

    @Test func requestsWithoutATraceCostNoSpans() {
        var (broker, tracer) = tracedBroker()
        broker.ready("w1")
        let dispatched = dispatches(broker.request("c", 1))
        _ = broker.reply("w1", request: dispatched[0].id)
        #expect(dispatched.first?.header.trace == nil)
        #expect(tracer.finishedSpans.isEmpty && tracer.activeSpans.isEmpty)
    }
}
