import CanopyMessages
import CanopyWire
import Synchronization
import Tracing

/// The broker's part of sampled requests' traces, recorded off its hot path.
///
/// The broker's loop thread only notes what happened (a request joined, a flight was queued,
/// dispatched, retried, answered), with the time, in a bounded buffer: a few hundred
/// nanoseconds a note, no allocation of spans, no wake-up of anything. ``flush()``, called by
/// a task of its own every 100 ms (``BrokerServer``), turns the notes into spans through the
/// tracer with the recorded times. The broker calls nothing here for a request whose header
/// carries no sampled trace context, and nothing at all without a tracer
/// (``BrokerConfiguration/tracer``, or the process's when `Traces` installed one).
///
/// The broker passes a request's trace context on to the worker untouched, as message
/// brokers do: a handler's span is a child of its caller's span, and the broker's spans sit
/// beside it, under the same caller. Per waiter (each client's request) a span
/// `broker service/operation`, ended when that caller is answered, with what happened to its
/// flight as events: `queued` for credit, `dispatched` (to which worker, which attempt),
/// `retried after worker loss`. A flight another request joined has a span of its own,
/// `flight service/operation`, under the waiter that started it, with those events; the
/// waiter that joined is marked coalesced and **linked** to it: one flight, many waiters, each
/// in its own trace.
///
/// (swift-otel spends some 15 µs of CPU on each span started and ended — it wakes its span
/// processor for both — six times what routing a request costs the loop. Spans made on the
/// loop thread cost 1% sampling 7–11% of the broker's throughput in `canopy-bench tracing`;
/// hence the notes, and one span per request that nobody joined.)
public final class BrokerTracing: Sendable {
    let tracer: any Tracer

    /// What the loop thread noted, in order.
    enum Note: Sendable {
        /// `flight`: the flight it joined, when it coalesced into a traced one.
        case waiter(UInt64, caller: TraceContext, service: String, operation: String, coalesced: Bool, flight: UInt64?, at: UInt64)
        case flight(UInt64, waiter: UInt64, service: String, operation: String, queued: Bool, at: UInt64)
        case flightEvent(UInt64, name: String, worker: String?, attempt: Int, at: UInt64)
        case flightEnded(UInt64, waiters: Int, dispatches: Int, error: CanopyError?, cancelled: Bool, at: UInt64)
        case waiterEnded(UInt64, shared: Bool, error: CanopyError?, event: String?, at: UInt64)
    }

    /// Notes not yet flushed, at most ``maximumNotes`` (more are dropped and counted).
    private let notes = Mutex<(notes: [Note], dropped: Int)>(([], 0))
    /// The spans open, by waiter id, and the flights in the air (only ``flush()`` touches them).
    private let open = Mutex<(waiters: [UInt64: any Span], flights: [UInt64: OpenFlight])>(([:], [:]))

    /// A flight in the air. It gets a span of its own only when a second request joins it (for
    /// that request's link) or its first leaves before it ends; otherwise what happened to it
    /// goes on its only waiter's span: one span per request that nobody joined.
    struct OpenFlight {
        let name: String
        let service: String
        let operation: String
        let start: UInt64
        let waiter: UInt64
        /// The context of the waiter that started it (the parent of its span).
        let parent: ServiceContext
        var events: [SpanEvent]
        var span: (any Span)?
    }

    /// Notes held between flushes: some 4 MiB at most.
    static let maximumNotes = 32_768
    /// Requests and flights open at once (some 64 MiB of spans at most); past it, new
    /// requests' spans are not made.
    static let maximumOpen = 65_536

    public init(tracer: any Tracer) {
        self.tracer = tracer
    }

    /// Notes dropped because the buffer was full (a flush that could not keep up).
    public var droppedNotes: Int { notes.withLock { $0.dropped } }

    /// The time now, as the spans record it.
    static var now: UInt64 { DefaultTracerClock.now.nanosecondsSinceEpoch }

    func note(_ note: Note) {
        notes.withLock { buffer in
            guard buffer.notes.count < Self.maximumNotes else { return buffer.dropped += 1 }
            buffer.notes.append(note)
        }
    }

    /// Makes spans of everything noted so far. `ending` also ends every span still open (the
    /// broker stopped).
    public func flush(ending: Bool = false) {
        let pending = notes.withLock { buffer in
            defer { buffer.notes.removeAll(keepingCapacity: true) }
            return buffer.notes
        }
        open.withLock { open in
            for note in pending { apply(note, to: &open) }
            if ending {
                let now = RecordedInstant(nanosecondsSinceEpoch: Self.now)
                for span in Array(open.waiters.values) + open.flights.values.compactMap(\.span) {
                    span.addEvent("the broker stopped")
                    span.end(at: now)
                }
                open = ([:], [:])
            }
        }
    }

