import CanopyMessages
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import OpenAPIRuntime
import Synchronization

/// What every request passes through before its route: a request id (answered in
/// `X-Request-ID`, logged with everything about the request), the caller's bearer token
/// checked, the body's size checked, and any error turned into problem details
/// (RFC 9457) with a status that says what kind of failure it was.
struct EdgeMiddleware<Context: RequestContext>: RouterMiddleware {
    let tokens: TokenAuthority
    /// The largest request body taken: a JSON body, and photos' bytes (`POST
    /// /v1/plants/{plantID}/photos`, `POST /v1/identifications`).
    let maximumBodyBytes: Int
    let maximumPhotoBytes: Int
    /// Each person's requests a second, and at once.
    let limiter: RateLimiter
    let metrics: APIMetrics
    /// Photo variants, served here rather than through the generated layer.
    let variants: VariantRoute
    /// The document's routes, for 405 and `Allow`.
    let routes: RouteMethods
    /// `Idempotency-Key` on POST and PATCH, when the edge has a store to keep keys in.
    var idempotency: IdempotentRequests?
    /// Each person's budget of work for the routes that work on photos (``RouteCost``).
    var budget: WorkBudget?
    private let sequence = RequestSequence()

    static var requestIDHeader: HTTPField.Name { HTTPField.Name("X-Request-ID")! }

