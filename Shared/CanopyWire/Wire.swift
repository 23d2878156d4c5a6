import CanopyMessages

/// Canopy's wire protocol, version 2 (`canopy/2`): the frames of every command. `docs/PROTOCOL.md`
/// gives the same in prose.
///
/// Every message starts with the version frame ``version`` and a one-byte command frame.
/// Clients and workers use DEALER sockets; the broker one ROUTER socket, which adds the
/// peer's identity frame in front.
public enum Wire {
    /// The first frame of every message. Version 2 added attachments: frames after the body
    /// of a request, dispatch, worker reply and reply.
    public static let version: [UInt8] = Array("canopy/2".utf8)

    /// Most attachment frames one message may carry.
    public static let maximumAttachments = 64

    /// The one-byte command frame that follows the version frame.
    public enum Command: UInt8, Sendable {
        // client -> broker
        /// `[version, 0x01, correlation, service, operation, header, body]`
        case request = 0x01
        /// `[version, 0x02, correlation]`
        case cancel = 0x02
        // broker -> client
        /// `[version, 0x03, correlation, reply flags, body]`
        case reply = 0x03
        /// `[version, 0x04, correlation, error JSON]`
        case error = 0x04
        // worker -> broker
        /// `[version, 0x10, service, operations JSON, credit (u32 BE)]`
        case ready = 0x10
        /// `[version, 0x11, request id (u64 BE), status (0 ok, 1 error), body or error JSON]`
        case workerReply = 0x11
        /// `[version, 0x12]`
        case workerHeartbeat = 0x12
        /// `[version, 0x13]`
        case workerDisconnect = 0x13
        /// `[version, 0x14]`: take no new requests; replies for held ones still come.
        case drain = 0x14
        /// `[version, 0x15, credit (u32 BE)]`: hold at most this many of my requests from now
        /// on (a worker of several brokers sharing its credit between them).
        case credit = 0x15
        // broker -> worker
        /// `[version, 0x20, request id (u64 BE), operation, header, body]`
        case dispatch = 0x20
        /// `[version, 0x21, request id (u64 BE)]`
        case cancelDispatch = 0x21
        /// `[version, 0x22]`
        case brokerHeartbeat = 0x22
        /// `[version, 0x23, reason]`: register again (READY) or go away.
        case brokerDisconnect = 0x23

        /// The command as a frame (one shared array per command: no allocation per message).
        public var frame: [UInt8] { Self.frames[Int(rawValue)] }

        /// A one-byte frame, shared.
        static func frame(byte: UInt8) -> [UInt8] { frames[Int(byte)] }

        private static let frames: [[UInt8]] = (0...0xFF).map { [UInt8($0)] }
    }

    /// Reply flag bits (the reply flags frame is one byte).
    public enum ReplyFlag {
        /// The reply was shared among coalesced identical requests.
        public static let shared: UInt8 = 0x01
        /// The flags frame of a reply given to one caller, and of one shared.
        static let frames: (alone: [UInt8], shared: [UInt8]) = ([0], [shared])
    }

    /// Worker reply status byte.
    public enum Status {
        /// The body is the reply.
        public static let ok: UInt8 = 0
        /// The body is a ``CanopyError`` as JSON.
        public static let error: UInt8 = 1
    }

    /// Longest service or operation name, in bytes.
    public static let maximumNameLength = 128
    /// Longest correlation id, in bytes.
    public static let maximumCorrelationLength = 64

    /// Whether `name` may name a service or operation: 1 to 128 bytes of lower-case ASCII
    /// letters, digits, `.`, `-` and `_`.
    public static func isValidName(_ bytes: [UInt8]) -> Bool {
        guard !bytes.isEmpty, bytes.count <= maximumNameLength else { return false }
        return bytes.allSatisfy { byte in
            (byte >= 0x61 && byte <= 0x7A) || (byte >= 0x30 && byte <= 0x39) || byte == 0x2E || byte == 0x2D || byte == 0x5F
        }
    }

    // MARK: - Integers

    /// A big-endian 64-bit frame.
    public static func frame(_ value: UInt64) -> [UInt8] {
        withUnsafeBytes(of: value.bigEndian) { Array($0) }
    }

