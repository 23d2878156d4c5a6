import ArgumentParser
import CanopyAPI
import CanopyBus
import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation
import Logging

@main
struct APICommand: MainCommand {
    static let configuration = CommandConfiguration(
        commandName: "canopy-api",
        abstract: "Canopy's HTTP API: what the apps call, checked for who is calling and carried onto the bus.",
        discussion: """
            Examples:
              canopy-api serve --http 0.0.0.0:8080 --endpoint tcp://127.0.0.1:5555 --token-key-file ./token.key
              canopy-api token issue --user user-42 --days 30 --token-key-file ./token.key
              canopy-api health --metrics-bind 127.0.0.1:9405
            """,
        subcommands: [ServeAPI.self, TokenCommand.self, HealthCommand<CanopyAPI>.self])
}

/// What the shared `health` knows of canopy-api.
enum CanopyAPI: ServiceExecutable {
    static let name = "canopy-api"
    static let directoryName = CanopyAPIStore.directoryName
    static let defaultListener = OperatingOptions.Defaults.api
    static let healthyMeans = "its broker answers"
}

/// Where the token signing key comes from: a file, or the key itself in a variable. Never logged.
struct TokenKeyOptions: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "A file holding a key Canopy's bearer tokens are signed with (32 bytes or more, random); repeat it to rotate: the first signs, every one verifies. Env: CANOPY_TOKEN_KEY_FILE (comma-separated), or the key itself in CANOPY_TOKEN_KEY.",
            valueName: "file"))
    var tokenKeyFile: [String] = Environment.string("CANOPY_TOKEN_KEY_FILE")?.split(separator: ",").map(String.init) ?? []

    /// The signing key (the first).
    func key() throws -> [UInt8] { try keys()[0] }

    /// Every key, the signing one first.
    func keys() throws -> [[UInt8]] {
        do {
            guard !tokenKeyFile.isEmpty else { return [try TokenAuthority.key(file: nil, value: Environment.string("CANOPY_TOKEN_KEY"))] }
            return try tokenKeyFile.map { file throws(CanopyError) in try TokenAuthority.key(file: file, value: nil) }
        } catch {
            throw ValidationError(error.message)
        }
    }
}

/// Where canopy-api keeps its store (revoked tokens, people signed out): SQLite in the
/// data directory, or PostgreSQL (`--database-url`) shared by every edge.
struct APIStoreOptions: ParsableArguments {
    @Option(help: ArgumentHelp("Where the store of revoked tokens is (<dir>/api/api.sqlite) without --database-url. Env: CANOPY_DATA_DIR.", valueName: "dir"))
    var dataDir: String = Environment.string("CANOPY_DATA_DIR") ?? "./.canopy"
    @OptionGroup var database: DatabaseOptions

    /// `<data-dir>/api`, where the SQLite store is.
    var directory: URL { URL(fileURLWithPath: dataDir, isDirectory: true).appendingPathComponent(CanopyAPI.directoryName) }

    func open(logger: Logger) async throws -> any APIStoring {
        try await openAPIStore(directory: directory, postgres: try database.postgres(), logger: logger)
    }
}

/// The identity providers whose tokens the API takes besides Canopy's own.
struct IssuerOptions: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "A JSON file of identity providers whose tokens are taken (Sign in with Apple, OpenID Connect): {\"issuers\": [{\"issuer\", \"jwksURL\"?, \"audiences\", \"subjectClaim\"?, \"prefix\"}]}. Env: CANOPY_TRUSTED_ISSUERS_FILE.",
            valueName: "file"))
    var trustedIssuers: String? = Environment.string("CANOPY_TRUSTED_ISSUERS_FILE")
    @Option(
        help: ArgumentHelp(
            "A host the issuers' keys may be fetched from though it is private or loopback (repeatable). Env: CANOPY_JWKS_ALLOW_HOSTS (comma-separated).",
            valueName: "host"))
    var jwksAllowHost: [String] = Environment.string("CANOPY_JWKS_ALLOW_HOSTS")?.split(separator: ",").map(String.init) ?? []

    var allowedHosts: Set<String> { Set(jwksAllowHost.map { $0.lowercased() }) }

    func issuers() throws -> [TrustedIssuer] {
        guard let trustedIssuers else { return [] }
        do {
            return try TrustedIssuer.load(file: trustedIssuers, allowedHosts: allowedHosts)
        } catch {
            throw ValidationError(error.message)
        }
    }
}

