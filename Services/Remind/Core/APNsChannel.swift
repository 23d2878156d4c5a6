import AsyncHTTPClient
import CanopyMessages
import Foundation
import JWTKit
import Logging
import Metrics
import NIOCore
import NIOSSL
import ServiceLifecycle

/// Where and as whom canopy-remind speaks to Apple's push notification service. None of it is
/// ever logged.
public struct APNsSettings: Sendable {
    /// `https://api.push.apple.com` (production) or `https://api.sandbox.push.apple.com`
    /// (development builds of the app).
    public var server: String = APNsSettings.production
    /// The `.p8` signing key Apple's developer account gives (PEM, PKCS#8, P-256).
    public var keyFile: String
    /// The key's 10-character id.
    public var keyID: String
    /// The developer team's 10-character id (the token's issuer).
    public var teamID: String
    /// The app's bundle id (`apns-topic`).
    public var topic: String
    /// A PEM file of certificate authorities to trust instead of the system's (a proxy, a
    /// test server); `nil` for the system's.
    public var caFile: String?
    /// How long one provider token is used before a new one is signed. Apple refuses tokens
    /// older than an hour and too frequent new ones (more than one in 20 minutes), so 20 to 60
    /// minutes.
    public var tokenLifetime: Duration = .seconds(50 * 60)
    /// How long APNs keeps trying to reach a phone that is offline (`apns-expiration`).
    public var expiration: Duration = .seconds(12 * 3_600)
    /// One request's limit.
    public var timeout: Duration = .seconds(10)

    public static let production = "https://api.push.apple.com"
    public static let sandbox = "https://api.sandbox.push.apple.com"

    public init(keyFile: String, keyID: String, teamID: String, topic: String) {
        self.keyFile = keyFile
        self.keyID = keyID
        self.teamID = teamID
        self.topic = topic
    }

    /// Checks what can be checked before the first send, with a sentence saying what to fix.
    public func validate() throws(CanopyError) {
        guard let url = URL(string: server), url.scheme == "https", url.host?.isEmpty == false, url.path.isEmpty || url.path == "/" else {
            throw CanopyError(.badRequest, "the APNs server is an https URL without a path, such as \(Self.production)")
        }
        for (value, name) in [(keyID, "key id"), (teamID, "team id")] {
            guard value.utf8.count == 10, value.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) }) else {
                throw CanopyError(.badRequest, "the APNs \(name) is 10 upper-case letters and digits, as Apple's developer account shows it")
            }
        }
        guard !topic.isEmpty, topic.utf8.count <= 255, topic.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
            throw CanopyError(.badRequest, "the APNs topic is the app's bundle id, such as org.example.canopy")
        }
        guard tokenLifetime >= .seconds(20 * 60), tokenLifetime <= .seconds(60 * 60) else {
            throw CanopyError(.badRequest, "an APNs provider token lives 20 to 60 minutes (Apple refuses older ones and more frequent new ones)")
        }
    }
}

/// `apns`: Apple's push provider API as documented (Sending notification requests to APNs):
/// an HTTP/2 `POST /3/device/<token>` with token-based authorization, one JWT (ES256, signed
/// with the team's key through jwt-kit) reused for ``APNsSettings/tokenLifetime`` and then
/// replaced. The request carries `apns-topic`, `apns-push-type: alert`, `apns-priority: 10`,
/// `apns-expiration`, `apns-collapse-id` and `apns-id`, both the notification's idempotency
/// key, so a resend after a crash replaces the first on the phone instead of showing twice.
///
/// Apple's answers: 200 accepted; 410 (`Unregistered`, `ExpiredToken`) deactivates the device;
/// `BadDeviceToken`, `DeviceTokenNotForTopic`, `Forbidden`, `PayloadTooLarge` and other
/// refusals of the request are not retried; `ExpiredProviderToken` signs a new token and tries
/// once more at once; 429 and 5xx (and the other provider-token refusals, which an operator
/// fixes) are retried with backoff. The payload is cut to fit 4,096 bytes.
///
/// Thread-safety: safe to use from any task; the provider token is kept by an actor.
final class APNsChannel: NotificationChannel, Service {
    let settings: APNsSettings
    let client: HTTPClient
    let tokens: APNsTokens
    let logger: Logger
    let now: @Sendable () -> Date
    var kind: Reminders.Channel { .apns }

    /// The largest payload APNs takes for an alert.
    static let maximumPayloadBytes = 4_096

