import CanopyBus
import CanopyMessages
import CanopyOutbound
import CanopyServiceKit
import Foundation
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import OpenAPIHummingbird
import OpenAPIRuntime
import ServiceLifecycle

/// Everything `canopy-api serve` can be told.
public struct APIServiceSettings: Sendable {
    /// Query parameters whose values never reach a span's `url.query` (what a person typed:
    /// a plant search, a family, a page cursor); the tracing middleware records them as
    /// `REDACTED`.
    public static let redactedQueryParameters: Set<String> = ["search", "family", "after"]
    /// Which requests are spans (the tracing middleware, continuing an app's `traceparent`),
    /// `nil` for none; `canopy-api serve` sets it from the sampler variables when traces are
    /// on (`Traces.isEnabled`), and leaves the middleware out otherwise. By default, requests
    /// an app's context samples.
    public var tracing: EdgeSampling? = EdgeSampling(followsParent: true, root: .never)

    /// Where apps reach the HTTP API.
    public var http: ListenAddress
    /// How canopy-api reaches the broker (endpoint, CURVE keys).
    public var bus: BusClient.Configuration
    /// The keys Canopy's own bearer tokens are signed with (32 bytes or more each): the first
    /// signs, every one verifies (`--token-key-file`, repeated).
    public var tokenKeys: [[UInt8]]
    /// Identity providers whose tokens are taken too (`--trusted-issuers FILE`).
    public var trustedIssuers: [TrustedIssuer] = []
    /// Hosts their keys may be fetched from though they are private or loopback (`--jwks-allow-host`).
    public var jwksAllowedHosts: Set<String> = []
    /// A token naming a key an issuer has not published refreshes its keys at most once in this.
    public var jwksMinimumRefresh: Duration = .seconds(60)
    /// canopy-api's store: revoked tokens and people signed out (watched for changes), and
    /// idempotency keys; nil checks no revocations and keeps no keys (an `Idempotency-Key` is
    /// then not looked at: tests of other things).
    public var store: (any APIStoring)?
    /// How long a request with an `Idempotency-Key` holds it before a repeat may run it again
    /// (its edge presumed dead mid-request); longer than any request takes.
    public var idempotencyLease: Duration = .seconds(30)
    /// Where `/metrics` and `/health` listen; `nil` for nowhere.
    public var metrics: ListenAddress?
    /// The largest JSON body taken.
    public var maximumBodyBytes = 1_048_576
    /// The largest photo upload taken (canopy-images takes up to 25 MiB; the broker's frame
    /// limit must allow it).
    public var maximumPhotoBytes = APIHandlers.maximumPhotoBytes
    /// How long one bus call may take.
    public var callTimeout: Duration = .seconds(10)
    /// Each person's requests a second (a token bucket's rate), and at once (its size).
    public var rateLimit = 50.0
    public var rateBurst = 200.0
    /// Each person's work budget for the routes that work on photos (``RouteCost``): units a
    /// second, units at once, and their requests working in one service at once.
    public var workRate = 100.0
    public var workBurst = 1_000.0
    public var workInFlight = 2
    /// Implicit batching: how long the first variant or next-task lookup waits for others
    /// (zero sends each alone), and the most keys one bus request carries.
    public var batchWindow: Duration = .milliseconds(2)
    public var batchKeys = Lookup.maximumKeys
    /// How many batches of one kind may be in the air before lookups wait for one to return.
    public var batchInFlight = 2
    /// How long a connection may sit idle between requests before it is closed.
    public var idleTimeout = APIServiceSettings.defaultIdleTimeout
    /// How long a connection may send nothing while a request of it is being read (its head
    /// or its body) before it is closed.
    public var readTimeout = APIServiceSettings.defaultReadTimeout
    public static let defaultIdleTimeout: Duration = .seconds(30)
    public static let defaultReadTimeout: Duration = .seconds(30)

    public init(http: ListenAddress, bus: BusClient.Configuration, tokenKey: [UInt8], metrics: ListenAddress? = nil) {
        self.init(http: http, bus: bus, tokenKeys: [tokenKey], metrics: metrics)
    }

    public init(http: ListenAddress, bus: BusClient.Configuration, tokenKeys: [[UInt8]], metrics: ListenAddress? = nil) {
        self.http = http
        self.bus = bus
        self.tokenKeys = tokenKeys
        self.metrics = metrics
    }