struct ServeAPI: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve", abstract: "Serve the HTTP API until SIGTERM or SIGINT.",
        discussion: "Example: canopy-api serve --http 0.0.0.0:8080 --endpoint tcp://127.0.0.1:5555 --token-key-file ./token.key")

    @OptionGroup var common: CommonOptions
    @OptionGroup var operating: OperatingOptions
    @OptionGroup var traces: TraceOptions
    @OptionGroup var token: TokenKeyOptions
    @OptionGroup var issuers: IssuerOptions
    @OptionGroup var store: APIStoreOptions
    @Option(help: ArgumentHelp("Where apps reach the API, HOST:PORT. Env: CANOPY_HTTP.", valueName: "host:port"))
    var http: String = Environment.string("CANOPY_HTTP") ?? "127.0.0.1:8080"
    @Option(help: ArgumentHelp("The largest JSON body taken, in bytes (a photo may have 25 MiB). Env: CANOPY_MAX_BODY_BYTES.", valueName: "bytes"))
    var maxBodyBytes: Int = Environment.int("CANOPY_MAX_BODY_BYTES", default: 1_048_576)
    @Option(help: ArgumentHelp("Requests a second one person may make, on average. Env: CANOPY_RATE_LIMIT.", valueName: "n"))
    var rateLimit: Int = Environment.int("CANOPY_RATE_LIMIT", default: 50)
    @Option(help: ArgumentHelp("Requests one person may make at once, above the rate. Env: CANOPY_RATE_BURST.", valueName: "n"))
    var rateBurst: Int = Environment.int("CANOPY_RATE_BURST", default: 200)
    @Option(
        help: ArgumentHelp(
            "Work units a second one person may spend on photos (an upload: a unit per 8 KiB; an identification: 10 more; docs/operations/api.md, \"Work budget\"). Env: CANOPY_WORK_RATE.",
            valueName: "units"))
    var workRate: Int = Environment.int("CANOPY_WORK_RATE", default: 100)
    @Option(help: ArgumentHelp("Work units one person may spend at once, above the rate. Env: CANOPY_WORK_BURST.", valueName: "units"))
    var workBurst: Int = Environment.int("CANOPY_WORK_BURST", default: 1_000)
    @Option(help: ArgumentHelp("A person's photo uploads (or identifications) working at once. Env: CANOPY_WORK_IN_FLIGHT.", valueName: "n"))
    var workInFlight: Int = Environment.int("CANOPY_WORK_IN_FLIGHT", default: 2)
    @Option(
        help: ArgumentHelp(
            "How long the first variant or next-task lookup waits for others to go out with it as one bus request; 0 sends each alone. Env: CANOPY_BATCH_WINDOW_MS.",
            valueName: "ms"))
    var batchWindowMs: Int = Environment.int("CANOPY_BATCH_WINDOW_MS", default: 2)
    @Option(help: ArgumentHelp("The most lookups in one bus request, 1 to 64. Env: CANOPY_BATCH_KEYS.", valueName: "n"))
    var batchKeys: Int = Environment.int("CANOPY_BATCH_KEYS", default: 64)
    @Option(
        help: ArgumentHelp(
            "How many batches of one kind may be in the air before lookups wait for one to return, 1 to 64. Env: CANOPY_BATCH_IN_FLIGHT.", valueName: "n"))
    var batchInFlight: Int = Environment.int("CANOPY_BATCH_IN_FLIGHT", default: 2)
    @Option(help: ArgumentHelp("How long a connection may sit idle between requests before it is closed. Env: CANOPY_HTTP_IDLE_TIMEOUT_MS.", valueName: "ms"))
    var idleTimeoutMs: Int = Environment.milliseconds("CANOPY_HTTP_IDLE_TIMEOUT_MS", default: APIServiceSettings.defaultIdleTimeout)
    @Option(
        help: ArgumentHelp(
            "How long a connection may send nothing while its request is being read before it is closed. Env: CANOPY_HTTP_READ_TIMEOUT_MS.", valueName: "ms"))
    var readTimeoutMs: Int = Environment.milliseconds("CANOPY_HTTP_READ_TIMEOUT_MS", default: APIServiceSettings.defaultReadTimeout)
    @Option(help: ArgumentHelp("How long one bus call of a request may take, 100 to 600000. Env: CANOPY_CALL_TIMEOUT_MS.", valueName: "ms"))
    var callTimeoutMs: Int = Environment.milliseconds("CANOPY_CALL_TIMEOUT_MS", default: .seconds(10))
    @Option(
        help: ArgumentHelp(
            "How long a request with an Idempotency-Key holds it before a repeat may run it again (its edge presumed dead), 1000 to 600000. Env: CANOPY_IDEMPOTENCY_LEASE_MS.",
            valueName: "ms"))
    var idempotencyLeaseMs: Int = Environment.milliseconds("CANOPY_IDEMPOTENCY_LEASE_MS", default: .seconds(30))

    func validate() throws {
        guard (1_024...(64 * 1_048_576)).contains(maxBodyBytes) else { throw ValidationError("--max-body-bytes is 1024 to 67108864") }
        guard (1...100_000).contains(rateLimit) else { throw ValidationError("--rate-limit is 1 to 100000 requests a second") }
        guard (1...1_000_000).contains(rateBurst) else { throw ValidationError("--rate-burst is 1 to 1000000 requests") }
        guard (1...1_000_000).contains(workRate) else { throw ValidationError("--work-rate is 1 to 1000000 units a second") }
        guard (1...10_000_000).contains(workBurst) else { throw ValidationError("--work-burst is 1 to 10000000 units") }
        guard (1...64).contains(workInFlight) else { throw ValidationError("--work-in-flight is 1 to 64 requests") }
        guard (0...1_000).contains(batchWindowMs) else { throw ValidationError("--batch-window-ms is 0 (off) to 1000 milliseconds") }
        guard (1...64).contains(batchKeys) else { throw ValidationError("--batch-keys is 1 to 64") }
        guard (1...64).contains(batchInFlight) else { throw ValidationError("--batch-in-flight is 1 to 64") }
        guard (100...3_600_000).contains(idleTimeoutMs) else { throw ValidationError("--idle-timeout-ms is 100 to 3600000 milliseconds") }
        guard (100...3_600_000).contains(readTimeoutMs) else { throw ValidationError("--read-timeout-ms is 100 to 3600000 milliseconds") }
        guard (100...600_000).contains(callTimeoutMs) else { throw ValidationError("--call-timeout-ms is 100 to 600000 milliseconds") }
        guard (1_000...600_000).contains(idempotencyLeaseMs) else { throw ValidationError("--idempotency-lease-ms is 1000 to 600000 milliseconds") }
        guard try OperatingOptions.parse(http) != nil else { throw ValidationError("--http is HOST:PORT, such as 0.0.0.0:8080") }
        _ = try token.keys()
        _ = try issuers.issuers()
    }

    func run() async throws {
        let logger = LogSetup.logger(label: "canopy-api", level: common.logLevel)
        guard let address = try OperatingOptions.parse(http) else { throw ValidationError("--http is HOST:PORT, such as 0.0.0.0:8080") }
        var settings = APIServiceSettings(
            http: address, bus: try common.clientConfiguration(), tokenKeys: try token.keys(),
            metrics: try operating.listener(default: OperatingOptions.Defaults.api))
        settings.trustedIssuers = try issuers.issuers()
        settings.jwksAllowedHosts = issuers.allowedHosts
        try checkAPIPorts(settings) // a taken port stops it before the store is made
        let (directory, postgres) = (store.directory, try store.database.postgres(serving: true))
        guard
            let opened = try await buildUnlessStopped(
                logger: logger,
                {
                    try await openAPIStore(directory: directory, postgres: postgres, logger: logger)
                })
        else { return }
        settings.store = opened
        settings.idempotencyLease = .milliseconds(idempotencyLeaseMs)
        settings.callTimeout = .milliseconds(callTimeoutMs)
        settings.maximumBodyBytes = maxBodyBytes
        settings.rateLimit = Double(rateLimit)
        settings.rateBurst = Double(rateBurst)
        settings.workRate = Double(workRate)
        settings.workBurst = Double(workBurst)
        settings.workInFlight = workInFlight
        settings.batchWindow = .milliseconds(batchWindowMs)
        settings.batchKeys = batchKeys
        settings.batchInFlight = batchInFlight
        settings.idleTimeout = .milliseconds(idleTimeoutMs)
        settings.readTimeout = .milliseconds(readTimeoutMs)
        settings.tracing = Traces.isEnabled(traces.environment) ? EdgeSampling(environment: traces.environment) : nil
        try await runUntilShutdown(
            try buildAPIService(settings: settings, context: common.busContext(), logger: logger), traces: traces,
            edgeSampling: settings.tracing, logger: logger)
    }
}

