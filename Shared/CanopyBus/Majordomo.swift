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
