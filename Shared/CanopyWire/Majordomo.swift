/// Majordomo Protocol 7/MDP v0.1 (rfc.zeromq.org/spec/7), as the broker speaks it so that
/// existing Majordomo clients and workers in other languages work with Canopy.
///
/// Frames as the broker's ROUTER sees them, after the peer's identity:
/// - client request: `["", "MDPC01", service, body...]`; reply: `["", "MDPC01", service, body...]`
/// - worker: `["", "MDPW01", command, ...]` with READY 0x01 `[service]`, REQUEST 0x02
///   `[client address, "", body...]`, REPLY 0x03 `[client address, "", body...]`,
///   HEARTBEAT 0x04, DISCONNECT 0x05.
///
/// How the two protocols meet (docs/PROTOCOL.md has the full text):
/// - a Majordomo client calls a Canopy service with the body `[operation, JSON body]` and
///   gets `["ok", JSON reply]` or `["error", JSON error]`;
/// - a Canopy client calls a Majordomo worker's service with any operation; the worker gets
///   the body `[operation, JSON body]` and its first reply frame is the Canopy reply body;
/// - a Majordomo client and a Majordomo worker talk through Canopy as through any Majordomo
///   broker: bodies pass untouched.
public enum Majordomo {
    /// The client protocol header frame.
    public static let client: [UInt8] = Array("MDPC01".utf8)
    /// The worker protocol header frame.
    public static let worker: [UInt8] = Array("MDPW01".utf8)

    /// Worker commands (one byte).
    public enum Command: UInt8, Sendable {
        case ready = 0x01
        case request = 0x02
        case reply = 0x03
        case heartbeat = 0x04
        case disconnect = 0x05

        /// The command as a frame.
        public var frame: [UInt8] { [rawValue] }
    }

    /// The Majordomo Management Interface service that says whether a service exists.
    public static let serviceQuery = "mmi.service"
    /// The prefix of every MMI service.
    public static let managementPrefix = "mmi."

    /// The first reply frame to a Majordomo client of a Canopy service on success.
    public static let ok: [UInt8] = Array("ok".utf8)
    /// The first reply frame to a Majordomo client when the call failed; the second frame is
    /// the error as JSON.
    public static let error: [UInt8] = Array("error".utf8)
}

/// Every Majordomo (7/MDP v0.1) message the broker reads or writes, as a value: one case per
/// command, encoded and decoded in one place, like ``WireMessage`` for canopy/3. The frames
/// start with the empty delimiter a REQ socket adds (after the ROUTER's identity frame).
public enum MajordomoMessage: Equatable, Sendable {
    /// `["", "MDPC01", service, body...]`: a client's request, or the reply to it.
    case client(service: [UInt8], body: [[UInt8]])
    /// `["", "MDPW01", 0x01, service]`
    case ready(service: [UInt8])
    /// `["", "MDPW01", 0x02, client address, "", body...]`
    case request(client: [UInt8], body: [[UInt8]])
    /// `["", "MDPW01", 0x03, client address, "", body...]`
    case reply(client: [UInt8], body: [[UInt8]])
    /// `["", "MDPW01", 0x04]`
    case heartbeat
    /// `["", "MDPW01", 0x05]`
    case disconnect

    /// Whether `frames` claim to be Majordomo: an empty delimiter, then MDPC01 or MDPW01.
    @inlinable
    public static func claims<Frames: FrameList>(_ frames: Frames) -> Bool {
        frames.count >= 2 && frames.byteCount(0) == 0 && (frames.frame(1, equals: Majordomo.client) || frames.frame(1, equals: Majordomo.worker))
    }

    /// The message's frames, ready to send.
    public var encoded: [[UInt8]] {
        switch self {
        case .client(let service, let body): [[], Majordomo.client, service] + body
        case .ready(let service): [[], Majordomo.worker, Majordomo.Command.ready.frame, service]
        case .request(let client, let body): [[], Majordomo.worker, Majordomo.Command.request.frame, client, []] + body
        case .reply(let client, let body): [[], Majordomo.worker, Majordomo.Command.reply.frame, client, []] + body
        case .heartbeat: [[], Majordomo.worker, Majordomo.Command.heartbeat.frame]
        case .disconnect: [[], Majordomo.worker, Majordomo.Command.disconnect.frame]
        }
    }

    /// Decodes frames that ``claims(_:)`` Majordomo.
    ///
    /// - Throws: ``WireDecodingError`` naming what is wrong.
    public init(frames: [[UInt8]]) throws(WireDecodingError) {
        guard Self.claims(frames) else {
            throw WireDecodingError(.wrongVersion, "a Majordomo message starts with an empty frame, then MDPC01 or MDPW01")
        }
        if frames[1] == Majordomo.client {
            guard frames.count >= 3, Wire.isValidName(frames[2]) else {
                throw WireDecodingError(.invalidName, "a Majordomo request names its service: 1 to \(Wire.maximumNameLength) of a-z, 0-9, '.', '-', '_'")
            }
            self = .client(service: frames[2], body: Array(frames[3...]))
            return
        }
        guard frames.count >= 3, frames[2].count == 1, let command = Majordomo.Command(rawValue: frames[2][0]) else {
            throw WireDecodingError(.unknownCommand, "a Majordomo worker message has a command byte from 0x01 to 0x05")
        }
        switch command {
        case .ready:
            guard frames.count == 4 else {
                throw WireDecodingError(.wrongFrameCount, "a Majordomo READY has 4 frames (\"\", MDPW01, 0x01, service), got \(frames.count)")
            }
            self = .ready(service: frames[3])
        case .request, .reply:
            guard frames.count >= 5, frames[4].isEmpty else {
                throw WireDecodingError(.wrongFrameCount, "a Majordomo REQUEST or REPLY has the client's address, an empty frame, then the body")
            }
            self = command == .request ? .request(client: frames[3], body: Array(frames[5...])) : .reply(client: frames[3], body: Array(frames[5...]))
        case .heartbeat:
            self = .heartbeat
        case .disconnect:
            self = .disconnect
        }
    }
}