    /// A request the router matched (variant GETs never reach it: ``EdgeResponder`` takes them first).
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        try await handle(request, context: context, variant: nil, next: next)
    }

    /// A request, with the photo and variant when ``EdgeResponder`` found it to be a variant GET
    /// (answered here, `next` unused).
    func handle(
        _ request: Request, context: Context, variant: (photoID: String, variant: String)?,
        next: (Request, Context) async throws -> Response
    ) async throws -> Response {
        let started = ContinuousClock.now
        let requestID = sequence.next()
        var response = await answer(request, context: context, requestID: requestID, variant: variant, next: next)
        response.headers[Self.requestIDHeader] = requestID
        // The route as the document names it (bounded), once the router matched one.
        let route = variant != nil ? VariantRoute.template : context.endpointPath ?? "unknown"
        metrics.record(route: route, status: response.status.code, duration: .now - started)
        if response.status.code >= 500 {
            context.logger.error(
                "api.failed",
                metadata: [
                    "api.request": "\(requestID)", "api.status": "\(response.status.code)",
                    "api.path": "\(request.uri.path)",
                ])
        }
        return response
    }

    private func answer(
        _ request: Request, context: Context, requestID: String, variant: (photoID: String, variant: String)?,
        next: (Request, Context) async throws -> Response
    ) async -> Response {
        guard let authorization = request.headers[.authorization], authorization.utf8.count > 7,
            authorization.prefix(7).lowercased() == "bearer "
        else {
            return Problem.response(
                .unauthorized, "this needs a bearer token: Authorization: Bearer <token from canopy-api token issue>",
                requestID: requestID, headers: [.wwwAuthenticate: "Bearer realm=\"canopy\""])
        }
        guard let user = await tokens.user(of: String(authorization.dropFirst(7))) else {
            return Problem.response(
                .unauthorized, "the bearer token is not valid: forged, expired or not Canopy's; ask for a new one",
                requestID: requestID,
                headers: [.wwwAuthenticate: "Bearer realm=\"canopy\", error=\"invalid_token\""])
        }
        if let wait = limiter.take(user) {
            metrics.rateLimited.increment()
            return Problem.response(
                .tooManyRequests, "too many requests from you at once; try again in \(wait) s", requestID: requestID,
                headers: [.retryAfter: String(wait)])
        }
        let path = request.uri.path
        let isPhoto = request.method == .post && ((path.hasPrefix("/v1/plants/") && path.hasSuffix("/photos")) || path == "/v1/identifications")
        let limit = isPhoto ? maximumPhotoBytes : maximumBodyBytes
        let announced = request.headers[.contentLength].flatMap(Int.init)
        if let length = announced, length > limit {
            return Problem.response(.contentTooLarge, "the body has \(length) bytes; this route takes at most \(limit)", requestID: requestID)
        }
        // Work on photos within the person's budget (everything else costs its request alone):
        // checked before the body is read when its length is announced, so a refused photo
        // costs no more than its refusal.
        var working: RouteCost?
        defer { if let working { budget?.finished(user, working) } }
        if let budget, let length = announced, let cost = RouteCost.of(method: request.method, path: path, bodyBytes: length) {
            if let refused = budget.start(user, cost) { return overBudget(refused, requestID: requestID) }
            working = cost
        }
        var request = request
        // No route reads a GET's body: not collected (a read is a task hop for nothing).
        var collected = ByteBuffer()
        if request.method != .get && request.method != .head {
            do {
                // Collected here, within the limit, also when it comes in chunks without a length
                // (the generated server would read any length).
                collected = try await request.body.collect(upTo: limit)
                request.body = .init(buffer: collected)
            } catch {
                return Problem.response(.contentTooLarge, "the body has more than \(limit) bytes, the most this route takes", requestID: requestID)
            }
            // A JSON body is read as the bus reads one: a key twice in an object is refused
            // (decoders disagree on which one wins), as is nesting past 64 levels.
            if let type = request.headers[.contentType]?.lowercased(), type.hasPrefix("application/json") || type.contains("+json") {
                do {
                    try JSONShape.check(Array(collected.readableBytesView))
                } catch {
                    return Problem.response(.badRequest, "the JSON body: \(error.message)", requestID: requestID)
                }
            }
        }
        // A body that came without its length announced: its cost, now that it is read.
        if working == nil, let budget, let cost = RouteCost.of(method: request.method, path: path, bodyBytes: collected.readableBytes) {
            if let refused = budget.start(user, cost) { return overBudget(refused, requestID: requestID) }
            working = cost
        }
        return await dispatch(request, context: context, user: user, requestID: requestID, body: collected, variant: variant, next: next)
    }

    /// 429 for photo work past a person's budget, with the wait it implies.
    private func overBudget(_ refused: (reason: String, retryAfter: Int), requestID: String) -> Response {
        metrics.overBudget.increment()
        return Problem.response(.tooManyRequests, refused.reason, requestID: requestID, headers: [.retryAfter: String(refused.retryAfter)])
    }

    /// The request on its way to its route: through ``IdempotentRequests`` when it carries a key.
    private func dispatch(
        _ request: Request, context: Context, user: String, requestID: String, body collected: ByteBuffer,
        variant: (photoID: String, variant: String)?, next: (Request, Context) async throws -> Response
    ) async -> Response {
        // A retried POST with the key it came with the first time is answered once (IdempotentRequests).
        if let idempotency, request.method == .post || request.method == .patch, let value = request.headers[IdempotentRequests.keyHeader] {
            let key: String
            do {
                key = try IdempotencyKeys.parse(value)
            } catch {
                return Problem.response(.badRequest, error.message, requestID: requestID, field: IdempotencyKeys.header)
            }
            return await idempotency.run(request, person: user, key: key, body: collected, requestID: requestID, logger: context.logger) { serviceKey in
                await Caller.$idempotencyKey.withValue(serviceKey) {
                    await route(request, context: context, user: user, requestID: requestID, variant: variant, next: next)
                }
            }
        }
        return await route(request, context: context, user: user, requestID: requestID, variant: variant, next: next)
    }

    /// The request's route (or the variant it is), for `user`; any error as the problem it is.
    private func route(
        _ request: Request, context: Context, user: String, requestID: String, variant: (photoID: String, variant: String)?,
        next: (Request, Context) async throws -> Response
    ) async -> Response {
        let path = request.uri.path
        do {
            return try await Caller.$principal.withValue(user) {
                try await Caller.$requestID.withValue(requestID) {
                    if let variant { return try await variants.respond(to: request, photoID: variant.photoID, variant: variant.variant) }
                    return try await next(request, context)
                }
            }
        } catch let error as HTTPError where error.status == .notFound && variant == nil {
            // No route: a path the document has, with another method, is 405 and says which it takes.
            let allowed = routes.methods(for: path)
            guard !allowed.isEmpty else { return Problem.make(for: error, requestID: requestID).response }
            return Problem.response(
                .methodNotAllowed, "\(path) takes \(allowed.joined(separator: ", ")), not \(request.method)", requestID: requestID,
                headers: [.allow: allowed.joined(separator: ", ")])
        } catch {
            let problem = Problem.make(for: error, requestID: requestID)
            if problem.status.code >= 500 {
                // What the problem body leaves out (it may name internals): the log has it, by request id.
                context.logger.error("api.error", metadata: ["api.request": "\(requestID)", "api.error": "\(String(describing: error).prefix(2_000))"])
            }
            return problem.response
        }
    }
}

