import CanopyMessages
import CanopyWire
import Tracing

/// Trace context across the bus: what a caller puts in a request's header
/// (``RequestHeader/trace``) and what a worker makes of it, through whichever tracer the
/// process installed (swift-otel's when ``Traces`` is on; none, and no cost, when it is off).
///
/// Only a sampled context travels: a request that is not recorded carries no trace bytes, so a
/// stack that samples 1% sends 99% of its requests exactly as without tracing. The context
/// goes as the W3C `traceparent` a tracer injects and extracts (`tracestate` does not travel).
public enum BusTracing {
    /// The trace context of `context`'s span as `tracer` propagates it, when it is sampled.
    public static func trace(of context: ServiceContext, tracer: any Tracer) -> TraceContext? {
        var carrier = Carrier()
        tracer.inject(context, into: &carrier, using: Carrier.Injector())
        return carrier.trace
    }

    /// A service context continuing `trace`, for a span of the request's handler.
    public static func context(continuing trace: TraceContext, tracer: any Tracer) -> ServiceContext {
        var context = ServiceContext.topLevel
        tracer.extract(Carrier(trace: trace), into: &context, using: Carrier.Extractor())
        return context
    }

    /// The span name of a bus call, as RPC spans are named: `service/operation`.
    public static func spanName(service: String, operation: String) -> String { service + "/" + operation }

    /// Names the call on `span` (OpenTelemetry's RPC conventions).
    public static func describe(_ span: any Span, service: String, operation: String) {
        span.attributes["rpc.system"] = "canopy"
        span.attributes["rpc.service"] = service
        span.attributes["rpc.method"] = operation
    }

    /// Marks `span` failed with a Canopy error's code and message.
    public static func fail(_ span: any Span, _ error: CanopyError) {
        span.attributes["canopy.error.code"] = error.code.rawValue
        span.setStatus(SpanStatus(code: .error, message: String(error.message.prefix(256))))
    }

    /// Moves a `traceparent` between a tracer and a ``TraceContext``.
    struct Carrier {
        var trace: TraceContext?

        struct Injector: Tracing.Injector {
            func inject(_ value: String, forKey key: String, into carrier: inout Carrier) {
                guard key == "traceparent", let trace = TraceContext(traceparent: value), trace.isSampled else { return }
                carrier.trace = trace
            }
        }

        struct Extractor: Tracing.Extractor {
            func extract(key: String, from carrier: Carrier) -> String? {
                key == "traceparent" ? carrier.trace?.traceparent : nil
            }
        }
    }
}