    /// The flight's own span, made when first needed, with what happened to it so far.
    private func span(of flight: inout OpenFlight) -> any Span {
        if let span = flight.span { return span }
        let span = tracer.startAnySpan(flight.name, at: RecordedInstant(nanosecondsSinceEpoch: flight.start), context: flight.parent, ofKind: .internal)
        BusTracing.describe(span, service: flight.service, operation: flight.operation)
        for event in flight.events { span.addEvent(event) }
        flight.events = []
        flight.span = span
        return span
    }

    private func apply(_ note: Note, to open: inout (waiters: [UInt64: any Span], flights: [UInt64: OpenFlight])) {
        switch note {
        case .waiter(let id, let caller, let service, let operation, let coalesced, let flight, let at):
            guard open.waiters.count + open.flights.count < Self.maximumOpen else { return }
            let span = tracer.startAnySpan(
                "broker " + BusTracing.spanName(service: service, operation: operation), at: RecordedInstant(nanosecondsSinceEpoch: at),
                context: BusTracing.context(continuing: caller, tracer: tracer), ofKind: .server)
            BusTracing.describe(span, service: service, operation: operation)
            span.attributes["canopy.coalesced"] = coalesced
            if let flight, var served = open.flights[flight] {
                span.addLink(SpanLink(context: self.span(of: &served).context, attributes: ["canopy.link": "served by this flight"]))
                open.flights[flight] = served
            }
            open.waiters[id] = span
        case .flight(let id, let waiter, let service, let operation, let queued, let at):
            guard let parent = open.waiters[waiter] else { return }
            open.flights[id] = OpenFlight(
                name: "flight " + BusTracing.spanName(service: service, operation: operation), service: service, operation: operation,
                start: at, waiter: waiter, parent: parent.context,
                events: queued ? [SpanEvent(name: "queued", at: RecordedInstant(nanosecondsSinceEpoch: at))] : [], span: nil)
        case .flightEvent(let id, let name, let worker, let attempt, let at):
            guard var flight = open.flights[id] else { return }
            var attributes: SpanAttributes = [:]
            if let worker {
                attributes["canopy.worker"] = worker
                attributes["canopy.attempt"] = attempt
            }
            let event = SpanEvent(name: name, at: RecordedInstant(nanosecondsSinceEpoch: at), attributes: attributes)
            if let span = flight.span { span.addEvent(event) } else { flight.events.append(event) }
            open.flights[id] = flight
        case .flightEnded(let id, let waiters, let dispatches, let error, let cancelled, let at):
            guard var flight = open.flights.removeValue(forKey: id) else { return }
            let ended = RecordedInstant(nanosecondsSinceEpoch: at)
            if flight.span == nil, let only = open.waiters[flight.waiter] {
                // Nobody joined and its waiter is still there: the flight's story is the waiter's.
                for event in flight.events { only.addEvent(event) }
                only.attributes["canopy.dispatches"] = dispatches
                if cancelled { only.addEvent(SpanEvent(name: "cancelled: every waiter left", at: ended)) }
                return
            }
            let span = self.span(of: &flight)
            span.attributes["canopy.waiters"] = waiters
            span.attributes["canopy.dispatches"] = dispatches
            if cancelled { span.addEvent(SpanEvent(name: "cancelled: every waiter left", at: ended)) }
            if let error { BusTracing.fail(span, error) }
            span.end(at: ended)
        case .waiterEnded(let id, let shared, let error, let event, let at):
            guard let span = open.waiters.removeValue(forKey: id) else { return }
            span.attributes["canopy.shared"] = shared
            if let event { span.addEvent(SpanEvent(name: event, at: RecordedInstant(nanosecondsSinceEpoch: at))) }
            if let error { BusTracing.fail(span, error) }
            span.end(at: RecordedInstant(nanosecondsSinceEpoch: at))
        }
    }
}

/// A time the loop thread recorded, for the tracer.
struct RecordedInstant: TracerInstant {
    let nanosecondsSinceEpoch: UInt64

    static func < (lhs: Self, rhs: Self) -> Bool { lhs.nanosecondsSinceEpoch < rhs.nanosecondsSinceEpoch }
}
