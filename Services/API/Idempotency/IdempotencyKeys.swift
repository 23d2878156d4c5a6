import CanopyMessages
import Crypto
import Foundation

/// The rules of `Idempotency-Key` (the IETF draft "The Idempotency-Key HTTP Header Field", as
/// Stripe's API does it), in one place: what a key may be, what makes two requests the same,
/// and what a request finds when its key is known. The stores keep records
/// (``IdempotencyStoring``); the edge applies the answer (``IdempotentRequests``).
///
/// A key is scoped to the person and the route (`POST /v1/plants`, with the route's own ids):
/// two people's keys never meet, and one key on two routes is two keys.
public enum IdempotencyKeys {
    /// The header apps send, and the one a replayed answer carries.
    public static let header = "Idempotency-Key"
    public static let replayedHeader = "Idempotent-Replayed"
    /// A key is 1 to 255 printable ASCII characters (a UUID is what apps usually send).
    public static let maximumKeyBytes = 255
    /// How long a done request's answer is kept for a repeat.
    public static let lifetime: TimeInterval = 24 * 3600
    /// The most keys one person holds at once (done or running); past it the oldest done ones go.
    public static let maximumKeysPerPerson = 1_000
    /// The most bytes of kept answers one person holds; past it the oldest done ones go.
    public static let maximumBytesPerPerson = 32 << 20
    /// An answer larger than this is not kept: the work is done once all the same, and a
    /// repeat is told so (409) instead of getting the answer.
    public static let maximumAnswerBytes = 4 << 20
    /// The answer's headers a repeat gets again (the rest are the repeat's own: its request id).
    public static let keptHeaders: [String] = ["Content-Type", "Location", "ETag", "Last-Modified"]

    /// The key as sent, checked: an sf-string (`"…"`, as the draft writes it) or the bare
    /// characters (as Stripe's clients send them); 1 to 255 printable ASCII characters.
    public static func parse(_ value: String) throws(CanopyError) -> String {
        var key = value
        if key.utf8.count >= 2, key.hasPrefix("\""), key.hasSuffix("\"") {
            key = String(key.dropFirst().dropLast())
            guard !key.contains("\\") && !key.contains("\"") else {
                throw CanopyError(
                    .badRequest, "\(header) is 1 to \(maximumKeyBytes) printable ASCII characters, without quotes or backslashes inside", field: header)
            }
        }
        guard (1...maximumKeyBytes).contains(key.utf8.count), key.utf8.allSatisfy({ (0x20...0x7E).contains($0) }),
            key.utf8.contains(where: { $0 != 0x20 })
        else {
            throw CanopyError(
                .badRequest, "\(header) is 1 to \(maximumKeyBytes) printable ASCII characters, such as a UUID; got \(value.utf8.count) bytes", field: header)
        }
        return key
    }

    /// What makes a repeat the same request: the method, the path with its query, the body's
    /// type and the body's bytes (SHA-256 of all four, each length-prefixed).
    public static func fingerprint(method: String, path: String, contentType: String?, body: some Collection<UInt8>) -> [UInt8] {
        var hash = SHA256()
        for part in [Array(method.utf8), Array(path.utf8), Array((contentType ?? "").utf8)] {
            hash.update(data: withUnsafeBytes(of: UInt64(part.count).littleEndian) { Array($0) })
            hash.update(data: part)
        }
        hash.update(data: withUnsafeBytes(of: UInt64(body.count).littleEndian) { Array($0) })
        hash.update(data: Array(body))
        return Array(hash.finalize())
    }

    /// What the services are told in place of the key: a digest of the person, the route and
    /// the key (64 hex digits), so a request the edge runs again (its first holder died, or an
    /// edge replica retried) does its work once there too.
    public static func serviceKey(person: String, route: String, key: String) -> String {
        SHA256.hash(data: Array("\(person.utf8.count):\(person)\n\(route.utf8.count):\(route)\n\(key)".utf8)).lowercaseHex
    }

    /// The services' key of operation `part` of a keyed batch.
    public static func partKey(_ serviceKey: String, part: Int) -> String {
        SHA256.hash(data: Array("\(serviceKey)\n#\(part)".utf8)).lowercaseHex
    }

    /// The plant id a keyed `POST /v1/plants` (or a keyed batch's part) chooses: a UUID made
    /// from the service key, so a repeat answers the plant the first one added.
    public static func plantID(serviceKey: String) -> String {
        let digest = Array(SHA256.hash(data: Array("plant\n\(serviceKey)".utf8)))
        var bytes = Array(digest.prefix(16))
        bytes[6] = (bytes[6] & 0x0F) | 0x80 // version 8: a custom UUID (RFC 9562)
        bytes[8] = (bytes[8] & 0x3F) | 0x80
        let hex = bytes.lowercaseHex
        let parts = [hex.prefix(8), hex.dropFirst(8).prefix(4), hex.dropFirst(12).prefix(4), hex.dropFirst(16).prefix(4), hex.dropFirst(20)]
        return parts.joined(separator: "-")
    }
}

