import CanopyMessages

/// Every message of canopy/4 as a value: one case per command, encoded and decoded in one
/// place (``encoded`` and ``init(frames:)``). `docs/PROTOCOL.md` gives the same in prose, and
/// the golden fixtures pin the bytes.
///
/// The frames never include the routing identity a ROUTER socket adds in front.
public enum WireMessage: Equatable, Sendable {
    // MARK: client -> broker

    /// `[version, 0x01, correlation, service, operation, header, body, attachment...]`
    case request(WireRequest)
    /// `[version, 0x02, correlation]`: the caller gave up on that request.
    case cancel(correlation: [UInt8])

    // MARK: broker -> client

    /// `[version, 0x03, correlation, flags, body, attachment...]`; `shared` is flag bit 0.
    case reply(correlation: [UInt8], shared: Bool, body: [UInt8], attachments: [[UInt8]] = [])
    /// `[version, 0x04, correlation, error JSON]`; the correlation is empty when the message
    /// that caused it had none.
    case error(correlation: [UInt8], error: [UInt8])

    // MARK: worker -> broker

    /// `[version, 0x10, service, operations JSON, credit (u32 BE)]`
    case ready(service: String, operations: [OperationDescriptor], credit: UInt32)
    /// `[version, 0x11, request id (u64 BE), status (0 ok, 1 error), body or error JSON, attachment...]`
    case workerReply(requestID: UInt64, failed: Bool, body: [UInt8], attachments: [[UInt8]] = [])
    /// `[version, 0x12]`
    case workerHeartbeat
    /// `[version, 0x13]`
    case workerDisconnect
    /// `[version, 0x14]`: take no new requests; replies for held ones still come.
    case drain
    /// `[version, 0x15, credit (u32 BE, 0–100000)]`: the worker's credit at this broker from now on.
    case credit(UInt32)
    /// `[version, 0x16, (request id (u64 BE), status, body or error JSON) × 1 to 31]`: several
    /// replies without attachments in one message.
    case workerReplyBatch([BatchedReply])

    // MARK: broker -> worker

    /// `[version, 0x20, request id (u64 BE), operation, header, body, attachment...]`
    case dispatch(requestID: UInt64, operation: String, header: RequestHeader, body: [UInt8], attachments: [[UInt8]] = [])
    /// `[version, 0x21, request id (u64 BE)]`
    case cancelDispatch(requestID: UInt64)
    /// `[version, 0x22, frame limit (u64 BE)]`: the registration stands, and no frame may be
    /// larger than the limit.
    case brokerHeartbeat(maximumFrameBytes: UInt64)
    /// `[version, 0x23, reason]`: register again (READY) or go away.
    case brokerDisconnect(reason: String)
    /// `[version, 0x24, (request id (u64 BE), operation, header, body) × 1 to 31]`: several
    /// requests without attachments in one message.
    case dispatchBatch([BatchedDispatch])

    /// The command frame's byte.
    public var command: Wire.Command {
        switch self {
        case .request: .request
        case .cancel: .cancel
        case .reply: .reply
        case .error: .error
        case .ready: .ready
        case .workerReply: .workerReply
        case .workerHeartbeat: .workerHeartbeat
        case .workerDisconnect: .workerDisconnect
        case .drain: .drain
        case .credit: .credit
        case .workerReplyBatch: .workerReplyBatch
        case .dispatch: .dispatch
        case .cancelDispatch: .cancelDispatch
        case .brokerHeartbeat: .brokerHeartbeat
        case .brokerDisconnect: .brokerDisconnect
        case .dispatchBatch: .dispatchBatch
        }
    }

    /// One reply of a ``workerReplyBatch(_:)``: a ``workerReply(requestID:failed:body:attachments:)``
    /// without attachments.
    public struct BatchedReply: Equatable, Sendable {
        public var requestID: UInt64
        public var failed: Bool
        public var body: [UInt8]

        public init(requestID: UInt64, failed: Bool, body: [UInt8]) {
            self.requestID = requestID
            self.failed = failed
            self.body = body
        }
    }

