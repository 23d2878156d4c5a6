import CanopyMessages
import CanopyOutbound
import Foundation
import JWTKit
import NIOHTTP1

/// An identity provider whose tokens the edge takes (`--trusted-issuers FILE`): Sign in with
/// Apple, or any OpenID Connect provider (Auth0, Cognito, Keycloak, Firebase, Google). Its
/// tokens are verified against the keys it publishes (a JWKS), and name a person as
/// `PREFIX:SUBJECT`, so two providers' subjects never meet.
public struct TrustedIssuer: Codable, Sendable, Equatable {
    /// The `iss` its tokens carry, exactly: `https://appleid.apple.com`.
    public var issuer: String
    /// Where its keys are; without it they are found by discovery
    /// (`ISSUER/.well-known/openid-configuration`, its `jwks_uri`).
    public var jwksURL: String?
    /// The `aud` values taken (the app's bundle id for Apple, a client id or API identifier
    /// elsewhere): a token must name one of them.
    public var audiences: [String]
    /// The claim that names the person (`sub` unless said).
    public var subjectClaim: String?
    /// Put before the subject, with a colon: `apple` makes `apple:000123.abc…`.
    public var prefix: String

    public init(issuer: String, jwksURL: String? = nil, audiences: [String], subjectClaim: String? = nil, prefix: String) {
        self.issuer = issuer
        self.jwksURL = jwksURL
        self.audiences = audiences
        self.subjectClaim = subjectClaim
        self.prefix = prefix
    }

    /// The file's shape: `{"issuers": [{"issuer", "jwksURL"?, "audiences", "subjectClaim"?, "prefix"}]}`.
    struct File: Codable {
        var issuers: [TrustedIssuer]
    }

    /// The issuers a file names, checked; a sentence saying what to fix otherwise.
    public static func load(file: String, allowedHosts: Set<String> = []) throws(CanopyError) -> [TrustedIssuer] {
        guard let data = FileManager.default.contents(atPath: file) else {
            throw CanopyError(.badRequest, "cannot read the trusted issuers file \(file)")
        }
        guard data.count <= 1 << 20 else { throw CanopyError(.tooLarge, "the trusted issuers file \(file) is over 1 MiB") }
        let issuers: [TrustedIssuer]
        do {
            issuers = try JSONDecoder().decode(File.self, from: data).issuers
        } catch {
            throw CanopyError(
                .badRequest,
                "\(file) is not a trusted issuers file: {\"issuers\": [{\"issuer\", \"jwksURL\"?, \"audiences\", \"subjectClaim\"?, \"prefix\"}]} (\(error))")
        }
        try validate(issuers, allowedHosts: allowedHosts)
        return issuers
    }

    /// Every issuer well-formed, with a prefix of its own.
    public static func validate(_ issuers: [TrustedIssuer], allowedHosts: Set<String> = []) throws(CanopyError) {
        guard issuers.count <= 32 else { throw CanopyError(.badRequest, "at most 32 trusted issuers") }
        var prefixes = Set<String>()
        for issuer in issuers {
            try issuer.validate(allowedHosts: allowedHosts)
            guard prefixes.insert(issuer.prefix).inserted else {
                throw CanopyError(.badRequest, "two trusted issuers have the prefix '\(issuer.prefix)'; give each its own, so their people never meet")
            }
        }
    }