    /// - Parameters:
    ///   - settings: server, key, ids and topic (checked with ``APNsSettings/validate()``).
    ///   - logger: for refusals that need an operator (the key, the topic); never the token.
    ///   - now: the time tokens are issued and expirations counted from.
    init(settings: APNsSettings, logger: Logger, now: @escaping @Sendable () -> Date = { Date() }) throws {
        try settings.validate()
        let pem: String
        do {
            pem = try String(contentsOfFile: settings.keyFile, encoding: .utf8)
        } catch {
            throw CanopyError(.badRequest, "the APNs key file \(settings.keyFile) cannot be read; give the .p8 file Apple's developer account made")
        }
        let key: ES256PrivateKey
        do {
            key = try ES256PrivateKey(pem: pem)
        } catch {
            throw CanopyError(.badRequest, "the APNs key file \(settings.keyFile) is not a P-256 private key in PEM (the .p8 file Apple gives)")
        }
        var configuration = HTTPClient.Configuration()
        configuration.httpVersion = .automatic // HTTP/2 through ALPN; APNs speaks nothing else
        var tls = TLSConfiguration.makeClientConfiguration()
        if let caFile = settings.caFile { tls.trustRoots = .file(caFile) }
        configuration.tlsConfiguration = tls
        configuration.timeout.connect = .nanoseconds(settings.timeout.nanoseconds) // within the request's own limit
        self.settings = settings
        self.client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
        self.tokens = APNsTokens(key: key, keyID: settings.keyID, teamID: settings.teamID, lifetime: settings.tokenLifetime)
        self.logger = logger
        self.now = now
    }

    /// Holds the HTTP client (and its one HTTP/2 connection) until shutdown, then closes it.
    func run() async throws {
        try? await gracefulShutdown()
        try await client.shutdown()
    }

    func deliver(_ notification: ReminderNotification, to device: DeviceRecord) async -> DeliveryOutcome {
        guard let payload = try? Self.payload(notification) else {
            return .rejected("the notification does not fit APNs' 4,096 bytes", deactivate: false)
        }
        var answer = await post(payload, id: notification.id, to: device.device.address)
        if case .expiredProviderToken(let token) = answer {
            // Our token is older than APNs takes (a clock jump?): a new one, once.
            await tokens.replace(token, now: now())
            answer = await post(payload, id: notification.id, to: device.device.address)
        }
        return answer.outcome
    }

    /// What one POST came to.
    enum Answer: Sendable {
        case outcome(DeliveryOutcome)
        /// 403 `ExpiredProviderToken` for this token.
        case expiredProviderToken(String)

        var outcome: DeliveryOutcome {
            switch self {
            case .outcome(let outcome): outcome
            case .expiredProviderToken: .retry("APNs found the provider token expired twice; check the server's clock")
            }
        }
    }

    private func post(_ payload: [UInt8], id: String, to deviceToken: String) async -> Answer {
        let issued = now()
        let token: String
        do {
            token = try await tokens.current(now: issued)
        } catch {
            logger.error("remind.apns.sign.failed", metadata: ["remind.error": "\(type(of: error))"])
            return .outcome(.retry("the APNs provider token could not be signed"))
        }
        var request = HTTPClientRequest(url: "\(settings.server)/3/device/\(deviceToken)")
        request.method = .POST
        request.headers.add(name: "authorization", value: "bearer \(token)")
        request.headers.add(name: "apns-topic", value: settings.topic)
        request.headers.add(name: "apns-push-type", value: "alert")
        request.headers.add(name: "apns-priority", value: "10")
        request.headers.add(name: "apns-expiration", value: "\(Int(issued.timeIntervalSince1970 + settings.expiration.seconds))")
        request.headers.add(name: "apns-collapse-id", value: id)
        request.headers.add(name: "apns-id", value: id)
        request.headers.add(name: "content-type", value: "application/json")
        request.body = .bytes(ByteBuffer(bytes: payload))
        do {
            let (seconds, attoseconds) = settings.timeout.components
            let response = try await client.execute(request, timeout: .nanoseconds(seconds * 1_000_000_000 + attoseconds / 1_000_000_000))
            let body = (try? await response.body.collect(upTo: 16 * 1024)).map { Array($0.readableBytesView) } ?? []
            let reason = (try? Self.decoder.decode(APNsError.self, from: Data(body)))?.reason ?? ""
            let answer = Self.answer(status: Int(response.status.code), reason: reason, token: token)
            if case .outcome(.retry) = answer, response.status.code == 403 {
                // The key, key id or team id is wrong: no device can get anything until an
                // operator fixes it.
                logger.error("remind.apns.refused", metadata: ["remind.apns.reason": "\(reason)"])
            }
            return answer
        } catch {
            return .outcome(.retry("APNs could not be reached (\(type(of: error)))"))
        }
    }

    /// The JSON body of APNs' refusals.
    struct APNsError: Decodable {
        var reason: String
    }

    /// Apple's status codes and reasons, as ``DeliveryOutcome``s.
    static func answer(status: Int, reason: String, token: String) -> Answer {
        let said = reason.isEmpty ? "APNs answered HTTP \(status)" : "APNs answered HTTP \(status) \(reason)"
        switch (status, reason) {
        case (200, _):
            return .outcome(.accepted("APNs accepted it"))
        case (410, _):
            return .outcome(.rejected(said + ": the app is no longer on the device; it registers again when it comes back", deactivate: true))
        case (403, "ExpiredProviderToken"):
            return .expiredProviderToken(token)
        case (403, "InvalidProviderToken"), (403, "MissingProviderToken"), (403, "BadEnvironmentKeyInToken"), (403, "UnrelatedKeyIdInToken"),
            (403, "BadCertificate"), (403, "BadCertificateEnvironment"):
            return .outcome(.retry(said + ": check canopy-remind's APNs key, key id, team id and server"))
        case (429, _), (500..<600, _):
            return .outcome(.retry(said))
        default:
            // BadDeviceToken, DeviceTokenNotForTopic, Forbidden, PayloadTooLarge and the other
            // refusals of the request itself: sending it again changes nothing.
            return .outcome(.rejected(said, deactivate: false))
        }
    }

