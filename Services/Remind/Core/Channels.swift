import AsyncHTTPClient
import CanopyMessages
import CanopyOutbound
import Crypto
import Foundation
import Logging
import NIOCore
import NIOHTTP1

/// One notification: one or more of a person's reminders due together, for one device.
struct ReminderNotification: Codable, Sendable, Equatable {
    /// The idempotency key: the same reminders to the same device always get the same one, so
    /// a resend after a crash is recognisable (`apns-id`, `webhook-id`, ntfy's `X-Canopy-Id`).
    var id: String
    var title: String
    var body: String
    var reminders: [Reminders.Reminder]

    /// "Water Monstera" for one; "Water 3 plants: Monstera, Pothos, Fern" for several of one
    /// kind; "4 plant tasks: …" for a mix.
    init(id: String, reminders: [Reminders.Reminder]) {
        self.id = id
        self.reminders = reminders
        let sorted = reminders.sorted { ($0.due, $0.title) < ($1.due, $1.title) }
        if sorted.count == 1 {
            title = sorted[0].title
            body = sorted[0].title
        } else {
            let verbs = Set(sorted.map { $0.title.split(separator: " ").first.map(String.init) ?? "" })
            if verbs.count == 1, let verb = verbs.first, !verb.isEmpty {
                let names = sorted.map { String($0.title.dropFirst(verb.count).drop { $0 == " " }) }
                title = "\(verb) \(sorted.count) plants: \(names.joined(separator: ", "))"
            } else {
                title = "\(sorted.count) plant tasks: \(sorted.map(\.title).joined(separator: ", "))"
            }
            body = sorted.map(\.title).joined(separator: "\n")
        }
    }

    /// A key from the device and the reminders (task and due time of each), shaped as a UUID
    /// (APNs wants one).
    static func key(deviceID: String, reminders: [(taskID: String, due: Double)]) -> String {
        let text = ([deviceID] + reminders.map { "\($0.taskID)@\($0.due)" }.sorted()).joined(separator: "\n")
        let hex = Array(SHA256.hash(data: Array(text.utf8)).prefix(16).lowercaseHex)
        return [0..<8, 8..<12, 12..<16, 16..<20, 20..<32].map { String(hex[$0]) }.joined(separator: "-")
    }
}

/// What a channel made of one delivery.
enum DeliveryOutcome: Sendable, Equatable {
    /// The channel took it; the detail is what it answered.
    case accepted(String)
    /// Try again later (throttled, a server error, no connection).
    case retry(String)
    /// Never going to work (a bad token, a refused payload); `deactivate` when the device is gone.
    case rejected(String, deactivate: Bool)
}

/// A way to reach a device. Plug-ins: ``LogChannel``, ``WebhookChannel``, ``NtfyChannel``,
/// ``APNsChannel``.
protocol NotificationChannel: Sendable {
    var kind: Reminders.Channel { get }
    func deliver(_ notification: ReminderNotification, to device: DeviceRecord) async -> DeliveryOutcome
    /// Who receives a delivery to `device`, for the dispatcher's bound per destination: a
    /// receiver anyone can register (a webhook's or ntfy server's host) is one destination,
    /// so a slow one holds only its own deliveries. `nil` for channels with no such bound
    /// (APNs, one trusted provider; the log).
    func destination(of device: DeviceRecord) -> String?
}

extension NotificationChannel {
    func destination(of device: DeviceRecord) -> String? { nil }

    /// The lowercased host of the device's address, as the destination of HTTP channels.
    func hostDestination(of device: DeviceRecord) -> String? {
        URLComponents(string: device.device.address)?.host.map { "\(kind.rawValue):\($0.lowercased())" } ?? "\(kind.rawValue):?"
    }
}

/// `log`: the notification as a log line (the embedded default, demos). With `rehearsing`
/// (`--rehearse`), it stands in for that channel and sends nothing: the notification its
/// device would have had, as a log line naming the channel, accepted as the real one would.
struct LogChannel: NotificationChannel {
    let logger: Logger
    var rehearsing: Reminders.Channel?
    var kind: Reminders.Channel { rehearsing ?? .log }

    func deliver(_ notification: ReminderNotification, to device: DeviceRecord) async -> DeliveryOutcome {
        var metadata: Logger.Metadata = [
            "remind.id": "\(notification.id)", "remind.device": "\(device.device.id)", "remind.title": "\(notification.title)",
            "remind.reminders": "\(notification.reminders.count)",
        ]
        if let rehearsing { metadata["remind.rehearsal"] = "\(rehearsing.rawValue)" }
        logger.info("remind.notification", metadata: metadata)
        return .accepted(rehearsing == nil ? "logged" : "rehearsed")
    }
}

/// Maps an HTTP answer to an outcome, the same way for webhooks and ntfy: 2xx accepted; 408,
/// 429 and 5xx retried; 410 gone (the device deactivated); other 4xx refused.
func httpOutcome(_ status: UInt, _ what: String) -> DeliveryOutcome {
    switch status {
    case 200..<300: .accepted("HTTP \(status)")
    case 408, 429, 500..<600: .retry("\(what) answered HTTP \(status)")
    case 410: .rejected("\(what) answered 410 Gone", deactivate: true)
    default: .rejected("\(what) answered HTTP \(status)", deactivate: false)
    }
}

/// Sends one request to an address a person registered, through ``PinnedHTTP``: only to a
/// public address, checked when the connection is made. An internal address is refused for
/// good; a host that cannot be reached, or does not answer in time, is a retry.
func send(_ request: PinnedHTTP.Request, with http: PinnedHTTP, what: String) async -> DeliveryOutcome {
    do {
        return httpOutcome(UInt((try await http.send(request)).status.code), what)
    } catch {
        switch error.kind {
        case .refused: return .rejected("\(what): \(error.message)", deactivate: false)
        case .unreachable, .timeout, .tooLarge: return .retry("\(what) could not be reached: \(error.message)")
        }
    }
}

