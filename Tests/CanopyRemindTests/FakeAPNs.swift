import CanopyTesting
import Crypto
import Foundation
import Hummingbird
import HummingbirdHTTP2
import NIOSSL
import Synchronization
import X509

/// A local HTTP/2 server over TLS that answers as Apple's push provider API documents it
/// ("Sending notification requests to APNs", "Establishing a token-based connection to
/// APNs", "Handling notification responses from APNs"):
///
/// - `POST /3/device/<token>` only, over HTTP/2 (ALPN offers `h2` and HTTP/1.1; each request
///   notes which it came over);
/// - `authorization: bearer <JWT>`: the token's ES256 signature is checked with the team's
///   public key (here with swift-crypto, apart from the jwt-kit that signed it), `kid` must be
///   the key id and `iss` the team id: else 403 `MissingProviderToken` or
///   `InvalidProviderToken`; a token issued more than an hour ago is 403
///   `ExpiredProviderToken`; a new token less than 20 minutes after the one before is 429
///   `TooManyProviderTokenUpdates`;
/// - `apns-topic` missing is 400 `MissingTopic`, another app's is 400 `DeviceTokenNotForTopic`;
///   `apns-push-type` other than `alert` is 400 `InvalidPushType`; an `apns-id` that is not a
///   UUID is 400 `BadMessageId`; `apns-priority` other than 5 or 10 is 400 `BadPriority`; an
///   `apns-expiration` that is not a number is 400 `BadExpirationDate`; an `apns-collapse-id`
///   over 64 bytes is 400 `BadCollapseId`;
/// - an empty body is 400 `PayloadEmpty`, over 4,096 bytes 413 `PayloadTooLarge`;
/// - a device token that is not 64 hexadecimal characters is 400 `BadDeviceToken`; an
///   unregistered one is 410 `Unregistered` with a timestamp;
/// - then the answers the test scripted, in turn; else 200 with the `apns-id`.
///
/// Refusals carry `{"reason": "…"}` as APNs' do.
final class FakeAPNs: Sendable {
    struct Received: Sendable {
        var deviceToken: String
        var headers: [String: String]
        var body: [UInt8]
        var http2: Bool
        var status: Int
        var reason: String?
    }

    /// The app's topic, key id and team id it expects.
    static let topic = "org.canopy.app"
    static let keyID = "ABC123DEFG"
    static let teamID = "DEF123GHIJ"

    /// What the test gives the channel: its signing key (PEM) and the CA that signed this
    /// server's certificate (a PEM file).
    let keyPEM: String
    let caFile: URL

    private let publicKey: P256.Signing.PublicKey
    fileprivate typealias State = (
        received: [Received], scripted: [(Int, String)], unregistered: Set<String>, port: Int?,
        lastToken: (token: String, firstSeen: Date)?
    )
    fileprivate final class Shared: Sendable {
        let value = Mutex<State>(([], [], [], nil, nil))
    }

    fileprivate let shared: Shared
    private let now: @Sendable () -> Date
    let application: Application<RouterResponder<Context>>

    /// Notes whether a request came over an HTTP/2 stream (a child of the connection's channel).
    struct Context: RequestContext {
        var coreContext: CoreRequestContextStorage
        let http2: Bool
        init(source: ApplicationRequestContextSource) {
            coreContext = .init(source: source)
            http2 = source.channel.parent?.parent != nil
        }
    }

    /// - Parameters:
    ///   - directory: where the CA's PEM file is written.
    ///   - now: the server's clock, for token ages.
    init(directory: URL, now: @escaping @Sendable () -> Date = { Date() }) throws {
        let signingKey = P256.Signing.PrivateKey()
        keyPEM = signingKey.pemRepresentation
        publicKey = signingKey.publicKey
        self.now = now
        let (caPEM, certificatePEM, certificateKeyPEM) = try Self.certificates()
        caFile = directory.appendingPathComponent("apns-ca.pem")
        try Data(caPEM.utf8).write(to: caFile)
        let tls = TLSConfiguration.makeServerConfiguration(
            certificateChain: [.certificate(try NIOSSLCertificate(bytes: Array(certificatePEM.utf8), format: .pem))],
            privateKey: .privateKey(try NIOSSLPrivateKey(bytes: Array(certificateKeyPEM.utf8), format: .pem)))

        let router = Router(context: Context.self)
        let box = Unchecked(weak: nil)
        router.post("/3/device/:token") { request, context -> Response in
            guard let server = box.server else { return Response(status: .serviceUnavailable) }
            let body = try await request.body.collect(upTo: 1024 * 1024)
            var headers: [String: String] = [:]
            for field in request.headers { headers[field.name.canonicalName] = field.value }
            let token = context.parameters.get("token") ?? ""
            let (status, reason) = server.answer(token: token, headers: headers, body: Array(body.readableBytesView))
            server.shared.value.withLock {
                $0.received.append(
                    Received(
                        deviceToken: token, headers: headers, body: Array(body.readableBytesView), http2: context.http2,
                        status: status, reason: reason))
            }
            var fields = HTTPFields()
            if let id = headers["apns-id"] { fields[HTTPFields.Element.Name("apns-id")!] = id }
            guard let reason else { return Response(status: .ok, headers: fields) }
            fields[.contentType] = "application/json"
            var json = "{\"reason\":\"\(reason)\""
            if status == 410 { json += ",\"timestamp\":\(Int(server.now().timeIntervalSince1970 * 1000))" }
            json += "}"
            return Response(status: .init(code: status), headers: fields, body: .init(byteBuffer: ByteBuffer(string: json)))
        }
        let shared = Shared()
        self.shared = shared
        application = Application(
            router: router, server: try .http2Upgrade(tlsConfiguration: tls),
            configuration: .init(address: .hostname("127.0.0.1", port: 0), serverName: "fake-apns"),
            onServerRunning: { channel in shared.value.withLock { $0.port = channel.localAddress?.port } })
        box.server = self
    }