    func validate(allowedHosts: Set<String>) throws(CanopyError) {
        try Self.checkURL(issuer, what: "issuer", allowedHosts: allowedHosts)
        if let jwksURL { try Self.checkURL(jwksURL, what: "jwksURL", allowedHosts: allowedHosts) }
        guard !audiences.isEmpty, audiences.count <= 16, audiences.allSatisfy({ !$0.isEmpty && $0.utf8.count <= 256 }) else {
            throw CanopyError(.badRequest, "\(issuer): audiences names 1 to 16 values (the app's bundle id, a client id), each 1 to 256 bytes")
        }
        let claim = subjectClaim ?? "sub"
        guard !claim.isEmpty, claim.utf8.count <= 64 else { throw CanopyError(.badRequest, "\(issuer): subjectClaim is 1 to 64 bytes") }
        let bytes = Array(prefix.utf8)
        guard (1...32).contains(bytes.count), prefix != TokenAuthority.issuer,
            bytes.allSatisfy({ (0x61...0x7A).contains($0) || (0x30...0x39).contains($0) || $0 == UInt8(ascii: "-") })
        else {
            throw CanopyError(.badRequest, "\(issuer): prefix is 1 to 32 of a-z, 0-9 and '-' (not 'canopy'), such as apple or auth0")
        }
    }

    /// An https URL, or http to a host the operator allowed (a provider on this machine).
    static func checkURL(_ text: String, what: String, allowedHosts: Set<String>) throws(CanopyError) {
        guard text.utf8.count <= 2_048, let url = URL(string: text), let scheme = url.scheme?.lowercased(), let host = url.host?.lowercased(),
            scheme == "https" || (scheme == "http" && allowedHosts.contains(host))
        else {
            throw CanopyError(.badRequest, "\(what) \(text.prefix(200)) is not an https URL (http only to a host allowed with --jwks-allow-host)")
        }
    }

    /// The subject claim's name.
    var subject: String { subjectClaim ?? "sub" }
}

