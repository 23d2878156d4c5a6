import CanopyMessages

/// Every message of canopy/3 as a value: one case per command, encoded and decoded in one
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
        case .dispatch: .dispatch
        case .cancelDispatch: .cancelDispatch
        case .brokerHeartbeat: .brokerHeartbeat
        case .brokerDisconnect: .brokerDisconnect
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

/// Why frames are not a canopy/3 message: what is wrong, in words a peer's developer can
/// act on, and the correlation id when the message had a usable one (so the refusal can
/// answer the request it refuses).
public struct WireDecodingError: Error, Equatable, Sendable, CustomStringConvertible {
    /// What kind of problem it is; also the short reason the broker logs.
    public enum Reason: String, Sendable {
        case wrongVersion = "message without the canopy/3 version frame"
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
        }
    }

    /// Decodes frames (without a ROUTER's identity frame) into a message.
    ///
    /// - Throws: ``WireDecodingError`` naming what is wrong: the version, the command, the
    ///   number of frames, or the field that is malformed.
    public init(frames: [[UInt8]]) throws(WireDecodingError) {
        guard frames.count >= 2, frames[0] == Wire.version else {
            let correlation = frames.count > 2 && frames[2].count <= Wire.maximumCorrelationLength ? frames[2] : []
            let seen = frames.first.map { String(decoding: $0.prefix(32), as: UTF8.self) } ?? ""
            throw WireDecodingError(.wrongVersion, correlation: correlation,
                                    "unsupported protocol version '\(seen)'; Canopy speaks \(Wire.versionText) (or Majordomo MDPC01/MDPW01)")
        }
        guard frames[1].count == 1, let command = Wire.Command(rawValue: frames[1][0]) else {
            let correlation = frames.count > 2 && frames[2].count <= Wire.maximumCorrelationLength ? frames[2] : []
            throw WireDecodingError(.unknownCommand, correlation: correlation, "unknown command frame; this peer speaks \(Wire.versionText) (see docs/PROTOCOL.md)")
        }
        do {
            self = try Self.decode(frames, command)
        } catch {
            var error = error
            error.command = command
            throw error
        }
    }

    private static func decode(_ frames: [[UInt8]], _ command: Wire.Command) throws(WireDecodingError) -> WireMessage {
        let reader = FrameReader(frames: frames, command: command)
        switch command {
        case .request:
            try reader.expect(7, attachments: true, "a request has 7 frames (version, command, correlation, service, operation, header, body), then up to \(Wire.maximumAttachments) attachments")
            let correlation = try reader.correlation(at: 2)
            guard Wire.isValidName(frames[3]), Wire.isValidName(frames[4]) else {
                throw WireDecodingError(.invalidName, correlation: correlation,
                                        "service and operation names are 1 to \(Wire.maximumNameLength) characters of a-z, 0-9, '.', '-' and '_'")
            }
            guard let header = RequestHeader(frame: frames[5]) else {
                throw WireDecodingError(.malformedHeader, correlation: correlation, RequestHeader.formatDescription)
            }
            return .request(WireRequest(correlation: correlation, service: String(decoding: frames[3], as: UTF8.self),
                                        operation: String(decoding: frames[4], as: UTF8.self), header: header, body: frames[6],
                                        attachments: Array(frames[7...])))
        case .cancel:
            try reader.expect(3, "a cancel has 3 frames (version, command, correlation)")
            return .cancel(correlation: try reader.correlation(at: 2))
        case .reply:
            try reader.expect(5, attachments: true, "a reply has 5 frames (version, command, correlation, flags, body), then up to \(Wire.maximumAttachments) attachments")
            let correlation = try reader.correlation(at: 2)
            guard frames[3].count == 1 else { throw WireDecodingError(.malformedInteger, correlation: correlation, "a reply's flags are one byte") }
            return .reply(correlation: correlation, shared: frames[3][0] & Wire.ReplyFlag.shared != 0, body: frames[4], attachments: Array(frames[5...]))
        case .error:
            try reader.expect(4, "an error has 4 frames (version, command, correlation, error)")
            guard frames[2].count <= Wire.maximumCorrelationLength else {
                throw WireDecodingError(.malformedCorrelation, "the correlation id must be at most \(Wire.maximumCorrelationLength) bytes")
            }
            return .error(correlation: frames[2], error: frames[3])
        case .ready:
            try reader.expect(5, "READY has 5 frames (version, command, service, operations, credit)")
            guard Wire.isValidName(frames[2]) else {
                throw WireDecodingError(.invalidName, "invalid service name; use 1 to \(Wire.maximumNameLength) of a-z, 0-9, '.', '-', '_'")
            }
            guard let operations = try? MessageCodec().decode([OperationDescriptor].self, from: frames[3]), !operations.isEmpty,
                  operations.allSatisfy({ Wire.isValidName(Array($0.name.utf8)) })
            else {
                throw WireDecodingError(.malformedOperations, "operations must be a non-empty JSON array of {name, idempotent, coalescable} with valid names")
            }
            return .ready(service: String(decoding: frames[2], as: UTF8.self), operations: operations, credit: try reader.uint32(at: 4, "credit"))
        case .workerReply:
            try reader.expect(5, attachments: true, "a worker reply has 5 frames (version, command, request id, status, body), then up to \(Wire.maximumAttachments) attachments")
            let id = try reader.uint64(at: 2, "request id")
            guard frames[3].count == 1, frames[3][0] <= Wire.Status.error else {
                throw WireDecodingError(.malformedInteger, "a worker reply's status is one byte, 0 (ok) or 1 (error)")
            }
            return .workerReply(requestID: id, failed: frames[3][0] == Wire.Status.error, body: frames[4], attachments: Array(frames[5...]))
        case .workerHeartbeat:
            try reader.expect(2, "a heartbeat has 2 frames (version, command)")
            return .workerHeartbeat
        case .workerDisconnect:
            try reader.expect(2, "a disconnect has 2 frames (version, command)")
            return .workerDisconnect
        case .drain:
            try reader.expect(2, "a drain has 2 frames (version, command)")
            return .drain
        case .credit:
            try reader.expect(3, "a credit has 3 frames (version, command, credit)")
            return .credit(try reader.uint32(at: 2, "credit"))
        case .dispatch:
            try reader.expect(6, attachments: true, "a dispatch has 6 frames (version, command, request id, operation, header, body), then up to \(Wire.maximumAttachments) attachments")
            let id = try reader.uint64(at: 2, "request id")
            guard Wire.isValidName(frames[3]) else { throw WireDecodingError(.invalidName, "invalid operation name") }
            guard let header = RequestHeader(frame: frames[4]) else { throw WireDecodingError(.malformedHeader, RequestHeader.formatDescription) }
            return .dispatch(requestID: id, operation: String(decoding: frames[3], as: UTF8.self), header: header, body: frames[5], attachments: Array(frames[6...]))
        case .cancelDispatch:
            try reader.expect(3, "a cancel dispatch has 3 frames (version, command, request id)")
            return .cancelDispatch(requestID: try reader.uint64(at: 2, "request id"))
        case .brokerHeartbeat:
            try reader.expect(3, "a broker heartbeat has 3 frames (version, command, frame limit)")
            return .brokerHeartbeat(maximumFrameBytes: try reader.uint64(at: 2, "frame limit"))
        case .brokerDisconnect:
            try reader.expect(3, "a broker disconnect has 3 frames (version, command, reason)")
            return .brokerDisconnect(reason: String(decoding: frames[2].prefix(512), as: UTF8.self))
        }
    }
}