    /// Lets the route reach the server without a cycle.
    private final class Unchecked: @unchecked Sendable {
        weak var server: FakeAPNs?
        init(weak server: FakeAPNs?) { self.server = server }
    }

    /// The server's base URL (its certificate names `localhost`). The limit is generous: with the
    /// whole suite running on two cores, the task that starts the server can wait its turn for
    /// half a minute.
    func url(within limit: Duration = .seconds(120)) async throws -> String {
        guard try await eventually(within: limit, { shared.value.withLock { $0.port } != nil }),
            let port = shared.value.withLock({ $0.port })
        else { throw NotListening(limit: limit) }
        return "https://localhost:\(port)"
    }

    struct NotListening: Error, CustomStringConvertible {
        let limit: Duration
        var description: String { "the fake APNs server was not listening within \(limit)" }
    }

    /// The next answers, before the documented checks' 200s.
    func script(_ answers: [(Int, String)]) { shared.value.withLock { $0.scripted += answers } }

    /// Device tokens whose app was removed (410 `Unregistered`).
    func unregister(_ token: String) { shared.value.withLock { _ = $0.unregistered.insert(token.lowercased()) } }

    var received: [Received] { shared.value.withLock { $0.received } }

    // MARK: - Apple's checks

    private func answer(token: String, headers: [String: String], body: [UInt8]) -> (Int, String?) {
        if let refusal = checkProviderToken(headers["authorization"]) { return refusal }
        guard let topic = headers["apns-topic"] else { return (400, "MissingTopic") }
        guard topic == Self.topic else { return (400, "DeviceTokenNotForTopic") }
        guard headers["apns-push-type"] == "alert" else { return (400, "InvalidPushType") }
        if let id = headers["apns-id"], UUID(uuidString: id) == nil { return (400, "BadMessageId") }
        if let priority = headers["apns-priority"], !["5", "10"].contains(priority) { return (400, "BadPriority") }
        if let expiration = headers["apns-expiration"], Int(expiration) == nil { return (400, "BadExpirationDate") }
        if let collapse = headers["apns-collapse-id"], collapse.utf8.count > 64 { return (400, "BadCollapseId") }
        guard !body.isEmpty else { return (400, "PayloadEmpty") }
        guard body.count <= 4_096 else { return (413, "PayloadTooLarge") }
        guard token.utf8.count == 64, token.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) }) else {
            return (400, "BadDeviceToken")
        }
        return shared.value.withLock { state -> (Int, String?) in
            if state.unregistered.contains(token) { return (410, "Unregistered") }
            if !state.scripted.isEmpty {
                let (status, reason) = state.scripted.removeFirst()
                return (status, reason)
            }
            return (200, nil)
        }
    }

    private func checkProviderToken(_ authorization: String?) -> (Int, String?)? {
        guard let authorization, authorization.hasPrefix("bearer ") else { return (403, "MissingProviderToken") }
        let token = String(authorization.dropFirst(7))
        let parts = token.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 3, let headerBytes = Self.base64URL(parts[0]), let claimsBytes = Self.base64URL(parts[1]),
            let signatureBytes = Self.base64URL(parts[2]),
            let header = try? JSONSerialization.jsonObject(with: headerBytes) as? [String: Any],
            let claims = try? JSONSerialization.jsonObject(with: claimsBytes) as? [String: Any],
            header["alg"] as? String == "ES256", header["kid"] as? String == Self.keyID, claims["iss"] as? String == Self.teamID,
            let iat = (claims["iat"] as? NSNumber)?.doubleValue,
            let signature = try? P256.Signing.ECDSASignature(rawRepresentation: signatureBytes),
            publicKey.isValidSignature(signature, for: Data((parts[0] + "." + parts[1]).utf8))
        else {
            return (403, "InvalidProviderToken")
        }
        let now = self.now()
        guard now.timeIntervalSince1970 - iat <= 3_600 else { return (403, "ExpiredProviderToken") }
        return shared.value.withLock { state -> (Int, String?)? in
            if let last = state.lastToken, last.token != token {
                guard now.timeIntervalSince(last.firstSeen) >= 20 * 60 else { return (429, "TooManyProviderTokenUpdates") }
            }
            if state.lastToken?.token != token { state.lastToken = (token, now) }
            return nil
        }
    }

    static func base64URL(_ text: String) -> Data? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.count % 4 != 0 { base64 += "=" }
        return Data(base64Encoded: base64)
    }

    /// A certificate authority and a server certificate for `localhost` it signed (PEM), with
    /// the server certificate's key.
    static func certificates() throws -> (ca: String, certificate: String, key: String) {
        let caKey = P256.Signing.PrivateKey()
        let caName = try DistinguishedName { CommonName("Canopy test CA") }
        let now = Date()
        let ca = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(caKey.publicKey), notValidBefore: now - 3_600, notValidAfter: now + 86_400,
            issuer: caName, subject: caName, signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                Critical(KeyUsage(keyCertSign: true))
            },
            issuerPrivateKey: .init(caKey))
        let serverKey = P256.Signing.PrivateKey()
        let server = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(serverKey.publicKey), notValidBefore: now - 3_600, notValidAfter: now + 86_400,
            issuer: caName, subject: try DistinguishedName { CommonName("localhost") }, signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.serverAuth])
                SubjectAlternativeNames([.dnsName("localhost")])
            },
            issuerPrivateKey: .init(caKey))
        return (try ca.serializeAsPEM().pemString, try server.serializeAsPEM().pemString, serverKey.pemRepresentation)
    }
}
