import CanopyServiceKit
import CanopyWire
import HTTPTypes
import Hummingbird
import Tracing

/// A server span per recorded request, continuing an app's W3C `traceparent`. Which requests
/// are recorded is decided first (``EdgeSampling``), so an unrecorded one (99% of them at 1%
/// sampling) makes no span at all. Hummingbird's `TracingMiddleware` starts a span for every
/// request and works out its attributes whether the sampler records it or not: with the bus
/// calls' checks, about 4% of canopy-api's CPU samples at 1% (docs/PERFORMANCE.md, "Tracing").
///
/// The attributes are the ones `TracingMiddleware` sets (OpenTelemetry's HTTP conventions),
/// with the values of `redactedQuery` parameters replaced by `REDACTED`. The span ends when
/// the response is made (its body written after that is not part of it).
struct EdgeTracingMiddleware<Context: RequestContext>: RouterMiddleware {
    /// Which requests are recorded.
    let sampling: EdgeSampling
    /// Query parameters whose values stay out of spans.
    let redactedQuery: Set<Substring>

    init(sampling: EdgeSampling, redactingQueryParameters names: Set<String>) {
        self.sampling = sampling
        redactedQuery = Set(names.map { $0[...] })
    }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        // Decided before any span is made (EdgeSampling): a request not recorded costs a header
        // look-up and a draw, and runs without a trace context, so nothing under it (bus calls,
        // store calls) asks a tracer anything either; only a sampled context travels on the bus.
        // An invalid traceparent counts as none (W3C).
        let parent = request.headers[.traceparent].flatMap(TraceContext.init(traceparent:))
        guard sampling.records(parentSampled: parent?.isSampled) else { return try await next(request, context) }
        let tracer = InstrumentationSystem.tracer
        var parentContext = ServiceContext.current ?? .topLevel
        tracer.extract(request.headers, into: &parentContext, using: HeadersExtractor())
        let span = tracer.startSpan(Self.unroutedName(request.method), context: parentContext, ofKind: .server)
        span.updateAttributes { attributes in
            attributes["http.request.method"] = request.method.rawValue
            attributes["url.path"] = request.uri.path
            attributes["url.query"] =
                redactedQuery.isEmpty
                ? request.uri.query
                : request.uri.queryParameters.lazy.map { key, value in
                    redactedQuery.contains(key) ? "\(key)=REDACTED" : "\(key)=\(value)"
                }.joined(separator: "&")
            attributes["user_agent.original"] = request.headers[.userAgent]
            attributes["http.request.body.size"] = request.headers[.contentLength].flatMap { Int($0) }
        }
        defer { span.end() }
        do {
            let response = try await ServiceContext.$current.withValue(span.context) { try await next(request, context) }
            name(span, context)
            span.updateAttributes { attributes in
                attributes["http.response.status_code"] = Int(response.status.code)
                attributes["http.response.body.size"] = response.body.contentLength
            }
            return response
        } catch {
            name(span, context)
            let status = (error as? any HTTPResponseError)?.status.code ?? 500
            span.attributes["http.response.status_code"] = status
            if 500..<600 ~= status { span.setStatus(SpanStatus(code: .error)) }
            span.recordError(error)
            throw error
        }
    }

    /// The span's name until the router finds a route (a literal for the usual methods: no
    /// string is built for a request that is not recorded).
    static func unroutedName(_ method: HTTPRequest.Method) -> String {
        switch method {
        case .get: "HTTP GET route not found"
        case .post: "HTTP POST route not found"
        case .put: "HTTP PUT route not found"
        case .patch: "HTTP PATCH route not found"
        case .delete: "HTTP DELETE route not found"
        default: "HTTP \(method.rawValue) route not found"
        }
    }

    /// Names the span by its route, once the router found one.
    private func name(_ span: any Span, _ context: Context) {
        guard let route = context.endpointPath else { return }
        span.operationName = route
        span.attributes["http.route"] = route
    }

    private struct HeadersExtractor: Extractor {
        func extract(key name: String, from headers: HTTPFields) -> String? {
            HTTPField.Name(name).flatMap { headers[$0] }
        }
    }
}

extension HTTPField.Name {
    /// W3C Trace Context's header.
    static let traceparent = HTTPField.Name("traceparent")!
}
