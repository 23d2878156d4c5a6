import CanopyMessages

/// Canopy's wire protocol, version 4 (`canopy/4`): the frames of every command. `docs/PROTOCOL.md`
/// gives the same in prose.
///
/// Every message starts with the version frame ``version`` and a one-byte command frame.
/// Clients and workers use DEALER sockets; the broker one ROUTER socket, which adds the
/// peer's identity frame in front.
public enum Wire {
    /// The first frame of every message. Version 2 added attachments: frames after the body
    /// of a request, dispatch, worker reply and reply; version 3 the trace context in the
    /// request header (``RequestHeader/Flag/traced``); version 4 batches between broker and
    /// workers (``Command/dispatchBatch`` and ``Command/workerReplyBatch``).
    public static let version: [UInt8] = Array("canopy/4".utf8)

    /// Most attachment frames one message may carry.
    public static let maximumAttachments = 64

    /// Most requests one ``Command/dispatchBatch`` carries, and most replies one
    /// ``Command/workerReplyBatch``: 2 + 4 × 31 frames stay within the 128 a receiver keeps of
    /// one message.
    public static let maximumBatch = 31

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
        /// `[version, 0x16, (request id (u64 BE), status, body or error JSON) × 1 to 31]`:
        /// replies without attachments, several in one message.
        case workerReplyBatch = 0x16
        // broker -> worker
        /// `[version, 0x20, request id (u64 BE), operation, header, body]`
        case dispatch = 0x20
        /// `[version, 0x21, request id (u64 BE)]`
        case cancelDispatch = 0x21
        /// `[version, 0x22]`
        case brokerHeartbeat = 0x22
        /// `[version, 0x23, reason]`: register again (READY) or go away.
        case brokerDisconnect = 0x23
        /// `[version, 0x24, (request id (u64 BE), operation, header, body) × 1 to 31]`:
        /// requests without attachments, several in one message.
        case dispatchBatch = 0x24

        /// The command as a frame (one shared array per command: no allocation per message).
        public var frame: [UInt8] { Self.frames[Int(rawValue)] }

        /// A one-byte frame, shared.
        @usableFromInline
        static func frame(byte: UInt8) -> [UInt8] { frames[Int(byte)] }

        private static let frames: [[UInt8]] = (0...0xFF).map { [UInt8($0)] }
    }

    /// Reply flag bits (the reply flags frame is one byte).
    public enum ReplyFlag {
        /// The reply was shared among coalesced identical requests.
        public static let shared: UInt8 = 0x01
        /// The flags frame of a reply given to one caller, and of one shared.
        @usableFromInline
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
    @inlinable
    public static func isValidName<Bytes: Collection<UInt8>>(_ bytes: Bytes) -> Bool {
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
    @inlinable
    public static func uint64<Bytes: Collection<UInt8>>(_ frame: Bytes) -> UInt64? {
        guard frame.count == 8 else { return nil }
        return frame.reduce(0) { $0 << 8 | UInt64($1) }
    }

    /// Reads a big-endian 32-bit frame; `nil` unless it is exactly 4 bytes.
    @inlinable
    public static func uint32<Bytes: Collection<UInt8>>(_ frame: Bytes) -> UInt32? {
        guard frame.count == 4 else { return nil }
        return frame.reduce(0) { $0 << 8 | UInt32($1) }
    }
}

/// The small header every request carries: deadline, flags, trace context and principal.
///
/// Wire form: timeout in milliseconds (u32 BE, 0 = the broker's default), one flags byte,
/// then, when the flags have ``Flag/traced``, the 25-byte trace context (``TraceContext``),
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
        /// A trace context follows the flags byte (protocol version 3): the request belongs
        /// to a sampled trace. Set and cleared through ``RequestHeader/trace``.
        public static let traced: UInt8 = 0x04
    }

    /// Milliseconds the caller will wait; 0 means the broker's default.
    public var timeoutMilliseconds: UInt32
    /// Flag bits, see ``Flag``.
    public var flags: UInt8
    /// The authenticated user id, empty when the request is not on someone's behalf.
    public var principal: String
    /// The span that made the request, when it is part of a sampled trace; ``Flag/traced``
    /// follows it.
    public var trace: TraceContext? {
        didSet { flags = trace == nil ? flags & ~Flag.traced : flags | Flag.traced }
    }

    /// - Parameters:
    ///   - timeoutMilliseconds: how long the caller waits; 0 for the broker's default.
    ///   - flags: flag bits (``Flag/traced`` follows `trace`).
    ///   - principal: the authenticated user id, or empty.
    ///   - trace: the calling span, when it is sampled.
    public init(timeoutMilliseconds: UInt32, flags: UInt8 = 0, principal: String = "", trace: TraceContext? = nil) {
        self.timeoutMilliseconds = timeoutMilliseconds
        self.flags = trace == nil ? flags & ~Flag.traced : flags | Flag.traced
        self.principal = principal
        self.trace = trace
    }

    /// The header's frame.
    public var frame: [UInt8] {
        var bytes = Wire.frame(timeoutMilliseconds)
        bytes.append(flags)
        if let trace { trace.append(to: &bytes) }
        bytes.append(contentsOf: principal.utf8)
        return bytes
    }

    /// Longest principal, in bytes (the same in bodies: ``Field/principal(_:_:)``).
    public static let maximumPrincipalLength = Field.maximumPrincipalBytes

    /// Longest header frame: timeout, flags, trace context and the longest principal.
    public static let maximumFrameLength = 5 + TraceContext.byteCount + maximumPrincipalLength

    /// Whether `bytes` may be a principal: 1 to 256 bytes of printable ASCII.
    @inlinable
    public static func isValidPrincipal<Bytes: Collection<UInt8>>(_ bytes: Bytes) -> Bool {
        !bytes.isEmpty && bytes.count <= maximumPrincipalLength && bytes.allSatisfy { $0 >= 0x21 && $0 <= 0x7E }
    }

    /// Parses a header frame; `nil` when it is shorter than 5 bytes, a trace context its flags
    /// announce is missing or invalid, or the principal is not 1 to 256 bytes of printable
    /// ASCII.
    @inlinable
    public init?<Bytes: Collection<UInt8>>(frame: Bytes) where Bytes.Index == Int {
        guard frame.count >= 5, frame.count <= Self.maximumFrameLength else { return nil }
        let start = frame.startIndex
        timeoutMilliseconds = UInt32(frame[start]) << 24 | UInt32(frame[start + 1]) << 16 | UInt32(frame[start + 2]) << 8 | UInt32(frame[start + 3])
        flags = frame[start + 4]
        var principalStart = start + 5
        if flags & Flag.traced != 0 {
            guard frame.count >= 5 + TraceContext.byteCount, let trace = TraceContext(bytes: frame[(start + 5)..<(start + 5 + TraceContext.byteCount)]) else {
                return nil
            }
            self.trace = trace
            principalStart += TraceContext.byteCount
        } else {
            trace = nil
        }
        let principal = frame[principalStart...]
        guard principal.isEmpty || Self.isValidPrincipal(principal) else { return nil }
        self.principal = String(decoding: principal, as: UTF8.self)
    }
}