    /// One request of a ``dispatchBatch(_:)``: a ``dispatch(requestID:operation:header:body:attachments:)``
    /// without attachments.
    public struct BatchedDispatch: Equatable, Sendable {
        public var requestID: UInt64
        public var operation: String
        public var header: RequestHeader
        public var body: [UInt8]

        public init(requestID: UInt64, operation: String, header: RequestHeader, body: [UInt8]) {
            self.requestID = requestID
            self.operation = operation
            self.header = header
            self.body = body
        }
    }
}

/// A client's request, as it crosses the wire.
public struct WireRequest: Equatable, Sendable {
    /// The client's id for the request: 1 to 64 bytes, echoed in the reply.
    public var correlation: [UInt8]
    /// The service's name (see ``Wire/isValidName(_:)``).
    public var service: String
    /// The operation's name (see ``Wire/isValidName(_:)``).
    public var operation: String
    /// Deadline, flags and principal.
    public var header: RequestHeader
    /// The body, JSON from Codable with sorted keys.
    public var body: [UInt8]
    /// Frames of their own beside the body (photo bytes), compared as bytes like the body.
    public var attachments: [[UInt8]]

    /// - Parameters:
    ///   - correlation: the client's id for the request.
    ///   - service: the service's name.
    ///   - operation: the operation's name.
    ///   - header: deadline, flags and principal.
    ///   - body: the request body.
    ///   - attachments: frames of their own beside the body.
    public init(correlation: [UInt8], service: String, operation: String, header: RequestHeader, body: [UInt8], attachments: [[UInt8]] = []) {
        self.correlation = correlation
        self.service = service
        self.operation = operation
        self.header = header
        self.body = body
        self.attachments = attachments
    }
}

/// Why frames are not a canopy/4 message: what is wrong, in words a peer's developer can
/// act on, and the correlation id when the message had a usable one (so the refusal can
/// answer the request it refuses).
public struct WireDecodingError: Error, Equatable, Sendable, CustomStringConvertible {
    /// What kind of problem it is; also the short reason the broker logs.
    public enum Reason: String, Sendable {
        case wrongVersion = "message without the canopy/4 version frame"
        case unknownCommand = "unknown command"
        case wrongFrameCount = "wrong number of frames"
        case malformedCorrelation = "malformed correlation id"
        case invalidName = "invalid service or operation name"
        case malformedHeader = "malformed request header"
        case malformedInteger = "malformed integer frame"
        case malformedOperations = "malformed operation list"
    }

    /// What kind of problem it is.
    public let reason: Reason
    /// The command the message named, when it named a known one.
    public internal(set) var command: Wire.Command?
    /// The message's correlation id when it had a well-formed one, else empty.
    public let correlation: [UInt8]
    /// The whole explanation.
    public let description: String

    /// The same error, saying which command the message named.
    @usableFromInline
    func naming(_ command: Wire.Command) -> WireDecodingError {
        var named = self
        named.command = command
        return named
    }

    @usableFromInline
    init(_ reason: Reason, correlation: [UInt8] = [], _ description: String) {
        self.reason = reason
        self.correlation = correlation
        self.description = description
    }
}

extension WireMessage {
    /// The message's frames, ready to send.
    public var encoded: [[UInt8]] {
        var writer = ArrayFrameWriter()
        write(into: &writer) // an ArrayFrameWriter cannot fail
        return writer.frames
    }

    /// The bytes of the message's frames together (what it costs in a queue, framing aside).
    public var byteCount: Int {
        var counter = ByteCountingWriter()
        write(into: &counter)
        return counter.bytes
    }