/// The routes the router has, by path template and method: which methods a path takes, for
/// 405 Method Not Allowed and its `Allow` header. Filled once the routes are registered.
final class RouteMethods: Sendable {
    private let table = Mutex<[(template: [Substring], methods: Set<String>)]>([])

    /// Takes the router's routes (`Router.routes`: a path such as `/v1/plants/{plantID}` and a method).
    func load(_ routes: [(path: String, method: String)]) {
        var byPath: [String: Set<String>] = [:]
        for route in routes { byPath[route.path, default: []].insert(route.method) }
        table.withLock { $0 = byPath.map { (Self.components($0.key), $0.value) } }
    }

    /// The methods `path` takes, sorted; none when no route has its shape.
    func methods(for path: String) -> [String] {
        let parts = Self.components(path)
        return table.withLock { table in
            var methods = Set<String>()
            for route in table
            where route.template.count == parts.count
                && zip(route.template, parts).allSatisfy({ template, part in
                    template == part || (template.hasPrefix("{") && template.hasSuffix("}") && !part.isEmpty)
                })
            {
                methods.formUnion(route.methods)
            }
            return methods.sorted()
        }
    }

    private static func components(_ path: String) -> [Substring] {
        path.split(separator: "/", omittingEmptySubsequences: true)
    }
}

/// Request ids: a random prefix per process and a counter, short and unique enough to find
/// a request in the logs.
final class RequestSequence: Sendable {
    private let prefix = String(UInt32.random(in: .min ... .max), radix: 36)
    private let counter = Atomic<UInt64>(0)

    func next() -> String {
        let number = counter.add(1, ordering: .relaxed).newValue
        return "\(prefix)-\(String(number, radix: 36))"
    }
}

/// Problem details (RFC 9457): one JSON shape for every error.
enum Problem {
    /// A problem made: its status, headers and JSON body.
    struct Made {
        var status: HTTPResponse.Status
        var headers: HTTPFields
        var bytes: [UInt8]