    /// A big-endian 32-bit frame.
    public static func frame(_ value: UInt32) -> [UInt8] {
        withUnsafeBytes(of: value.bigEndian) { Array($0) }
    }

    /// Reads a big-endian 64-bit frame; `nil` unless it is exactly 8 bytes.
    public static func uint64(_ frame: [UInt8]) -> UInt64? {
        guard frame.count == 8 else { return nil }
        return frame.reduce(0) { $0 << 8 | UInt64($1) }
    }

    /// Reads a big-endian 32-bit frame; `nil` unless it is exactly 4 bytes.
    public static func uint32(_ frame: [UInt8]) -> UInt32? {
        guard frame.count == 4 else { return nil }
        return frame.reduce(0) { $0 << 8 | UInt32($1) }
    }
}

/// The small header every request carries: deadline, flags and principal.
///
/// Wire form: timeout in milliseconds (u32 BE, 0 = the broker's default), one flags byte,
/// then the principal (the user id the edge authenticated), empty when none.
///
/// A principal is 1 to ``maximumPrincipalLength`` bytes of printable ASCII (`0x21`–`0x7E`: no
/// spaces, no control characters, no Unicode). Two principals are the same person exactly
/// when their bytes are equal; keeping them ASCII means no layer (Swift `String` equality,
/// a database collation, a JSON library) can find two different ids "equal" by Unicode
/// equivalence. User ids such as UUIDs, `user-42` or `auth0|5f2c` fit.
public struct RequestHeader: Sendable, Equatable {
    /// Flag bits.
    public enum Flag {
        /// The caller knows the operation is idempotent (the broker trusts the worker's
        /// declaration, not this bit).
        public static let idempotent: UInt8 = 0x01
        /// A service made the request (caused by another request or its own schedule), not a
        /// person through the edge; replay leaves such requests to the services.
        public static let derived: UInt8 = 0x02
    }

    /// Milliseconds the caller will wait; 0 means the broker's default.
    public var timeoutMilliseconds: UInt32
    /// Flag bits, see ``Flag``.
    public var flags: UInt8
    /// The authenticated user id, empty when the request is not on someone's behalf.
    public var principal: String

    /// - Parameters:
    ///   - timeoutMilliseconds: how long the caller waits; 0 for the broker's default.
    ///   - flags: flag bits.
    ///   - principal: the authenticated user id, or empty.
    public init(timeoutMilliseconds: UInt32, flags: UInt8 = 0, principal: String = "") {
        self.timeoutMilliseconds = timeoutMilliseconds
        self.flags = flags
        self.principal = principal
    }

    /// The header's frame.
    public var frame: [UInt8] {
        var bytes = Wire.frame(timeoutMilliseconds)
        bytes.append(flags)
        bytes.append(contentsOf: principal.utf8)
        return bytes
    }

    /// Longest principal, in bytes (the same in bodies: ``Field/principal(_:_:)``).
    public static let maximumPrincipalLength = Field.maximumPrincipalBytes

    /// Whether `bytes` may be a principal: 1 to 256 bytes of printable ASCII.
    public static func isValidPrincipal<Bytes: Collection<UInt8>>(_ bytes: Bytes) -> Bool {
        !bytes.isEmpty && bytes.count <= maximumPrincipalLength && bytes.allSatisfy { $0 >= 0x21 && $0 <= 0x7E }
    }

    /// Parses a header frame; `nil` when it is shorter than 5 bytes or the principal is not
    /// 1 to 256 bytes of printable ASCII.
    public init?(frame: [UInt8]) {
        guard frame.count >= 5, frame.count <= 5 + Self.maximumPrincipalLength else { return nil }
        timeoutMilliseconds = UInt32(frame[0]) << 24 | UInt32(frame[1]) << 16 | UInt32(frame[2]) << 8 | UInt32(frame[3])
        flags = frame[4]
        let principal = frame[5...]
        guard principal.isEmpty || Self.isValidPrincipal(principal) else { return nil }
        self.principal = String(decoding: principal, as: UTF8.self)
    }
}