    /// Writes the message's frames to `writer`, in order, the last one with `more` false.
    @inlinable
    public func write<Writer: FrameWriter>(into writer: inout Writer) throws(Writer.Failure) {
        try writer.write(Wire.version, more: true)
        switch self {
        case .request(let request):
            try writer.write(Wire.Command.request.frame, more: true)
            try writer.write(request.correlation, more: true)
            try writer.write(request.service, more: true)
            try writer.write(request.operation, more: true)
            try writer.write(request.header, more: true)
            try writer.write(body: request.body, attachments: request.attachments)
        case .cancel(let correlation):
            try writer.write(Wire.Command.cancel.frame, more: true)
            try writer.write(correlation, more: false)
        case .reply(let correlation, let shared, let body, let attachments):
            try writer.write(Wire.Command.reply.frame, more: true)
            try writer.write(correlation, more: true)
            try writer.write(shared ? Wire.ReplyFlag.frames.shared : Wire.ReplyFlag.frames.alone, more: true)
            try writer.write(body: body, attachments: attachments)
        case .error(let correlation, let error):
            try writer.write(Wire.Command.error.frame, more: true)
            try writer.write(correlation, more: true)
            try writer.write(error, more: false)
        case .ready(let service, let operations, let credit):
            try writer.write(Wire.Command.ready.frame, more: true)
            try writer.write(service, more: true)
            try writer.write((try? MessageCodec().encode(operations)) ?? Array("[]".utf8), more: true)
            try writer.write(Wire.frame(credit), more: false)
        case .workerReply(let id, let failed, let body, let attachments):
            try writer.write(Wire.Command.workerReply.frame, more: true)
            try writer.write(id, more: true)
            try writer.write(Wire.Command.frame(byte: failed ? Wire.Status.error : Wire.Status.ok), more: true)
            try writer.write(body: body, attachments: attachments)
        case .workerHeartbeat, .workerDisconnect, .drain:
            try writer.write(command.frame, more: false)
        case .credit(let credit):
            try writer.write(Wire.Command.credit.frame, more: true)
            try writer.write(Wire.frame(credit), more: false)
        case .workerReplyBatch(let replies):
            // An empty batch ends at its command (and is refused when decoded), never left open.
            try writer.write(Wire.Command.workerReplyBatch.frame, more: !replies.isEmpty)
            for (index, reply) in replies.enumerated() {
                try writer.write(reply.requestID, more: true)
                try writer.write(Wire.Command.frame(byte: reply.failed ? Wire.Status.error : Wire.Status.ok), more: true)
                try writer.write(reply.body, more: index < replies.count - 1)
            }
        case .dispatch(let id, let operation, let header, let body, let attachments):
            try writer.write(Wire.Command.dispatch.frame, more: true)
            try writer.write(id, more: true)
            try writer.write(operation, more: true)
            try writer.write(header, more: true)
            try writer.write(body: body, attachments: attachments)
        case .cancelDispatch(let id):
            try writer.write(Wire.Command.cancelDispatch.frame, more: true)
            try writer.write(id, more: false)
        case .brokerHeartbeat(let limit):
            try writer.write(Wire.Command.brokerHeartbeat.frame, more: true)
            try writer.write(limit, more: false)
        case .brokerDisconnect(let reason):
            try writer.write(Wire.Command.brokerDisconnect.frame, more: true)
            try writer.write(reason, more: false)
        case .dispatchBatch(let requests):
            try writer.write(Wire.Command.dispatchBatch.frame, more: !requests.isEmpty)
            for (index, request) in requests.enumerated() {
                try writer.write(request.requestID, more: true)
                try writer.write(request.operation, more: true)
                try writer.write(request.header, more: true)
                try writer.write(request.body, more: index < requests.count - 1)
            }
        }
    }

