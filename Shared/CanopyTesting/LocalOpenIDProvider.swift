import Crypto
import Foundation
import Hummingbird
import JWTKit
import NIOCore
import Synchronization

// A test peer (an identity provider is outside this machine): for the tests and the benchmark.

/// An OpenID provider written from the specifications (OpenID Connect Discovery 1.0, RFC 7517
/// JWKS, RFC 7519 tokens), on 127.0.0.1: a discovery document, a key set served with
/// `Cache-Control: max-age`, tokens it signs with RS256, ES256 and EdDSA, keys it rotates, and
/// a switch that makes it go away (every answer 503).
public final class LocalOpenIDProvider: Sendable {
    private struct State {
        var port: Int?
        /// The public keys published, as JWK objects.
        var published: [[String: String]] = []
        var keySetFetches = 0
        var available = true
        var maxAge = 3_600
    }

    private final class Shared: Sendable {
        private let mutex = Mutex(State())
        func withLock<T>(_ body: (inout State) -> T) -> T { mutex.withLock { body(&$0) } }
    }

    private let state = Shared()
    /// The private keys, by kid.
    public let signers = JWTKeyCollection()
    public let application: Application<RouterResponder<BasicRequestContext>>

    public init() {
        let router = Router()
        let state = self.state
        router.get("/.well-known/openid-configuration") { _, _ -> Response in
            let (port, available) = state.withLock { ($0.port ?? 0, $0.available) }
            guard available else { return Response(status: .serviceUnavailable) }
            let issuer = "http://127.0.0.1:\(port)"
            let body = #"{"issuer":"\#(issuer)","jwks_uri":"\#(issuer)/keys","id_token_signing_alg_values_supported":["RS256","ES256","EdDSA"]}"#
            return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: body)))
        }
        router.get("/keys") { _, _ -> Response in
            let (keys, available, maxAge) = state.withLock { state in
                state.keySetFetches += 1
                return (state.published, state.available, state.maxAge)
            }
            guard available else { return Response(status: .serviceUnavailable) }
            let body = try JSONSerialization.data(withJSONObject: ["keys": keys])
            return Response(
                status: .ok, headers: [.contentType: "application/json", .cacheControl: "public, max-age=\(maxAge)"],
                body: .init(byteBuffer: ByteBuffer(bytes: body)))
        }
        application = Application(
            router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0), serverName: "local-openid"),
            onServerRunning: { channel in state.withLock { $0.port = channel.localAddress?.port } })
    }

    /// The issuer, once the server listens: `http://127.0.0.1:PORT` (within 90 s: amid the whole
    /// suite a 2-core machine has starved a server's start for over 30).
    public func issuer() async throws -> String {
        guard try await eventually(within: .seconds(90), { self.state.withLock { $0.port } != nil }) else {
            throw LiveBusError("the local OpenID provider did not start listening within 90 s")
        }
        return "http://127.0.0.1:\(state.withLock { $0.port! })"
    }

    public var keySetFetches: Int { state.withLock { $0.keySetFetches } }
    public func goAway() { state.withLock { $0.available = false } }
    public func comeBack() { state.withLock { $0.available = true } }

    /// Its usual keys: `rsa-1` (RS256), `ec-1` (ES256, published without an `alg`), `ed-1` (EdDSA).
    public func addUsualKeys() async throws {
        try await addRSA(TestRSAKeys.key1, kid: "rsa-1")
        try await addEC(kid: "ec-1")
        try await addEdDSA(kid: "ed-1")
    }

    /// Makes an RSA key from PEM its signing key `kid`, and publishes its public half.
    public func addRSA(_ pem: String, kid: String) async throws {
        let key = try Insecure.RSA.PrivateKey(pem: pem)
        await signers.add(rsa: key, digestAlgorithm: .sha256, kid: JWKIdentifier(string: kid))
        let (modulus, exponent) = try key.publicKey.getKeyPrimitives()
        publish(["kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256", "n": Self.base64URL(modulus), "e": Self.base64URL(exponent)])
    }

    /// A new P-256 key, signing as `kid`; published without an `alg` (its type says ES256).
    public func addEC(kid: String) async throws {
        let key = ES256PrivateKey()
        await signers.add(ecdsa: key, kid: JWKIdentifier(string: kid))
        guard let parameters = key.parameters else { throw CancellationError() }
        publish(["kty": "EC", "kid": kid, "crv": "P-256", "x": parameters.x, "y": parameters.y])
    }

    /// A new Ed25519 key, signing as `kid`.
    public func addEdDSA(kid: String) async throws {
        let backing = Curve25519.Signing.PrivateKey()
        await signers.add(eddsa: EdDSA.PrivateKey(backing: backing), kid: JWKIdentifier(string: kid))
        publish(["kty": "OKP", "kid": kid, "crv": "Ed25519", "alg": "EdDSA", "x": Self.base64URL(backing.publicKey.rawRepresentation)])
    }

    public func publish(_ jwk: [String: String]) { state.withLock { $0.published.append(jwk) } }
    public func withdraw(_ kid: String) { state.withLock { $0.published.removeAll { $0["kid"] == kid } } }
    public var published: [[String: String]] { state.withLock { $0.published } }

    /// The claims of the tokens it signs. `verify` checks nothing: checking a token is the job of
    /// the code under test.
    public struct Claims: JWTPayload {
        public var iss: IssuerClaim
        public var sub: SubjectClaim
        public var aud: AudienceClaim
        public var exp: ExpirationClaim
        public var iat: IssuedAtClaim
        public var nbf: NotBeforeClaim?
        public var email: String?

        public init(
            iss: IssuerClaim, sub: SubjectClaim, aud: AudienceClaim, exp: ExpirationClaim, iat: IssuedAtClaim, nbf: NotBeforeClaim? = nil,
            email: String? = nil
        ) {
            self.iss = iss
            self.sub = sub
            self.aud = aud
            self.exp = exp
            self.iat = iat
            self.nbf = nbf
            self.email = email
        }

        public func verify(using algorithm: some JWTAlgorithm) async throws {}
    }

    /// A token signed with key `kid`.
    public func token(
        kid: String, issuer: String? = nil, subject: String = "000123.a1b2c3", audience: String = "org.canopy.app",
        expires: TimeInterval = 600, notBefore: TimeInterval? = nil
    ) async throws -> String {
        let now = Date()
        let issuer = if let issuer { issuer } else { try await self.issuer() }
        let claims = Claims(
            iss: IssuerClaim(value: issuer), sub: SubjectClaim(value: subject), aud: AudienceClaim(value: audience),
            exp: ExpirationClaim(value: now.addingTimeInterval(expires)), iat: IssuedAtClaim(value: now),
            nbf: notBefore.map { NotBeforeClaim(value: now.addingTimeInterval($0)) }, email: "person@example.org")
        return try await signers.sign(claims, kid: JWKIdentifier(string: kid))
    }

    public static func base64URL(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }
}
