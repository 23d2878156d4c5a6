import CanopyMessages
import Foundation
import Synchronization
import JWTKit

/// The bearer tokens apps present: JWTs signed with HS256 by a key only canopy-batch holds,
/// naming the user (`sub`) and when the token ends (`exp`). The key comes from configuration
/// or a file; it is never built in, and neither it nor a token is ever logged.
///
/// Thread-safety: an actor (jwt-kit's key collection is one).
public actor TokenAuthority {
    private let keys = JWTKeyCollection()
    private var added = false
    private let key: HMACKey

    /// The most a user id may be: printable ASCII (the bus compares principals as bytes).
    public static let maximumUserBytes = 128
    /// The shortest signing key taken.
    public static let minimumKeyBytes = 32

    struct Claims: JWTPayload {
        var sub: SubjectClaim
        var exp: ExpirationClaim
        var iat: IssuedAtClaim
        var iss: IssuerClaim

        func verify(using algorithm: some JWTAlgorithm) async throws {
            try exp.verifyNotExpired()
            guard iss.value == TokenAuthority.issuer else { throw JWTError.claimVerificationFailure(failedClaim: iss, reason: "not Canopy's") }
        }
    }

    static let issuer = "canopy"

    /// - Parameter key: at least 32 bytes, random.
    public init(key: [UInt8]) throws(CanopyError) {
        guard key.count >= Self.minimumKeyBytes else {
            throw CanopyError(.badRequest, "the token signing key has \(key.count) bytes; give at least \(Self.minimumKeyBytes) random bytes")
        }
        self.key = HMACKey(from: key)
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
        throw CanopyError(.badRequest, "canopy-batch needs a token signing key: --token-key-file FILE or CANOPY_TOKEN_KEY (32 bytes or more, random; `openssl rand -base64 48` makes one)")
    }

    private func ready() async {
        guard !added else { return }
        await keys.add(hmac: key, digestAlgorithm: .sha256)
        added = true
    }

    /// A token for `user`, valid for `lifetime`.
    public func issue(user: String, lifetime: Duration, now: Date = Date()) async throws -> String {
        try Self.check(user: user)
        await ready()
        // Whole seconds, as JWT libraries expect of NumericDates.
        let issued = Date(timeIntervalSince1970: now.timeIntervalSince1970.rounded(.down))
        let claims = Claims(sub: SubjectClaim(value: user), exp: ExpirationClaim(value: issued.addingTimeInterval(Double(lifetime.components.seconds))),
                            iat: IssuedAtClaim(value: issued), iss: IssuerClaim(value: Self.issuer))
        return try await keys.sign(claims)
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
    }

    /// The user a token names; `nil` when it is forged, expired, or not one of ours.
    public nonisolated func user(of token: String, now: Date = Date()) async -> String? {
        let known = verified.withLock { cache -> String?? in
            guard let known = cache[token] else { return .none } // not seen: verify it
            if now < known.expires { return .some(known.user) }
            cache[token] = nil
            return .some(nil)
        }
        if let known { return known }
        return await verify(token, now: now)
    }

    /// Checks a token's signature and claims, and remembers it when it holds.
    private func verify(_ token: String, now: Date) async -> String? {
        await ready()
        guard token.utf8.count <= 4_096, let claims = try? await keys.verify(token, as: Claims.self) else { return nil }
        guard (try? Self.check(user: claims.sub.value)) != nil, now < claims.exp.value else { return nil }
        verified.withLock { cache in
            if cache.count >= Self.verifiedCapacity {
                cache = cache.filter { now < $0.value.expires } // the ended go; if none had, all go
                if cache.count >= Self.verifiedCapacity { cache.removeAll(keepingCapacity: true) }
            }
            cache[token] = Verified(user: claims.sub.value, expires: claims.exp.value)
        }
        return claims.sub.value
    }

    /// A user id is 1 to 128 printable ASCII characters without spaces.
    public static func check(user: String) throws(CanopyError) {
        guard !user.isEmpty, user.utf8.count <= maximumUserBytes, user.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
            throw CanopyError(.badRequest, "a user id is 1 to \(maximumUserBytes) printable ASCII characters without spaces")
        }
    }
}