    /// Decodes frames (without a ROUTER's identity frame) into a message. Generic over where
    /// the frames are held: only the frames the message keeps (correlation id, body,
    /// attachments) are copied into arrays when they are not arrays already.
    ///
    /// - Throws: ``WireDecodingError`` naming what is wrong: the version, the command, the
    ///   number of frames, or the field that is malformed.
    @inlinable
    public init<Frames: FrameList>(frames: Frames) throws(WireDecodingError) {
        let reader = FrameReader(frames: frames)
        guard frames.count >= 2, frames.frame(0, equals: Wire.version) else {
            let seen = frames.count > 0 ? frames.withFrame(0) { String(decoding: $0.prefix(32), as: UTF8.self) } : ""
            throw WireDecodingError(
                .wrongVersion, correlation: reader.likelyCorrelation,
                "unsupported protocol version '\(seen)'; Canopy speaks \(Wire.versionText) (or Majordomo MDPC01/MDPW01)")
        }
        guard frames.byteCount(1) == 1, let command = Wire.Command(rawValue: frames.withFrame(1) { $0[0] }) else {
            throw WireDecodingError(
                .unknownCommand, correlation: reader.likelyCorrelation, "unknown command frame; this peer speaks \(Wire.versionText) (see docs/PROTOCOL.md)")
        }
        do {
            self = try Self.decode(reader, command)
        } catch {
            throw error.naming(command)
        }
    }

    @inlinable
    static func decode<Frames: FrameList>(_ reader: FrameReader<Frames>, _ command: Wire.Command) throws(WireDecodingError) -> WireMessage {
        let frames = reader.frames
        switch command {
        case .request:
            try reader.expect(
                7, command, attachments: true,
                "a request has 7 frames (version, command, correlation, service, operation, header, body), then up to \(Wire.maximumAttachments) attachments")
            let correlation = try reader.correlation(at: 2)
            guard frames.withFrame(3, Wire.isValidName), frames.withFrame(4, Wire.isValidName) else {
                throw WireDecodingError(
                    .invalidName, correlation: correlation,
                    "service and operation names are 1 to \(Wire.maximumNameLength) characters of a-z, 0-9, '.', '-' and '_'")
            }
            guard let header = frames.withFrame(5, { RequestHeader(frame: $0) }) else {
                throw WireDecodingError(.malformedHeader, correlation: correlation, RequestHeader.formatDescription)
            }
            return .request(
                WireRequest(
                    correlation: correlation, service: reader.string(at: 3), operation: reader.string(at: 4), header: header,
                    body: frames.array(6), attachments: frames.arrays(7..<frames.count)))
        case .cancel:
            try reader.expect(3, command, "a cancel has 3 frames (version, command, correlation)")
            return .cancel(correlation: try reader.correlation(at: 2))
        case .reply:
            try reader.expect(
                5, command, attachments: true,
                "a reply has 5 frames (version, command, correlation, flags, body), then up to \(Wire.maximumAttachments) attachments")
            let correlation = try reader.correlation(at: 2)
            guard frames.byteCount(3) == 1 else { throw WireDecodingError(.malformedInteger, correlation: correlation, "a reply's flags are one byte") }
            return .reply(
                correlation: correlation, shared: frames.withFrame(3) { $0[0] } & Wire.ReplyFlag.shared != 0, body: frames.array(4),
                attachments: frames.arrays(5..<frames.count))
        case .error:
            try reader.expect(4, command, "an error has 4 frames (version, command, correlation, error)")
            guard frames.byteCount(2) <= Wire.maximumCorrelationLength else {
                throw WireDecodingError(.malformedCorrelation, "the correlation id must be at most \(Wire.maximumCorrelationLength) bytes")
            }
            return .error(correlation: frames.array(2), error: frames.array(3))
        case .ready:
            try reader.expect(5, command, "READY has 5 frames (version, command, service, operations, credit)")
            guard frames.withFrame(2, Wire.isValidName) else {
                throw WireDecodingError(.invalidName, "invalid service name; use 1 to \(Wire.maximumNameLength) of a-z, 0-9, '.', '-', '_'")
            }
            guard let operations = try? MessageCodec().decode([OperationDescriptor].self, from: frames.array(3)), !operations.isEmpty,
                operations.allSatisfy({ Wire.isValidName($0.name.utf8) })
            else {
                throw WireDecodingError(.malformedOperations, "operations must be a non-empty JSON array of {name, idempotent, coalescable} with valid names")
            }
            return .ready(service: reader.string(at: 2), operations: operations, credit: try reader.uint32(at: 4, "credit"))
        case .workerReply:
            try reader.expect(
                5, command, attachments: true,
                "a worker reply has 5 frames (version, command, request id, status, body), then up to \(Wire.maximumAttachments) attachments")
            let id = try reader.uint64(at: 2, "request id")
            let failed = try reader.status(at: 3)
            return .workerReply(requestID: id, failed: failed, body: frames.array(4), attachments: frames.arrays(5..<frames.count))
        case .workerHeartbeat:
            try reader.expect(2, command, "a heartbeat has 2 frames (version, command)")
            return .workerHeartbeat
        case .workerDisconnect:
            try reader.expect(2, command, "a disconnect has 2 frames (version, command)")
            return .workerDisconnect
        case .drain:
            try reader.expect(2, command, "a drain has 2 frames (version, command)")
            return .drain
        case .credit:
            try reader.expect(3, command, "a credit has 3 frames (version, command, credit)")
            return .credit(try reader.uint32(at: 2, "credit"))
        case .dispatch:
            try reader.expect(
                6, command, attachments: true,
                "a dispatch has 6 frames (version, command, request id, operation, header, body), then up to \(Wire.maximumAttachments) attachments")
            let (id, operation, header) = try reader.dispatched(at: 2)
            return .dispatch(requestID: id, operation: operation, header: header, body: frames.array(5), attachments: frames.arrays(6..<frames.count))
        case .cancelDispatch:
            try reader.expect(3, command, "a cancel dispatch has 3 frames (version, command, request id)")
            return .cancelDispatch(requestID: try reader.uint64(at: 2, "request id"))
        case .brokerHeartbeat:
            try reader.expect(3, command, "a broker heartbeat has 3 frames (version, command, frame limit)")
            return .brokerHeartbeat(maximumFrameBytes: try reader.uint64(at: 2, "frame limit"))
        case .brokerDisconnect:
            try reader.expect(3, command, "a broker disconnect has 3 frames (version, command, reason)")
            return .brokerDisconnect(reason: frames.withFrame(2) { String(decoding: $0.prefix(512), as: UTF8.self) })
        case .workerReplyBatch:
            try reader.expectBatch(
                of: 3, command, "a worker reply batch has 2 frames (version, command), then 1 to \(Wire.maximumBatch) replies of 3 (request id, status, body)")
            var replies: [BatchedReply] = []
            replies.reserveCapacity((frames.count - 2) / 3)
            for start in stride(from: 2, to: frames.count, by: 3) {
                replies.append(
                    BatchedReply(requestID: try reader.uint64(at: start, "request id"), failed: try reader.status(at: start + 1), body: frames.array(start + 2))
                )
            }
            return .workerReplyBatch(replies)
        case .dispatchBatch:
            try reader.expectBatch(
                of: 4, command,
                "a dispatch batch has 2 frames (version, command), then 1 to \(Wire.maximumBatch) requests of 4 (request id, operation, header, body)")
            var requests: [BatchedDispatch] = []
            requests.reserveCapacity((frames.count - 2) / 4)
            for start in stride(from: 2, to: frames.count, by: 4) {
                let (id, operation, header) = try reader.dispatched(at: start)
                requests.append(BatchedDispatch(requestID: id, operation: operation, header: header, body: frames.array(start + 3)))
            }
            return .dispatchBatch(requests)
        }
    }
}