        var response: Response { Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: bytes))) }
    }

    static func response(
        _ status: HTTPResponse.Status, _ detail: String, requestID: String, field: String? = nil,
        headers: HTTPFields = [:]
    ) -> Response {
        make(status, detail, requestID: requestID, field: field, headers: headers).response
    }

    static func response(for error: any Error, requestID: String) -> Response {
        make(for: error, requestID: requestID).response
    }

    struct Body: Encodable {
        var type: String
        var title: String
        var status: Int
        var detail: String
        var requestID: String
        var field: String?
    }

    private static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }()

    /// The statuses canopy-api answers, by code, with their reason phrases (a status made from
    /// a bare code, as the router's errors carry, has none).
    private static let known: [Int: HTTPResponse.Status] = Dictionary(
        uniqueKeysWithValues: [
            HTTPResponse.Status.badRequest, .unauthorized, .forbidden, .notFound, .methodNotAllowed, .notAcceptable, .requestTimeout, .conflict, .gone,
            .lengthRequired, .preconditionFailed, .contentTooLarge, .uriTooLong, .unsupportedMediaType, .unprocessableContent, .tooManyRequests,
            .requestHeaderFieldsTooLarge, .internalServerError, .notImplemented, .badGateway, .serviceUnavailable, .gatewayTimeout,
        ].map { ($0.code, $0) })

    static func make(
        _ status: HTTPResponse.Status, _ detail: String, requestID: String, field: String? = nil,
        headers: HTTPFields = [:]
    ) -> Made {
        let status = status.reasonPhrase.isEmpty ? known[status.code] ?? HTTPResponse.Status(code: status.code, reasonPhrase: "HTTP \(status.code)") : status
        let slug = status.reasonPhrase.lowercased().replacingOccurrences(of: " ", with: "-")
        let body = Body(
            type: "https://canopy.dev/problems/\(slug)", title: status.reasonPhrase, status: status.code, detail: detail,
            requestID: requestID, field: field)
        var headers = headers
        headers[.contentType] = "application/problem+json"
        return Made(status: status, headers: headers, bytes: [UInt8]((try? encoder.encode(body)) ?? Data()))
    }

    /// Any error a route threw, as the problem it is.
    static func make(for error: any Error, requestID: String) -> Made {
        switch error {
        case let error as ServerError:
            return make(forServerError: error, requestID: requestID)
        case let error as CanopyError:
            return make(error, requestID: requestID)
        case let error as RequestFieldError:
            return make(.badRequest, error.message, requestID: requestID, field: error.field)
        case let error as HTTPError:
            let status = HTTPResponse.Status(code: error.status.code)
            let detail = status == .notFound ? "there is no such route; docs/openapi.yaml lists them" : (error.body ?? status.reasonPhrase)
            return make(status, detail, requestID: requestID)
        default:
            return make(.internalServerError, "something failed inside canopy-api; the request id finds it in the log", requestID: requestID)
        }
    }

    /// What the generated server threw: the handler's own error, or the request not being
    /// what the document says (a body that does not decode, a parameter of the wrong type).
    private static func make(forServerError error: ServerError, requestID: String) -> Made {
        switch error.underlyingError {
        case let inner as CanopyError: return make(inner, requestID: requestID)
        case let inner as RequestFieldError: return make(.badRequest, inner.message, requestID: requestID, field: inner.field)
        case let inner as DecodingError:
            return decoding(inner, requestID: requestID, whole: error.requestBody == nil ? "a query or path parameter" : "the body")
        default:
            if error.operationInput == nil || error.causeDescription.lowercased().contains("decod") || error.causeDescription.lowercased().contains("pars") {
                // The request did not become the operation's input.
                let described = "\(error.underlyingError)".prefix(300)
                return make(.badRequest, "the request does not match the API document: \(described)", requestID: requestID)
            }
            return make(.internalServerError, "something failed inside canopy-api; the request id finds it in the log", requestID: requestID)
        }
    }

    /// A request that did not decode, naming the field when the decoder knows it (`whole`
    /// says what was wrong when it does not: the body, or a parameter).
    private static func decoding(_ error: DecodingError, requestID: String, whole: String) -> Made {
        func path(_ context: DecodingError.Context, _ key: (any CodingKey)? = nil) -> String {
            let keys = context.codingPath + (key.map { [$0] } ?? [])
            return keys.map { $0.intValue.map { "[\($0)]" } ?? ".\($0.stringValue)" }.joined().drop { $0 == "." }.description
        }
        let (field, detail): (String, String) =
            switch error {
            case .keyNotFound(let key, let context): (path(context, key), "is required")
            case .typeMismatch(let type, let context): (path(context), "is not a valid \(type): \(context.debugDescription.prefix(200))")
            case .valueNotFound(_, let context): (path(context), "may not be null")
            case .dataCorrupted(let context): (path(context), "is not valid: \(context.debugDescription.prefix(200))")
            @unknown default: ("", "does not decode")
            }
        return make(.badRequest, "\(field.isEmpty ? whole : field) \(detail)", requestID: requestID, field: field.isEmpty ? nil : field)
    }

    /// A bus error as HTTP: the caller's mistakes as 4xx, the system's state as 5xx. An error
    /// about a request field is 400 naming it, whatever its code (a field over its length is
    /// the request's mistake; 413 is for bodies over the body limit).
    private static func make(_ error: CanopyError, requestID: String) -> Made {
        if let field = error.field { return make(.badRequest, error.message, requestID: requestID, field: field) }
        let status: HTTPResponse.Status =
            switch error.code {
            case .badRequest: .badRequest
            case .notFound: .notFound
            case .conflict: .conflict
            case .stale: .preconditionFailed
            case .tooLarge: .contentTooLarge
            case .unauthorized: .forbidden
            case .busy, .noWorkers, .shuttingDown: .serviceUnavailable
            case .timeout: .gatewayTimeout
            case .workerLost, .brokerLost: .badGateway
            case .internal: .internalServerError
            }
        var headers: HTTPFields = [:]
        if error.code == .busy { headers[.retryAfter] = "1" }
        if error.code == .noWorkers { headers[.retryAfter] = "5" }
        return make(status, error.message, requestID: requestID, headers: headers)
    }
}
