import CanopyMessages
import CanopyOutbound
import Crypto
import Foundation
import JWTKit
import Synchronization

/// The bearer tokens apps present, and whom each names:
///
/// - **Canopy's own** (`iss: canopy`): HS256 JWTs signed by a key only canopy-api holds
///   (`canopy-api token issue`: the demo, tests, operators). Several keys may be given: the
///   first signs (its `kid`, a hash of the key, goes in the header), every one verifies, so a
///   key is rotated by putting a new one first and removing the old once its tokens ended.
/// - **Trusted issuers'** (``TrustedIssuer``): Sign in with Apple's identity tokens or any
///   OpenID Connect provider's, RS256, ES256 or EdDSA, verified against the provider's
///   published keys (``IssuerKeys``); the person is `PREFIX:SUBJECT`.
///
/// The algorithm is always the key's: a token whose header names another (an RS256 key's
/// public half offered as an HS256 secret) is refused. `exp`, `nbf` and `iat` are checked
/// with ``leeway``; `iss` and `aud` exactly. No key and no token is ever logged.
///
/// Thread-safety: an actor (jwt-kit's key collections are too); a token verified lately is
/// answered from a cache under one lock.
public actor TokenAuthority {
    private let keys = JWTKeyCollection()
    private var added = false
    private let signing: [(kid: String, key: HMACKey)]
    private let issuers: [String: IssuerKeys]
    /// How far `exp`, `nbf` and `iat` may be off (clocks differ).
    public let leeway: TimeInterval
    /// What is revoked, checked on every request (a revoked token is refused at once, also
    /// one verified before).
    private nonisolated let revocations: RevocationWatcher?
    /// How sign-outs name people (a keyed digest of their id, under these keys).
    public nonisolated let signOuts: SignOutDigest

    /// The most a user id may be: printable ASCII (the bus compares principals as bytes).
    public static let maximumUserBytes = 128
    /// The shortest signing key taken.
    public static let minimumKeyBytes = 32
    /// The longest token read.
    static let maximumTokenBytes = 8_192

    struct Claims: JWTPayload {
        var sub: SubjectClaim
        var exp: ExpirationClaim
        var iat: IssuedAtClaim
        var iss: IssuerClaim
        var jti: IDClaim?

        func verify(using algorithm: some JWTAlgorithm) async throws {
            try exp.verifyNotExpired()
            guard iss.value == TokenAuthority.issuer else { throw JWTError.claimVerificationFailure(failedClaim: iss, reason: "not Canopy's") }
        }
    }

    /// A trusted issuer's claims that every token has; the rest (the subject claim) is read
    /// from the same verified payload. Times are checked by the authority, with leeway.
    struct IssuerClaims: JWTPayload {
        var iss: IssuerClaim
        var aud: AudienceClaim
        var exp: ExpirationClaim
        var nbf: NotBeforeClaim?
        var iat: IssuedAtClaim?

        func verify(using algorithm: some JWTAlgorithm) async throws {}
    }

    static let issuer = "canopy"

    /// - Parameter key: at least 32 bytes, random.
    public init(key: [UInt8]) throws(CanopyError) {
        try self.init(keys: [key])
    }

    /// - Parameters:
    ///   - keys: Canopy's own signing keys, the newest first (it signs); each at least 32 bytes.
    ///   - issuers: the identity providers whose tokens are taken too.
    ///   - http: how their keys are fetched (the address policy every outbound fetch has).
    ///   - minimumRefresh: a token naming an unknown key refreshes an issuer's keys at most
    ///     once in this.
    ///   - leeway: how far `exp`, `nbf` and `iat` may be off.
    ///   - revocations: tokens revoked and people signed out (`canopy-api token revoke`).
    public init(
        keys: [[UInt8]], issuers: [TrustedIssuer] = [], http: PinnedHTTP? = nil, minimumRefresh: Duration = .seconds(60),
        leeway: TimeInterval = 60, revocations: RevocationWatcher? = nil
    ) throws(CanopyError) {
        self.revocations = revocations
        guard !keys.isEmpty else { throw CanopyError(.badRequest, "canopy-api needs at least one token signing key") }
        for key in keys where key.count < Self.minimumKeyBytes {
            throw CanopyError(.badRequest, "the token signing key has \(key.count) bytes; give at least \(Self.minimumKeyBytes) random bytes")
        }
        signing = keys.map { (Self.keyID($0), HMACKey(from: $0)) }
        signOuts = SignOutDigest(tokenKeys: keys)
        if !issuers.isEmpty && http == nil { throw CanopyError(.badRequest, "trusted issuers need an HTTP client for their keys") }
        try TrustedIssuer.validate(issuers, allowedHosts: http?.settings.allowedHosts ?? [])
        var byIssuer: [String: IssuerKeys] = [:]
        for issuer in issuers { byIssuer[issuer.issuer] = IssuerKeys(issuer: issuer, http: http!, minimumRefresh: minimumRefresh) }
        self.issuers = byIssuer
        self.leeway = leeway
    }

    /// A key's id: the first 8 bytes of its SHA-256, hex (names the key, reveals nothing).
    static func keyID(_ key: [UInt8]) -> String {
        SHA256.hash(data: key).prefix(8).map { String(format: "%02x", $0) }.joined()
    }

    /// Fetches every trusted issuer's keys (at start; a provider that cannot be reached is
    /// tried again when a token of it comes). Returns the issuers whose fetch failed, with why.
    public func loadIssuerKeys() async -> [(issuer: String, error: String)] {
        var failed: [(String, String)] = []
        for (name, keys) in issuers {
            await keys.load()
            if let error = await keys.lastError { failed.append((name, error)) }
        }
        return failed
    }

    /// How many times `issuer`'s keys were fetched (for tests and metrics).
    public func keyFetches(_ issuer: String) async -> Int {
        await issuers[issuer]?.fetches ?? 0
    }

    /// The key from a file (its bytes, a trailing newline dropped) or from a variable's
    /// value; a sentence saying what to fix when neither gives one.
    public static func key(file: String?, value: String?) throws(CanopyError) -> [UInt8] {
        if let file {
            guard var bytes = FileManager.default.contents(atPath: file).map({ [UInt8]($0) }) else {
                throw CanopyError(.badRequest, "the token key file \(file) cannot be read")
            }
            while bytes.last == 0x0A || bytes.last == 0x0D { bytes.removeLast() }
            return bytes
        }
        if let value, !value.isEmpty { return Array(value.utf8) }
        throw CanopyError(
            .badRequest,
            "canopy-api needs a token signing key: --token-key-file FILE or CANOPY_TOKEN_KEY (32 bytes or more, random; `openssl rand -base64 48` makes one)")
    }

    private func ready() async {
        guard !added else { return }
        for (index, entry) in signing.enumerated() {
            await keys.add(hmac: entry.key, digestAlgorithm: .sha256, kid: JWKIdentifier(string: entry.kid))
            if index == 0 { await keys.add(hmac: entry.key, digestAlgorithm: .sha256) } // the default: tokens from before kids
        }
        added = true
    }

    /// A token for `user`, valid for `lifetime`, signed with the newest key.
    public func issue(user: String, lifetime: Duration, now: Date = Date()) async throws -> String {
        try Self.check(user: user)
        await ready()
        // Whole seconds, as JWT libraries expect of NumericDates.
        let issued = Date(timeIntervalSince1970: now.timeIntervalSince1970.rounded(.down))
        let claims = Claims(
            sub: SubjectClaim(value: user), exp: ExpirationClaim(value: issued.addingTimeInterval(Double(lifetime.components.seconds))),
            iat: IssuedAtClaim(value: issued), iss: IssuerClaim(value: Self.issuer),
            jti: IDClaim(value: (0..<16).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()))
        return try await keys.sign(claims, kid: JWKIdentifier(string: signing[0].kid))
    }

    /// Tokens verified lately and whom they name, until they end: an app sends the same
    /// token with every request, and checking its signature each time was work done again.
    /// Only verified tokens are kept, at most ``verifiedCapacity``. Read without a hop to the
    /// actor: a known token costs one lock.
    private nonisolated let verified = Mutex<[String: Verified]>([:])
    static let verifiedCapacity = 10_000

    private struct Verified {
        let user: String
        let expires: Date
        /// Its `jti` and `iat`, and the user's sign-out digests, for the revocations.
        let id: String?
        let issuedAt: Date?
        let signOutDigests: [String]
    }

    /// What a verified token says: whom it names, until when, and what revocations look at.
    struct Identity {
        let user: String
        let expires: Date
        let id: String?
        let issuedAt: Date?
    }

    /// The user a token names (`PREFIX:SUBJECT` for a trusted issuer's); `nil` when it is
    /// forged, expired, not yet valid, for another audience, or from an issuer not trusted.
    public nonisolated func user(of token: String, now: Date = Date()) async -> String? {
        let known = verified.withLock { cache -> Verified?? in
            guard let known = cache[token] else { return .none } // not seen: verify it
            if now < known.expires { return .some(known) }
            cache[token] = nil
            return .some(nil)
        }
        if let known {
            guard let known, revocations?.revokes(id: known.id, signedOutAs: known.signOutDigests, issuedAt: known.issuedAt) != true else { return nil }
            return known.user
        }
        guard let identity = await verify(token, now: now) else { return nil }
        let digests = signOuts.candidates(identity.user)
        verified.withLock { cache in
            if cache.count >= Self.verifiedCapacity {
                cache = cache.filter { now < $0.value.expires } // the ended go; if none had, all go
                if cache.count >= Self.verifiedCapacity { cache.removeAll(keepingCapacity: true) }
            }
            cache[token] = Verified(user: identity.user, expires: identity.expires, id: identity.id, issuedAt: identity.issuedAt, signOutDigests: digests)
        }
        guard revocations?.revokes(id: identity.id, signedOutAs: digests, issuedAt: identity.issuedAt) != true else { return nil }
        return identity.user
    }

    /// A token's id and end, verified with the keys (for `canopy-api token revoke --token`).
    public func identity(of token: String, now: Date = Date()) async -> (user: String, id: String?, expires: Date)? {
        guard let identity = await verify(token, now: now) else { return nil }
        return (identity.user, identity.id, identity.expires)
    }

    /// Checks a token's signature and claims: whom it names and until when.
    private func verify(_ token: String, now: Date) async -> Identity? {
        guard token.utf8.count <= Self.maximumTokenBytes, let parts = UnverifiedToken(token) else { return nil }
        if parts.issuer == Self.issuer {
            return await verifyOwn(token, parts: parts, now: now)
        }
        guard let issuer = parts.issuer, let keys = issuers[issuer] else { return nil }
        return await verifyIssued(token, parts: parts, by: keys, now: now)
    }

    /// One of Canopy's own: HS256 under one of the keys.
    private func verifyOwn(_ token: String, parts: UnverifiedToken, now: Date) async -> Identity? {
        guard parts.algorithm == "HS256" else { return nil }
        await ready()
        if let kid = parts.keyID, !signing.contains(where: { $0.kid == kid }) { return nil } // a removed key's token
        // A token from before kids is tried under each key.
        guard let claims = try? await keys.verify(token, as: Claims.self, iteratingKeys: parts.keyID == nil) else { return nil }
        guard (try? Self.check(user: claims.sub.value)) != nil, now < claims.exp.value else { return nil }
        return Identity(user: claims.sub.value, expires: claims.exp.value, id: claims.jti?.value, issuedAt: claims.iat.value)
    }

    /// A trusted issuer's: its key by `kid`, that key's algorithm, then `iss`, `aud`, the times.
    private func verifyIssued(_ token: String, parts: UnverifiedToken, by issuerKeys: IssuerKeys, now: Date) async -> Identity? {
        guard let kid = parts.keyID, let key = await issuerKeys.key(kid), parts.algorithm == key.algorithm,
            let claims = try? await key.collection.verify(token, as: IssuerClaims.self)
        else { return nil }
        let issuer = issuerKeys.issuer
        guard claims.iss.value == issuer.issuer, claims.aud.value.contains(where: { issuer.audiences.contains($0) }) else { return nil }
        guard now.timeIntervalSince(claims.exp.value) < leeway else { return nil }
        if let nbf = claims.nbf, nbf.value.timeIntervalSince(now) > leeway { return nil }
        if let iat = claims.iat, iat.value.timeIntervalSince(now) > leeway { return nil }
        guard let subject = parts.payload[issuer.subject] as? String, !subject.isEmpty else { return nil }
        let user = issuer.prefix + ":" + subject
        guard (try? Self.check(user: user)) != nil else { return nil }
        return Identity(user: user, expires: claims.exp.value.addingTimeInterval(leeway), id: parts.payload["jti"] as? String, issuedAt: claims.iat?.value)
    }

    /// A user id is 1 to 128 printable ASCII characters without spaces.
    public static func check(user: String) throws(CanopyError) {
        guard !user.isEmpty, user.utf8.count <= maximumUserBytes, user.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
            throw CanopyError(.badRequest, "a user id is 1 to \(maximumUserBytes) printable ASCII characters without spaces")
        }
    }
}

/// A token's header and payload read before its signature is checked: only to choose how to
/// check it (the issuer, the key, the algorithm the header claims, which must be the key's).
struct UnverifiedToken {
    let header: [String: Any]
    let payload: [String: Any]

    init?(_ token: String) {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let header = Self.object(parts[0]), let payload = Self.object(parts[1]) else { return nil }
        self.header = header
        self.payload = payload
    }

    var issuer: String? { payload["iss"] as? String }
    var keyID: String? { header["kid"] as? String }
    var algorithm: String? { header["alg"] as? String }

    private static func object(_ part: Substring) -> [String: Any]? {
        var text = part.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while text.count % 4 != 0 { text += "=" }
        guard let data = Data(base64Encoded: text) else { return nil }
        return (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
    }
}