struct TokenCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "token", abstract: "Bearer tokens for operators and demos.",
        discussion: "Example: canopy-api token issue --user user-42 --days 30 --token-key-file ./token.key",
        subcommands: [IssueToken.self, RevokeToken.self])
}

struct IssueToken: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "issue", abstract: "Print a bearer token for a user, signed with the serving key.",
        discussion: "Example: canopy-api token issue --user user-42 --days 30 --token-key-file ./token.key")

    @OptionGroup var token: TokenKeyOptions
    @Option(help: "The user id the token names (1 to 128 printable ASCII characters).") var user: String
    @Option(help: "Days the token is valid, 1 to 365.") var days = 30

    func validate() throws {
        guard (1...365).contains(days) else { throw ValidationError("--days is 1 to 365") }
        do {
            try TokenAuthority.check(user: user)
        } catch {
            throw ValidationError(error.message)
        }
        _ = try token.key()
    }

    func run() async throws {
        let authority = try TokenAuthority(key: try token.key())
        print(try await authority.issue(user: user, lifetime: .seconds(days * 86_400)))
    }
}

struct RevokeToken: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "revoke",
        abstract: "Revoke one token, or every token a person was issued until now (sign out everywhere); every edge refuses them within 0.1 s.",
        discussion: """
            Examples:
              canopy-api token revoke --token eyJhbGciOi… --token-key-file ./token.key
              canopy-api token revoke --jti 6f1c… --data-dir ./.canopy
              canopy-api token revoke --user apple:000123.4f5e… --token-key-file ./.canopy/token.key --data-dir ./.canopy
            """)

    @Option(help: "A token to revoke (Canopy's own, checked with the key; its id and end are read from it).") var token: String?
    @Option(help: "The id (jti) of a token to revoke; kept 400 days (longer than any of Canopy's tokens lives).") var jti: String?
    @Option(help: "A person to sign out everywhere: every token issued to them before now (or --before) is refused.") var user: String?
    @Option(help: "With --user: sign out tokens issued before this time (ISO 8601) instead of now.") var before: String?
    @OptionGroup var keys: TokenKeyOptions
    @OptionGroup var store: APIStoreOptions

    func validate() throws {
        guard [token != nil, jti != nil, user != nil].filter({ $0 }).count == 1 else {
            throw ValidationError("give one of --token TOKEN, --jti ID or --user ID")
        }
        if let jti, jti.isEmpty || jti.utf8.count > 256 { throw ValidationError("--jti is 1 to 256 bytes") }
        if let user {
            do { try TokenAuthority.check(user: user) } catch { throw ValidationError(error.message) }
        }
        if let before, (try? Date(before, strategy: .iso8601)) == nil { throw ValidationError("--before is ISO 8601, such as 2026-11-26T10:00:00Z") }
        if before != nil && user == nil { throw ValidationError("--before goes with --user") }
    }

    func run() async throws {
        let logger = LogSetup.logger(label: "canopy-api", level: .error)
        let revocations = try await store.open(logger: logger)
        if let user {
            let at = try before.map { try Date($0, strategy: .iso8601) } ?? Date()
            for digest in SignOutDigest(tokenKeys: try keys.keys()).candidates(user) { try revocations.signOut(digest: digest, before: at, erasure: false) }
            print("signed \(user) out everywhere: tokens issued before \(at.formatted(.iso8601)) are refused")
        } else if let jti {
            try revocations.revoke(id: jti, until: Date().addingTimeInterval(400 * 86_400))
            print("revoked token \(jti)")
        } else if let token {
            let authority = try TokenAuthority(keys: try keys.keys())
            guard let identity = await authority.identity(of: token) else {
                throw CommandFailure(
                    "the token is not one of Canopy's valid ones (forged, expired, or signed with another key); revoke by --jti, or sign the person out with --user"
                )
            }
            guard let id = identity.id else {
                throw CommandFailure("the token has no id (issued before tokens had one); sign \(identity.user) out with --user \(identity.user)")
            }
            try revocations.revoke(id: id, until: identity.expires)
            print("revoked token \(id) of \(identity.user) (it would have ended \(identity.expires.formatted(.iso8601)))")
        }
    }
}