/// Reads the fields of one message's frames, throwing what is wrong with each.
@usableFromInline
struct FrameReader<Frames: FrameList> {
    @usableFromInline let frames: Frames

    @inlinable
    init(frames: Frames) { self.frames = frames }

    /// Frame 2 when it could be a correlation id (for refusing a message that is wrong
    /// before its fields were read), else empty.
    @inlinable
    var likelyCorrelation: [UInt8] {
        frames.count > 2 && frames.byteCount(2) <= Wire.maximumCorrelationLength ? frames.array(2) : []
    }

    /// Checks the number of frames: exactly `count`, or with `attachments`, `count` and up to
    /// ``Wire/maximumAttachments`` more.
    @inlinable
    func expect(_ count: Int, _ command: Wire.Command, attachments: Bool = false, _ explanation: @autoclosure () -> String) throws(WireDecodingError) {
        guard frames.count == count || (attachments && frames.count > count && frames.count - count <= Wire.maximumAttachments) else {
            let correlation = [.request, .cancel, .reply, .error].contains(command) ? likelyCorrelation : []
            throw WireDecodingError(.wrongFrameCount, correlation: correlation, "\(explanation()), got \(frames.count)")
        }
    }

    /// Checks a batch's frames: the version and command, then 1 to ``Wire/maximumBatch`` groups
    /// of `group` frames each.
    @inlinable
    func expectBatch(of group: Int, _ command: Wire.Command, _ explanation: @autoclosure () -> String) throws(WireDecodingError) {
        let entries = (frames.count - 2) / group
        guard frames.count > 2, (frames.count - 2) % group == 0, entries <= Wire.maximumBatch else {
            throw WireDecodingError(.wrongFrameCount, "\(explanation()), got \(frames.count) frames")
        }
    }

