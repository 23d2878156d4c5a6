import CanopyBroker
import CanopyBus
import CanopyMessages
import InMemoryTracing
import Testing
import Tracing

/// The broker's spans of sampled requests, from its state machine with an in-memory tracer:
/// one span per request nobody joined, with its flight's waits and dispatches as events; a
/// flight span when another request joins, linked from it; a retry after a worker loss; the
/// caller's context passed to the worker untouched; nothing for requests without a trace.
struct BrokerTracingTests {
    static let caller = TraceContext(traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")!
    static let otherCaller = TraceContext(traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")!
    static let coalescable = [OperationDescriptor(name: "get", idempotent: true, coalescable: true)]

    /// A broker noting into a ``BrokerTracing`` of an in-memory tracer.
    func tracedBroker() -> (BrokerHarness, BrokerTracing, InMemoryTracer) {
        let tracer = InMemoryTracer()
        let tracing = BrokerTracing(tracer: tracer)
        var broker = BrokerHarness()
        broker.state.traceRequests(into: tracing)
        return (broker, tracing, tracer)
    }

    func span(_ tracer: InMemoryTracer, _ name: String) throws -> FinishedInMemorySpan {
        try #require(tracer.finishedSpans.first { $0.operationName == name }, "no span '\(name)' in \(tracer.finishedSpans.map(\.operationName))")
    }

    func events(_ span: FinishedInMemorySpan) -> [String] { span.events.map(\.name) }

    @Test func theCallersContextGoesToTheWorkerUntouchedWithOrWithoutATracer() {
        var plain = BrokerHarness()
        plain.ready("w1")
        #expect(dispatches(plain.request("c", 1, trace: Self.caller)).first?.header.trace == Self.caller)
        var (traced, _, _) = tracedBroker()
        traced.ready("w1")
        #expect(dispatches(traced.request("c", 1, trace: Self.caller)).first?.header.trace == Self.caller)
    }

    @Test func aRequestNobodyJoinedIsOneSpanSayingItWasQueuedThenDispatched() throws {
        var (broker, tracing, tracer) = tracedBroker()
        broker.ready("w1", credit: 1)
        let busy = dispatches(broker.request("other", 1)) // the worker's one credit taken
        _ = broker.request("c", 1, trace: Self.caller) // so this one waits
        let dispatched = dispatches(broker.reply("w1", request: busy[0].id))
        #expect(dispatched.count == 1)
        _ = broker.reply("w1", request: dispatched[0].id)
        #expect(tracer.finishedSpans.isEmpty, "spans are made when noted work is flushed, off the loop")
        tracing.flush()

        let waiter = try span(tracer, "broker plants/get")
        #expect(tracer.finishedSpans.count == 1, "one span for a request nobody joined: \(tracer.finishedSpans.map(\.operationName))")
        #expect(waiter.kind == .server)
        #expect(events(waiter) == ["queued", "dispatched"])
        #expect(waiter.events.last?.attributes["canopy.attempt"]?.toSpanAttribute() == 1)
        #expect(waiter.events.last?.attributes["canopy.worker"]?.toSpanAttribute() == .string(Array("w1".utf8).lowercaseHex))
        #expect(waiter.attributes["canopy.coalesced"]?.toSpanAttribute() == false && waiter.attributes["canopy.dispatches"]?.toSpanAttribute() == 1)
        #expect(
            waiter.startInstant.nanosecondsSinceEpoch <= waiter.events[0].nanosecondsSinceEpoch
                && waiter.events[1].nanosecondsSinceEpoch <= waiter.endInstant.nanosecondsSinceEpoch, "the recorded times, in order")
        #expect(tracer.activeSpans.isEmpty, "every span ended")
    }

    @Test func aCoalescedWaiterHasItsOwnSpanLinkedToTheFlightThatServedIt() throws {
        var (broker, tracing, tracer) = tracedBroker()
        broker.ready("w1", operations: Self.coalescable)
        let dispatched = dispatches(broker.request("a", 1, trace: Self.caller))
        #expect(dispatches(broker.request("b", 1, trace: Self.otherCaller)).isEmpty, "joined the flight in the air")
        let answered = replies(broker.reply("w1", request: dispatched[0].id))
        #expect(answered.count == 2 && answered.allSatisfy(\.shared))
        tracing.flush()

        let waiters = tracer.finishedSpans.filter { $0.operationName == "broker plants/get" }
        let flight = try span(tracer, "flight plants/get")
        #expect(waiters.count == 2)
        let leader = try #require(waiters.first { $0.attributes["canopy.coalesced"]?.toSpanAttribute() == false })
        let joined = try #require(waiters.first { $0.attributes["canopy.coalesced"]?.toSpanAttribute() == true })
        #expect(flight.parentSpanID == leader.spanID)
        #expect(
            joined.links.count == 1 && joined.links.first?.context.inMemorySpanContext?.spanID == flight.spanID,
            "linked to the one flight that served it")
        #expect(leader.links.isEmpty)
        #expect(waiters.allSatisfy { $0.attributes["canopy.shared"]?.toSpanAttribute() == true })
        #expect(flight.attributes["canopy.waiters"]?.toSpanAttribute() == 2)
        #expect(events(flight) == ["dispatched"], "one worker call for both, recorded before anyone joined")
        #expect(flight.startInstant.nanosecondsSinceEpoch <= joined.startInstant.nanosecondsSinceEpoch, "the flight began when the first came")
    }