/// Reads the fields of one message's frames, throwing what is wrong with each.
private struct FrameReader {
    let frames: [[UInt8]]
    let command: Wire.Command

    /// Checks the number of frames: exactly `count`, or with `attachments`, `count` and up to
    /// ``Wire/maximumAttachments`` more.
    func expect(_ count: Int, attachments: Bool = false, _ explanation: String) throws(WireDecodingError) {
        guard frames.count == count || (attachments && frames.count > count && frames.count - count <= Wire.maximumAttachments) else {
            let correlation = [.request, .cancel, .reply, .error].contains(command) && frames.count > 2
                && frames[2].count <= Wire.maximumCorrelationLength ? frames[2] : []
            throw WireDecodingError(.wrongFrameCount, correlation: correlation, "\(explanation), got \(frames.count)")
        }
    }

    func correlation(at index: Int) throws(WireDecodingError) -> [UInt8] {
        let correlation = frames[index]
        guard !correlation.isEmpty, correlation.count <= Wire.maximumCorrelationLength else {
            throw WireDecodingError(.malformedCorrelation, "the correlation id must be 1 to \(Wire.maximumCorrelationLength) bytes")
        }
        return correlation
    }

    func uint64(at index: Int, _ field: String) throws(WireDecodingError) -> UInt64 {
        guard let value = Wire.uint64(frames[index]) else { throw WireDecodingError(.malformedInteger, "the \(field) is 8 bytes, big-endian") }
        return value
    }

    func uint32(at index: Int, _ field: String) throws(WireDecodingError) -> UInt32 {
        guard let value = Wire.uint32(frames[index]) else { throw WireDecodingError(.malformedInteger, "the \(field) is 4 bytes, big-endian") }
        return value
    }
}

extension Wire {
    /// The version as text, for messages.
    public static var versionText: String { String(decoding: version, as: UTF8.self) }
}

extension RequestHeader {
    /// What a header frame must be, for refusals.
    static let formatDescription = "the header frame is malformed: 4-byte timeout, 1 flags byte, the 25-byte trace context when flag 0x04 is set (16-byte trace id, 8-byte span id, neither zero, 1 flags byte), then the principal: empty, or 1 to 256 bytes of printable ASCII (0x21-0x7E; no spaces, no Unicode)"
}