    /// The authority that checks bearer tokens, with the issuers' keys fetched through the
    /// outbound address policy (at most 256 KiB within 5 s).
    func tokenAuthority(revocations: RevocationWatcher? = nil) throws -> TokenAuthority {
        var http: PinnedHTTP?
        if !trustedIssuers.isEmpty {
            var outbound = PinnedHTTP.Settings()
            outbound.allowedHosts = jwksAllowedHosts
            outbound.maximumBytes = IssuerKeys.maximumBytes
            outbound.connectTimeout = .seconds(3)
            outbound.totalTimeout = .seconds(5)
            http = try PinnedHTTP(settings: outbound)
        }
        return try TokenAuthority(keys: tokenKeys, issuers: trustedIssuers, http: http, minimumRefresh: jwksMinimumRefresh, revocations: revocations)
    }
}

/// The HTTP listener apps call, as a service of the group, with the port it bound.
public final class APIHTTPServer: Service, Sendable {
    private let application: Application<EdgeResponder>
    private let port = BoundPort(listener: "the HTTP listener")

    init(responder: EdgeResponder, address: ListenAddress, idleTimeout: Duration, readTimeout: Duration, logger: Logger) {
        self.address = address
        let bound = port
        let read = TimeAmount.milliseconds(readTimeout.wholeMilliseconds)
        application = Application(
            responder: responder,
            server: .http1(
                configuration: .init(
                    // A read timeout closes a connection that stalls while its request is read (or
                    // that holds no request); one being answered is not cut.
                    additionalChannelHandlers: [IdleStateHandler(readTimeout: read), HTTPUserEventHandler(logger: logger)],
                    idleTimeout: .milliseconds(idleTimeout.wholeMilliseconds))),
            configuration: .init(address: .hostname(address.host, port: address.port), serverName: "canopy"),
            onServerRunning: { channel in
                let port = channel.localAddress?.port
                bound.set(port)
                logger.info("api.listening", metadata: ["api.address": "\(address.host):\(port ?? 0)"])
            },
            logger: logger)
    }

    /// Where it listens, for the sentence a failed bind stops the process with.
    private let address: ListenAddress
    static let purpose = "the HTTP API"
    static let option = "--http HOST:PORT (CANOPY_HTTP)"

    /// Serves until graceful shutdown. A bind that fails (the port taken since the build's
    /// check) throws the same sentence as the check.
    public func run() async throws {
        try await PortCheck.translatingBindErrors(address, for: Self.purpose, option: Self.option) {
            try await application.run()
        }
    }

    /// The port it listens on, once it does.
    public func boundPort(within limit: Duration = .seconds(10)) async throws -> Int {
        try await port.wait(within: limit)
    }
}

/// Builds what `canopy-api serve` runs, in start order: the bus client, the HTTP API (the
/// router generated from docs/openapi.yaml behind the edge middleware), and the `/metrics` and
/// `/health` listener when `settings` name one. `/health` says whether the broker answers and
/// which services have workers.
public func buildAPIService(settings: APIServiceSettings, context: ZMQContext, logger: Logger) throws -> [any Service] {
    // Every port first, so a taken one stops the process before anything starts.
    try checkAPIPorts(settings)
    _ = try settings.tokenAuthority() // a bad key or issuer stops it before the client connects
    let bus = try BusClient(configuration: settings.bus, context: context, logger: logger)
    return [bus] + (try makeAPIService(settings: settings, bus: bus, logger: logger))
}

/// Stops with a sentence when a port `settings` name is taken (before anything opens: the
/// store, the bus).
public func checkAPIPorts(_ settings: APIServiceSettings) throws {
    try PortCheck.ensureFree(settings.http, for: APIHTTPServer.purpose, option: APIHTTPServer.option)
    try OperatingEndpoint.ensureFree(settings.metrics)
}