/// A W3C trace context in 25 bytes: the trace id (16), the id of the span that made the
/// request (8) and the trace flags (1; bit 0 sampled), as in a `traceparent` header
/// (`00-<trace id>-<span id>-<flags>`, https://www.w3.org/TR/trace-context/). Neither id may
/// be all zeros.
public struct TraceContext: Sendable, Hashable {
    /// The trace id's high and low 8 bytes.
    public var traceHigh: UInt64, traceLow: UInt64
    /// The calling span's id.
    public var spanID: UInt64
    /// The trace flags; bit 0: sampled.
    public var flags: UInt8

    /// Bytes on the wire.
    public static let byteCount = 25

    public init?(traceHigh: UInt64, traceLow: UInt64, spanID: UInt64, flags: UInt8) {
        guard traceHigh | traceLow != 0, spanID != 0 else { return nil }
        (self.traceHigh, self.traceLow, self.spanID, self.flags) = (traceHigh, traceLow, spanID, flags)
    }

    /// Whether the trace is sampled (recorded).
    public var isSampled: Bool { flags & 0x01 != 0 }

    /// Reads 25 bytes; `nil` when either id is zero.
    @inlinable
    public init?<Bytes: Collection<UInt8>>(bytes: Bytes) where Bytes.Index == Int {
        guard bytes.count == Self.byteCount else { return nil }
        let start = bytes.startIndex
        func word(_ offset: Int) -> UInt64 { (0..<8).reduce(0) { $0 << 8 | UInt64(bytes[start + offset + $1]) } }
        self.init(traceHigh: word(0), traceLow: word(8), spanID: word(16), flags: bytes[start + 24])
    }

    /// Appends the 25 bytes.
    public func append(to bytes: inout [UInt8]) {
        for word in [traceHigh, traceLow, spanID] {
            withUnsafeBytes(of: word.bigEndian) { bytes.append(contentsOf: $0) }
        }
        bytes.append(flags)
    }

    /// Parses a `traceparent` value, version `00`; `nil` when it is not one.
    public init?(traceparent: String) {
        let utf8 = Array(traceparent.utf8)
        guard utf8.count >= 55, utf8[0] == UInt8(ascii: "0"), utf8[1] == UInt8(ascii: "0"),
            utf8[2] == UInt8(ascii: "-"), utf8[35] == UInt8(ascii: "-"), utf8[52] == UInt8(ascii: "-"),
            utf8.count == 55 || utf8[55] == UInt8(ascii: "-"),
            let high = Self.hex(utf8[3..<19]), let low = Self.hex(utf8[19..<35]),
            let span = Self.hex(utf8[36..<52]), let flags = Self.hex(utf8[53..<55])
        else { return nil }
        self.init(traceHigh: high, traceLow: low, spanID: span, flags: UInt8(flags))
    }

    /// The `traceparent` value: `00-<32 hex>-<16 hex>-<2 hex>`.
    public var traceparent: String { "00-\(traceID)-\(Self.hex(spanID, digits: 16))-\(Self.hex(UInt64(flags), digits: 2))" }

    /// The trace id as 32 lower-case hexadecimal digits.
    public var traceID: String { Self.hex(traceHigh, digits: 16) + Self.hex(traceLow, digits: 16) }

    /// The span id as 16 lower-case hexadecimal digits.
    public var spanIDText: String { Self.hex(spanID, digits: 16) }

    static func hex(_ value: UInt64, digits: Int) -> String {
        let text = String(value, radix: 16)
        return String(repeating: "0", count: digits - text.count) + text
    }

    static func hex(_ digits: ArraySlice<UInt8>) -> UInt64? {
        var value: UInt64 = 0
        for digit in digits {
            switch digit {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): value = value << 4 | UInt64(digit - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): value = value << 4 | UInt64(digit - UInt8(ascii: "a") + 10)
            default: return nil // W3C: lower case only
            }
        }
        return value
    }
}