/// What one person may hold in a store of keys (``IdempotencyKeys``' figures unless a test
/// makes them small).
public struct IdempotencyLimits: Sendable {
    public var keysPerPerson = IdempotencyKeys.maximumKeysPerPerson
    public var bytesPerPerson = IdempotencyKeys.maximumBytesPerPerson

    public init(keysPerPerson: Int = IdempotencyKeys.maximumKeysPerPerson, bytesPerPerson: Int = IdempotencyKeys.maximumBytesPerPerson) {
        self.keysPerPerson = keysPerPerson
        self.bytesPerPerson = bytesPerPerson
    }
}

/// A done request's answer, as a repeat gets it again.
public struct KeptAnswer: Sendable, Equatable {
    public var status: Int
    /// The kept headers (``IdempotencyKeys/keptHeaders``), by name.
    public var headers: [[String]]
    public var body: [UInt8]

    public init(status: Int, headers: [[String]], body: [UInt8]) {
        self.status = status
        self.headers = headers
        self.body = body
    }
}

/// One key's record as a store keeps it.
public struct IdempotencyRecord: Sendable, Equatable {
    public var fingerprint: [UInt8]
    /// Who runs the request now (``IdempotencyClaim/holder``) and until when its hold counts;
    /// `nil` once answered.
    public var holder: String?
    public var leaseUntil: Date?
    /// The answer once done (`nil` while running); ``answered`` without one when it was too
    /// large to keep.
    public var answer: KeptAnswer?
    public var answered: Bool

    public init(fingerprint: [UInt8], holder: String?, leaseUntil: Date?, answer: KeptAnswer?, answered: Bool) {
        self.fingerprint = fingerprint
        self.holder = holder
        self.leaseUntil = leaseUntil
        self.answer = answer
        self.answered = answered
    }
}

/// A request asking for its key: who, which route, which key, what request, and who would run it.
public struct IdempotencyClaim: Sendable {
    public var person: String
    public var route: String
    public var key: String
    public var fingerprint: [UInt8]
    /// Unique per request: only the holder may answer or release the key.
    public var holder: String
    /// How long the holder's hold counts before another request may take the key over (the
    /// holder is presumed dead: its edge ended mid-request).
    public var lease: TimeInterval

    public init(person: String, route: String, key: String, fingerprint: [UInt8], holder: String = UUID().uuidString, lease: TimeInterval) {
        self.person = person
        self.route = route
        self.key = key
        self.fingerprint = fingerprint
        self.holder = holder
        self.lease = lease
    }
}

/// What a request finds when it asks for its key.
public enum IdempotencyDecision: Sendable, Equatable {
    /// The key is this request's (new, or taken over from a holder whose lease ended): do the work.
    case proceed
    /// Done before: answer this again.
    case replay(KeptAnswer)
    /// Done before, but its answer was too large to keep.
    case answeredNotKept
    /// The key was used with another request (another body, path or method): 422.
    case otherRequest
    /// Another request with this key is running: 409, try again after `retryAfter` seconds.
    case running(retryAfter: Int)

    /// The rule, for a record found (or none) at `now`: the one place that decides.
    public static func decide(_ record: IdempotencyRecord?, for claim: IdempotencyClaim, now: Date) -> IdempotencyDecision {
        guard let record else { return .proceed }
        guard record.fingerprint == claim.fingerprint else { return .otherRequest }
        if record.answered { return record.answer.map(IdempotencyDecision.replay) ?? .answeredNotKept }
        if let until = record.leaseUntil, until > now {
            // A millisecond off: a lease read back from a store is a double, a whole second may come back a hair over.
            return .running(retryAfter: max(1, min(5, Int((until.timeIntervalSince(now) - 0.001).rounded(.up)))))
        }
        return .proceed // the holder's lease ended: it died mid-request, so this one runs it again
    }
}

/// Where the keys are kept: canopy-api's own store (SQLite beside it, or the PostgreSQL the
/// stack shares), so every replica of the edge sees every key.
public protocol IdempotencyStoring: Sendable {
    /// Looks the key up and, when the request is to run (``IdempotencyDecision/proceed``),
    /// records it as running, held by `claim.holder` until the lease ends, at once for
    /// everyone. An expired record counts as none; a person past their limit of keys
    /// (``IdempotencyLimits``) loses their oldest done ones.
    func claim(_ claim: IdempotencyClaim, now: Date) async throws -> IdempotencyDecision
    /// Keeps the answer for ``IdempotencyKeys/lifetime`` (`nil`: too large, the record says it
    /// was done) if `claim` still holds the key; trims the person's kept bytes to their bound.
    func answer(_ claim: IdempotencyClaim, with answer: KeptAnswer?, now: Date) async throws
    /// Lets the key go (the request failed in a way a retry may mend: a 5xx), if `claim` holds it.
    func release(_ claim: IdempotencyClaim) async throws
    /// Forgets every key of `person` (their account deleted).
    func forgetKeys(of person: String) async throws
}