    // MARK: - The payload

    /// The JSON APNs delivers to the app: `aps` (an alert with title and body, the default
    /// sound, one thread for care reminders) and `canopy` (the notification's id and the tasks
    /// it covers, for the app to open). When it would pass 4,096 bytes, the body keeps as many
    /// of its lines as fit and says how many more there are; then the task list goes, then the
    /// title and lines are cut to 100 characters.
    static func payload(_ notification: ReminderNotification) throws -> [UInt8] {
        let lines = notification.body.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let tasks = notification.reminders.map(\.taskID)
        func encoded(title: String, lines: [String], kept: Int, tasks: [String]) throws -> Data {
            let body = lines.prefix(kept) + (kept < lines.count ? ["and \(lines.count - kept) more"] : [])
            return try encoder.encode(
                Payload(
                    aps: .init(
                        alert: .init(title: title, body: body.joined(separator: "\n")), sound: "default",
                        threadID: "canopy.care"),
                    canopy: .init(id: notification.id, tasks: tasks)))
        }
        let short = (title: String(notification.title.prefix(100)), lines: lines.map { String($0.prefix(100)) })
        for (title, lines, tasks) in [(notification.title, lines, tasks), (notification.title, lines, []), (short.title, short.lines, [])] {
            // The most lines that fit: the size grows with the lines kept, so a binary search.
            var (low, high) = (0, lines.count)
            guard try encoded(title: title, lines: lines, kept: 0, tasks: tasks).count <= maximumPayloadBytes else { continue }
            while low < high {
                let middle = (low + high + 1) / 2
                if try encoded(title: title, lines: lines, kept: middle, tasks: tasks).count <= maximumPayloadBytes { low = middle } else { high = middle - 1 }
            }
            return [UInt8](try encoded(title: title, lines: lines, kept: low, tasks: tasks))
        }
        throw CanopyError(.tooLarge, "the notification does not fit 4,096 bytes")
    }

    private static let decoder = JSONDecoder()
    private static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }()

    struct Payload: Codable, Equatable {
        struct Alert: Codable, Equatable {
            var title: String
            var body: String
        }

        struct APS: Codable, Equatable {
            var alert: Alert
            var sound: String
            var threadID: String
            enum CodingKeys: String, CodingKey {
                case alert, sound
                case threadID = "thread-id"
            }
        }

        struct Canopy: Codable, Equatable {
            var id: String
            var tasks: [String]
        }

        var aps: APS
        var canopy: Canopy
    }
}

/// The provider token APNs authenticates canopy-remind by: a JWT with `alg` ES256, `kid` the
/// key id, `iss` the team id and `iat` when it was made, signed once and reused for its
/// lifetime (APNs refuses a new token more often than every 20 minutes).
actor APNsTokens {
    private let keys = JWTKeyCollection()
    private let keyID: String
    private let teamID: String
    private let lifetime: Duration
    private var current: (token: String, issued: Date)?
    private let signed = Counter(label: "canopy_remind_apns_tokens_total")

    struct Claims: JWTPayload {
        var iss: IssuerClaim
        var iat: IssuedAtClaim
        func verify(using algorithm: some JWTAlgorithm) async throws {}
    }

    init(key: ES256PrivateKey, keyID: String, teamID: String, lifetime: Duration) {
        self.keyID = keyID
        self.teamID = teamID
        self.lifetime = lifetime
        self.pendingKey = key
    }

    /// The key, until the first signing puts it in the collection (adding is async).
    private var pendingKey: ES256PrivateKey?

    /// The token to send now: the one in use while younger than its lifetime, else a new one.
    func current(now: Date) async throws -> String {
        if let current, now.timeIntervalSince(current.issued) < lifetime.seconds, now >= current.issued { return current.token }
        return try await sign(now: now)
    }

    /// APNs said `token` expired: a new one, unless another request replaced it already.
    func replace(_ token: String, now: Date) async {
        guard current?.token == token else { return }
        _ = try? await sign(now: now)
    }

    private func sign(now: Date) async throws -> String {
        if let key = pendingKey {
            await keys.add(ecdsa: key, kid: JWKIdentifier(string: keyID))
            pendingKey = nil
        }
        // `iat` in whole seconds, as Apple's examples have it.
        let issued = Date(timeIntervalSince1970: now.timeIntervalSince1970.rounded(.down))
        let token = try await keys.sign(Claims(iss: IssuerClaim(value: teamID), iat: IssuedAtClaim(value: issued)), kid: JWKIdentifier(string: keyID))
        current = (token, issued)
        signed.increment()
        return token
    }
}