    @Test func aRequestLostWithItsWorkerIsRetriedAndSaysSo() throws {
        var (broker, tracing, tracer) = tracedBroker()
        broker.ready("w1", credit: 1)
        let first = dispatches(broker.request("c", 1, trace: Self.caller))
        broker.ready("w2", credit: 1)
        let second = dispatches(broker.receive(WireMessage.workerDisconnect.encoded, from: "w1"))
        #expect(first.count == 1 && second.first?.worker == "w2")
        _ = broker.reply("w2", request: second[0].id)
        tracing.flush()

        let waiter = try span(tracer, "broker plants/get")
        #expect(events(waiter) == ["dispatched", "retried after worker loss", "queued", "dispatched"])
        #expect(waiter.events.last?.attributes["canopy.attempt"]?.toSpanAttribute() == 2)
        #expect(waiter.attributes["canopy.dispatches"]?.toSpanAttribute() == 2)
        #expect(waiter.status == nil, "answered in the end")
    }

    @Test func aFlightEveryWaiterLeftEndsCancelled() throws {
        var (broker, tracing, tracer) = tracedBroker()
        broker.ready("w1")
        _ = broker.request("c", 1, trace: Self.caller)
        _ = broker.receive(WireMessage.cancel(correlation: Wire.frame(UInt64(1))).encoded, from: "c")
        tracing.flush()
        #expect(events(try span(tracer, "broker plants/get")) == ["cancelled by the caller"])
        #expect(events(try span(tracer, "flight plants/get")) == ["dispatched", "cancelled: every waiter left"])
        #expect(tracer.activeSpans.isEmpty)
    }

    @Test func aTimeoutEndsTheWaiterFailedAndAStoppedBrokerEndsWhatIsOpen() throws {
        var (broker, tracing, tracer) = tracedBroker()
        broker.ready("w1")
        _ = broker.request("c", 1, timeoutMs: 100, trace: Self.caller)
        _ = broker.advance(.milliseconds(200))
        _ = broker.request("c", 2, trace: Self.otherCaller) // still at the worker when the broker stops
        tracing.flush()
        let waiter = try span(tracer, "broker plants/get")
        #expect(waiter.status?.code == .error && waiter.attributes["canopy.error.code"]?.toSpanAttribute() == "timeout")
        #expect(events(waiter) == ["dispatched", "cancelled: every waiter left"])
        #expect(tracer.activeSpans.count == 1)
        tracing.flush(ending: true)
        #expect(tracer.activeSpans.isEmpty && tracer.finishedSpans.filter { events($0).contains("the broker stopped") }.count == 1)
    }

    @Test func requestsWithoutATraceCostNoSpans() {
        var (broker, tracing, tracer) = tracedBroker()
        broker.ready("w1")
        let dispatched = dispatches(broker.request("c", 1))
        _ = broker.reply("w1", request: dispatched[0].id)
        tracing.flush()
        #expect(dispatched.first?.header.trace == nil)
        #expect(tracer.finishedSpans.isEmpty && tracer.activeSpans.isEmpty)
    }
}