/// One issuer's keys, fetched and kept: at start, again when its cache headers say they are
/// old, and when a token names a key not yet known, at most once per ``minimumRefresh``
/// (random `kid`s cannot make the edge hammer the provider). A failed fetch keeps the last
/// good set. Each key verifies only with the algorithm it is for (its `alg`, or its type's),
/// never with the one a token's header names.
actor IssuerKeys {
    struct Key {
        /// The algorithm the key is for: a token whose header names another is refused.
        let algorithm: String
        /// A collection holding this key alone (jwt-kit picks no other).
        let collection: JWTKeyCollection
    }

    let issuer: TrustedIssuer
    private let http: PinnedHTTP
    private let minimumRefresh: Duration
    private var keys: [String: Key] = [:]
    private var freshUntil: Date?
    private var lastAttempt: ContinuousClock.Instant?
    /// The last fetch a token naming an unknown key made.
    private var lastUnknownRefresh: ContinuousClock.Instant?
    private var refreshing: Task<Void, Never>?
    /// Fetches of the key set made (for the metrics and the tests).
    private(set) var fetches = 0
    /// The last fetch's failure, if it failed.
    private(set) var lastError: String?

    /// The largest discovery document or key set read.
    static let maximumBytes = 256 * 1024
    /// How long a key set is kept without cache headers, and the bounds put on theirs.
    static let defaultFreshness: TimeInterval = 3_600
    static let freshness: ClosedRange<TimeInterval> = 60...86_400

    init(issuer: TrustedIssuer, http: PinnedHTTP, minimumRefresh: Duration) {
        self.issuer = issuer
        self.http = http
        self.minimumRefresh = minimumRefresh
    }

    /// The key `kid` names: from the set kept, or after a refresh when the set is old or
    /// does not know it (and one may be made now); nil when there is none.
    func key(_ kid: String) async -> Key? {
        let stale = freshUntil.map { Date() >= $0 } ?? true
        if let known = keys[kid], !stale { return known }
        let now = ContinuousClock.now
        if keys[kid] == nil {
            // A key not yet known: once per interval (random kids cannot make it more).
            if lastUnknownRefresh.map({ now - $0 >= minimumRefresh }) ?? true {
                lastUnknownRefresh = now
                await refresh()
            }
        } else if lastAttempt.map({ now - $0 >= minimumRefresh }) ?? true {
            await refresh() // known but old: fetched again (a provider that is down is asked once an interval)
        }
        return keys[kid]
    }

    /// Fetches the set once now (at start): a failure is remembered, not thrown.
    func load() async {
        await refresh()
    }

    /// One fetch at a time; callers that come meanwhile wait for it.
    private func refresh() async {
        if let refreshing { return await refreshing.value }
        lastAttempt = .now
        let task = Task { await self.fetch() }
        refreshing = task
        await task.value
        refreshing = nil
    }

    private func fetch() async {
        fetches += 1
        do {
            let (set, maxAge) = try await download()
            var fresh: [String: Key] = [:]
            for jwk in set.keys {
                guard let kid = jwk.keyIdentifier?.string, let algorithm = Self.algorithm(of: jwk), jwk.privateExponent == nil else { continue }
                let collection = JWTKeyCollection()
                do { try await collection.add(jwk: jwk) } catch { continue } // a key this build cannot use
                fresh[kid] = Key(algorithm: algorithm, collection: collection)
            }
            guard !fresh.isEmpty else { throw CanopyError(.badRequest, "the key set has no key this edge can use (RS256, ES256 or EdDSA, each with a kid)") }
            keys = fresh
            freshUntil = Date().addingTimeInterval(min(max(maxAge ?? Self.defaultFreshness, Self.freshness.lowerBound), Self.freshness.upperBound))
            lastError = nil
        } catch {
            lastError = "\(error)" // the last good set stays
        }
    }

    /// The algorithm a key is for: its `alg` when it names one this edge takes, else its
    /// type's (RSA: RS256, EC P-256: ES256, OKP Ed25519: EdDSA); nil for any other.
    static func algorithm(of jwk: JWK) -> String? {
        let taken: Set<String> = ["RS256", "ES256", "EdDSA"]
        if let named = jwk.algorithm?.rawValue { return taken.contains(named) ? named : nil }
        switch jwk.keyType.rawValue {
        case "RSA": return "RS256"
        case "EC": return jwk.curve?.rawValue == "P-256" ? "ES256" : nil
        case "OKP": return jwk.curve?.rawValue == "Ed25519" ? "EdDSA" : nil
        default: return nil
        }
    }

    /// The key set, through discovery when no `jwksURL` was given, and its `max-age`.
    private func download() async throws -> (JWKS, TimeInterval?) {
        var location = issuer.jwksURL
        if location == nil {
            let base = issuer.issuer.hasSuffix("/") ? String(issuer.issuer.dropLast()) : issuer.issuer
            let (body, _) = try await get(base + "/.well-known/openid-configuration")
            struct Discovery: Decodable {
                var issuer: String
                var jwks_uri: String
            }
            let discovery = try JSONDecoder().decode(Discovery.self, from: Data(body))
            guard discovery.issuer == issuer.issuer else {
                throw CanopyError(.badRequest, "the discovery document names the issuer \(discovery.issuer.prefix(200)), not \(issuer.issuer)")
            }
            try TrustedIssuer.checkURL(discovery.jwks_uri, what: "jwks_uri", allowedHosts: http.settings.allowedHosts)
            location = discovery.jwks_uri
        }
        let (body, headers) = try await get(location!)
        return (try JSONDecoder().decode(JWKS.self, from: Data(body)), Self.maxAge(headers))
    }

    private func get(_ url: String) async throws -> ([UInt8], HTTPHeaders) {
        let response = try await http.send(PinnedHTTP.Request(url: url, headers: ["Accept": "application/json"]))
        guard response.status == .ok else { throw CanopyError(.internal, "\(url) answered \(response.status.code)") }
        return (response.body, response.headers)
    }

    /// `Cache-Control: max-age=N` in seconds, if the answer has one.
    static func maxAge(_ headers: HTTPHeaders) -> TimeInterval? {
        for value in headers["Cache-Control"] {
            for directive in value.split(separator: ",") {
                let parts = directive.trimmingCharacters(in: .whitespaces).split(separator: "=", maxSplits: 1)
                if parts.count == 2, parts[0].lowercased() == "max-age", let seconds = Double(parts[1]) { return seconds }
            }
        }
        return nil
    }
}