    /// A worker reply's status frame: whether it says the body is an error.
    @inlinable
    func status(at index: Int) throws(WireDecodingError) -> Bool {
        let status = frames.byteCount(index) == 1 ? frames.withFrame(index) { $0[0] } : UInt8.max
        guard status <= Wire.Status.error else {
            throw WireDecodingError(.malformedInteger, "a worker reply's status is one byte, 0 (ok) or 1 (error)")
        }
        return status == Wire.Status.error
    }

    /// A dispatched request's id, operation and header, from frame `index` on.
    @inlinable
    func dispatched(at index: Int) throws(WireDecodingError) -> (UInt64, String, RequestHeader) {
        let id = try uint64(at: index, "request id")
        guard frames.withFrame(index + 1, Wire.isValidName) else { throw WireDecodingError(.invalidName, "invalid operation name") }
        guard let header = frames.withFrame(index + 2, { RequestHeader(frame: $0) }) else {
            throw WireDecodingError(.malformedHeader, RequestHeader.formatDescription)
        }
        return (id, string(at: index + 1), header)
    }

    @inlinable
    func correlation(at index: Int) throws(WireDecodingError) -> [UInt8] {
        guard (1...Wire.maximumCorrelationLength).contains(frames.byteCount(index)) else {
            throw WireDecodingError(.malformedCorrelation, "the correlation id must be 1 to \(Wire.maximumCorrelationLength) bytes")
        }
        return frames.array(index)
    }

    /// A name frame as text (already checked to be ASCII; short names stay inline,
    /// unallocated). Read as typed bytes: `String(decoding:)` takes its fast path only from
    /// contiguous typed storage, and appends byte by byte from a raw buffer.
    @inlinable
    func string(at index: Int) -> String {
        frames.withFrame(index) { raw in raw.withMemoryRebound(to: UInt8.self) { String(decoding: $0, as: UTF8.self) } }
    }

    @inlinable
    func uint64(at index: Int, _ field: String) throws(WireDecodingError) -> UInt64 {
        guard let value = frames.withFrame(index, Wire.uint64) else { throw WireDecodingError(.malformedInteger, "the \(field) is 8 bytes, big-endian") }
        return value
    }

    @inlinable
    func uint32(at index: Int, _ field: String) throws(WireDecodingError) -> UInt32 {
        guard let value = frames.withFrame(index, Wire.uint32) else { throw WireDecodingError(.malformedInteger, "the \(field) is 4 bytes, big-endian") }
        return value
    }
}

extension Wire {
    /// The version as text, for messages.
    public static var versionText: String { String(decoding: version, as: UTF8.self) }
}

extension RequestHeader {
    /// What a header frame must be, for refusals.
    @usableFromInline
    static let formatDescription =
        "the header frame is malformed: 4-byte timeout, 1 flags byte, the 25-byte trace context when flag 0x04 is set (16-byte trace id, 8-byte span id, neither zero, 1 flags byte), then the principal: empty, or 1 to 256 bytes of printable ASCII (0x21-0x7E; no spaces, no Unicode)"
}