/// The HTTP API and the `/metrics` and `/health` listener (when `settings` name one), calling
/// the services through `bus`: what ``buildAPIService(settings:context:logger:)`` runs after
/// its bus client, and what tests run on an in-process bus.
public func makeAPIService(settings: APIServiceSettings, bus: any BusCalling, logger: Logger) throws -> [any Service] {
    let signOuts = SignOutDigest(tokenKeys: settings.tokenKeys)
    // Sign-outs recorded by an older canopy-api name the person; from now on, a digest.
    try settings.store?.digestLegacySignOuts(signOuts)
    let watcher = try settings.store.map { try RevocationWatcher(store: $0, digests: signOuts, logger: logger) }
    let tokens = try settings.tokenAuthority(revocations: watcher)
    if !settings.trustedIssuers.isEmpty {
        // Each issuer's keys now; one that cannot be reached is tried again when its tokens come.
        Task {
            for (issuer, error) in await tokens.loadIssuerKeys() {
                logger.warning("api.issuer.keys.failed", metadata: ["api.issuer": "\(issuer)", "api.error": "\(error)"])
            }
        }
    }
    let router = Router()
    let metrics = APIMetrics()
    // Dates as the bus writes them; compact JSON with sorted keys, as the bus's.
    let configuration = Configuration(dateTranscoder: WireDateTranscoder(), jsonEncodingOptions: [.sortedKeys, .withoutEscapingSlashes])
    let operations = OperationTable()
    var api = APIHandlers(bus: bus, timeout: settings.callTimeout, operations: operations, metrics: metrics)
    if let store = settings.store {
        // Tokens issued in the second of the deletion are signed out too: the one it came with;
        // the answers kept for their idempotency keys go with the rest of their data.
        api.signOut = { person in
            // Under every key's digest: a key rotated out later keeps no one signed back in.
            let (digests, before) = (signOuts.candidates(person), Date().addingTimeInterval(1))
            try await offThePool { for digest in digests { try store.signOut(digest: digest, before: before, erasure: true) } }
            for digest in digests { watcher?.note(signOut: digest, before: before) } // refused here at once, everywhere within the watch interval
        }
        api.forgetKeys = { person in
            try await store.forgetKeys(of: person)
            try await offThePool { store.eraseResidue() }
        }
    }
    if settings.batchWindow > .zero {
        api.lookups = Lookups(
            bus: bus, window: settings.batchWindow, maximumKeys: settings.batchKeys, maximumInFlight: settings.batchInFlight,
            timeout: settings.callTimeout)
    }
    let routes = RouteMethods()
    let edge = EdgeMiddleware<BasicRequestContext>(
        tokens: tokens, maximumBodyBytes: settings.maximumBodyBytes, maximumPhotoBytes: settings.maximumPhotoBytes,
        limiter: RateLimiter(rate: settings.rateLimit, burst: settings.rateBurst), metrics: metrics,
        variants: VariantRoute(api: api), routes: routes,
        idempotency: settings.store.map { IdempotentRequests(store: $0, lease: settings.idempotencyLease) },
        budget: WorkBudget(rate: settings.workRate, burst: settings.workBurst, inFlight: settings.workInFlight))
    // A server span per request, continuing the app's W3C `traceparent` (Traces: no-op unless on).
    // What a person typed (a plant search, a family, a page cursor) stays out of the spans.
    if let sampling = settings.tracing {
        router.add(middleware: EdgeTracingMiddleware(sampling: sampling, redactingQueryParameters: APIServiceSettings.redactedQueryParameters))
    }
    router.add(middleware: edge)
    try api.registerHandlers(on: router, configuration: configuration, middlewares: [EntityTags()])
    routes.load(router.routes.map { ("\($0.path)", $0.method.rawValue) })
    try api.registerHandlers(on: operations, configuration: configuration, middlewares: [EntityTags()]) // the same handlers, for batches
    let http = APIHTTPServer(
        responder: EdgeResponder(router: router.buildResponder(), edge: edge), address: settings.http,
        idleTimeout: settings.idleTimeout, readTimeout: settings.readTimeout, logger: logger)
    var services: [any Service] = (watcher.map { [$0] } ?? []) + [http]
    if let metrics = settings.metrics {
        services.append(try OperatingEndpoint(host: metrics.host, port: metrics.port, health: { await brokerHealth(bus) }, logger: logger))
    }
    if let postgres = settings.store as? PostgresAPIStore {
        // Told first (the group stops in reverse order): requests draining never wait on a
        // PostgreSQL that is gone.
        services.append(ShutdownNotice(actions: [postgres.database.beginShutdown]))
    }
    return services
}

/// Whether the broker answers, and which services have workers.
func brokerHealth(_ bus: any BusCalling) async -> HealthReport {
    do {
        let services = try await bus.call(Broker.Services.self, Empty(), timeout: .seconds(2))
        var report = HealthReport(healthy: true, checks: ["broker": "answers"])
        for service in services { report.checks["service.\(service.name)"] = "\(service.workers) worker\(service.workers == 1 ? "" : "s")" }
        return report
    } catch {
        return HealthReport(healthy: false, checks: ["broker": "does not answer (\(error)); is canopy-broker running at --endpoint?"])
    }
}

/// The API's dates exactly as the bus's: `2026-03-29T09:00:00.000Z`, parsed by hand, a date that
/// does not exist refused.
struct WireDateTranscoder: DateTranscoder {
    func encode(_ date: Date) throws -> String { MessageCodec.string(from: date) }

    func decode(_ text: String) throws -> Date {
        guard let date = MessageCodec.date(from: text) else {
            throw DecodingError.dataCorrupted(
                .init(codingPath: [], debugDescription: "'\(text.prefix(40))' is not an ISO 8601 date such as 2026-03-29T09:00:00.000Z"))
        }
        return date
    }
}