/// The outbound HTTP of webhooks and ntfy: answers of at most 64 KiB within `timeout`; hosts
/// in `allowedHosts` (`--allow-host`) may be internal.
func notificationHTTP(allowedHosts: Set<String>, timeout: Duration = .seconds(10)) throws -> PinnedHTTP {
    var settings = PinnedHTTP.Settings()
    settings.connectTimeout = min(timeout, .seconds(5))
    settings.totalTimeout = timeout
    settings.maximumBytes = 64 * 1024
    settings.allowedHosts = Set(allowedHosts.map { $0.lowercased() })
    settings.userAgent = "canopy-remind"
    return try PinnedHTTP(settings: settings)
}

/// `webhook`: an HTTP POST of the notification as JSON, signed as the Standard Webhooks
/// specification says (https://www.standardwebhooks.com): `webhook-id` (the idempotency key),
/// `webhook-timestamp` (Unix seconds) and `webhook-signature` (`v1,` and the base64 HMAC-SHA256,
/// keyed by the secret's bytes, of `id.timestamp.body`). Receivers verify it with any Standard
/// Webhooks library and refuse old timestamps (replays).
struct WebhookChannel: NotificationChannel {
    /// Connects only to checked public addresses, and gives up after its total timeout.
    let http: PinnedHTTP
    var now: @Sendable () -> Date = { Date() }
    var kind: Reminders.Channel { .webhook }
    func destination(of device: DeviceRecord) -> String? { hostDestination(of: device) }
    let codec = MessageCodec()

    /// The JSON body a receiver gets.
    struct Payload: Codable, Equatable {
        var type: String
        var timestamp: Date
        var data: ReminderNotification
    }

    func deliver(_ notification: ReminderNotification, to device: DeviceRecord) async -> DeliveryOutcome {
        guard let secret = device.secret, let key = Self.key(secret) else {
            return .rejected("the webhook has no valid signing secret; register it again", deactivate: false)
        }
        let timestamp = Int(now().timeIntervalSince1970)
        guard let body = try? codec.encode(Payload(type: "reminder.due", timestamp: Date(timeIntervalSince1970: Double(timestamp)), data: notification)) else {
            return .rejected("the notification could not be encoded", deactivate: false)
        }
        var request = PinnedHTTP.Request(url: device.device.address, method: .POST, body: body)
        request.headers.add(name: "Content-Type", value: "application/json")
        request.headers.add(name: "webhook-id", value: notification.id)
        request.headers.add(name: "webhook-timestamp", value: "\(timestamp)")
        request.headers.add(name: "webhook-signature", value: Self.signature(id: notification.id, timestamp: timestamp, body: body, key: key))
        return await send(request, with: http, what: "the webhook")
    }

    /// The secret's key bytes: base64 after `whsec_`.
    static func key(_ secret: String) -> [UInt8]? {
        guard secret.hasPrefix("whsec_"), let data = Data(base64Encoded: String(secret.dropFirst(6))) else { return nil }
        return [UInt8](data)
    }

    /// `v1,` and base64(HMAC-SHA256(key, "id.timestamp.body")).
    static func signature(id: String, timestamp: Int, body: [UInt8], key: [UInt8]) -> String {
        let signed = Array("\(id).\(timestamp).".utf8) + body
        let mac = HMAC<SHA256>.authenticationCode(for: signed, using: SymmetricKey(data: key))
        return "v1," + Data(mac).base64EncodedString()
    }
}

/// `ntfy`: a publish to an ntfy topic URL (https://docs.ntfy.sh/publish/): the message as the
/// body, with `Title`, `Tags`, `Priority` and, when the topic needs it, `Authorization: Bearer`.
/// `X-Canopy-Id` carries the idempotency key.
struct NtfyChannel: NotificationChannel {
    /// Connects only to checked public addresses, and gives up after its total timeout.
    let http: PinnedHTTP
    var kind: Reminders.Channel { .ntfy }
    func destination(of device: DeviceRecord) -> String? { hostDestination(of: device) }

    func deliver(_ notification: ReminderNotification, to device: DeviceRecord) async -> DeliveryOutcome {
        var request = PinnedHTTP.Request(url: device.device.address, method: .POST, body: Array(notification.body.utf8))
        request.headers.add(name: "Title", value: Self.headerSafe(notification.title))
        request.headers.add(name: "Tags", value: Self.tags(notification))
        request.headers.add(name: "Priority", value: notification.reminders.count > 1 ? "high" : "default")
        request.headers.add(name: "X-Canopy-Id", value: notification.id)
        if let token = device.accessToken { request.headers.add(name: "Authorization", value: "Bearer \(token)") }
        return await send(request, with: http, what: "the ntfy server")
    }

    /// ntfy shows tags that are emoji short codes as emoji.
    static func tags(_ notification: ReminderNotification) -> String {
        let emoji: [Care.TaskKind: String] = [
            .water: "droplet", .fertilize: "seedling", .mist: "sweat_drops", .repot: "potted_plant",
            .rotate: "arrows_counterclockwise", .prune: "scissors", .custom: "memo",
        ]
        return Array(Set(notification.reminders.compactMap { emoji[$0.kind] })).sorted().joined(separator: ",")
    }

    /// Header values are one line of printable characters.
    static func headerSafe(_ text: String) -> String {
        String(text.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F }.prefix(250).map(Character.init))
    }
}
