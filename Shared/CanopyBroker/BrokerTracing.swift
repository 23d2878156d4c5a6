import CanopyMessages
import CanopyWire
import Tracing

/// The broker's part of a sampled request's trace. The state machine calls it only for
/// requests whose header carries a sampled trace context, and only when the broker has a
/// tracer (``BrokerConfiguration/tracer``, or the process's when ``Traces`` installed one):
/// otherwise the header's context passes through to the worker untouched and nothing here
/// runs.
///
/// Per waiter (each client's request) a span `broker service/operation` under the caller's
/// span, ended when that caller is answered. Per flight (what goes to a worker) a span
/// `flight service/operation` under the waiter that started it, with a `queued` span for each
/// wait for credit and a `dispatch service/operation` span for each time it went to a worker
/// (the context the worker's handler continues). A waiter that joined a flight in the air is
/// marked coalesced and **linked** to that flight's span: one flight, many waiters, each in
/// its own trace. A dispatch lost with its worker ends failed and the flight records
/// `retried after worker loss` before it queues again.
final class BrokerTracing {
    let tracer: any Tracer

    init(tracer: any Tracer) {
        self.tracer = tracer
    }

    /// What a traced flight holds while it lives.
    final class FlightSpans {
        let flight: any Span
        var queued: (any Span)?
        var dispatch: (any Span)?

        init(flight: any Span) {
            self.flight = flight
        }
    }

    /// The span of one caller's request.
    func waiterSpan(service: String, operation: String, caller: TraceContext, coalesced: Bool, flight: FlightSpans?) -> any Span {
        let span = tracer.startAnySpan("broker " + BusTracing.spanName(service: service, operation: operation),
                                       context: BusTracing.context(continuing: caller, tracer: tracer), ofKind: .server)
        BusTracing.describe(span, service: service, operation: operation)
        span.attributes["canopy.coalesced"] = coalesced
        if coalesced, let flight { span.addLink(SpanLink(context: flight.flight.context, attributes: ["canopy.link": "served by this flight"])) }
        return span
    }

    /// The spans of a new flight, under the waiter that started it.
    func flightSpans(service: String, operation: String, under waiter: any Span, queued: Bool) -> FlightSpans {
        let spans = FlightSpans(flight: tracer.startAnySpan("flight " + BusTracing.spanName(service: service, operation: operation),
                                                            context: waiter.context, ofKind: .internal))
        BusTracing.describe(spans.flight, service: service, operation: operation)
        if queued { self.queued(spans) }
        return spans
    }

    /// The flight waits for a worker with credit.
    func queued(_ spans: FlightSpans) {
        spans.queued = tracer.startAnySpan("queued", context: spans.flight.context, ofKind: .internal)
    }

    /// The flight goes to a worker: returns the trace context its dispatch carries (the
    /// dispatch span's), or nil when the tracer propagates none.
    func dispatched(_ spans: FlightSpans, service: String, operation: String, worker: String, attempt: Int) -> TraceContext? {
        spans.queued?.end()
        spans.queued = nil
        let dispatch = tracer.startAnySpan("dispatch " + BusTracing.spanName(service: service, operation: operation),
                                           context: spans.flight.context, ofKind: .client)
        BusTracing.describe(dispatch, service: service, operation: operation)
        dispatch.attributes["canopy.worker"] = worker
        dispatch.attributes["canopy.attempt"] = attempt
        spans.dispatch = dispatch
        return BusTracing.trace(of: dispatch.context, tracer: tracer)
    }

    /// The flight's worker died holding it; it goes once more to another worker.
    func retried(_ spans: FlightSpans) {
        if let dispatch = spans.dispatch {
            BusTracing.fail(dispatch, CanopyError(.workerLost, "the worker went away holding this request"))
            dispatch.end()
        }
        spans.dispatch = nil
        spans.flight.addEvent("retried after worker loss")
        queued(spans)
    }

    /// The flight ended: answered (the error, when it failed), or closed when its last waiter
    /// left (`cancelled`).
    func finished(_ spans: FlightSpans, waiters: Int, error: CanopyError?, cancelled: Bool = false) {
        spans.flight.attributes["canopy.waiters"] = waiters
        if cancelled { spans.flight.addEvent("cancelled: every waiter left") }
        for span in [spans.queued, spans.dispatch].compactMap({ $0 }) + [spans.flight] {
            if let error { BusTracing.fail(span, error) }
            span.end()
        }
        spans.queued = nil
        spans.dispatch = nil
    }

    /// A caller was answered, shared when its reply served several.
    func answered(_ span: any Span, error: CanopyError?, shared: Bool) {
        span.attributes["canopy.shared"] = shared
        if let error { BusTracing.fail(span, error) }
        span.end()
    }
}
