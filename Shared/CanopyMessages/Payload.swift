import Foundation

/// A request's or reply's bytes as they cross the bus: the JSON body, and the attachments
/// that travel as frames of their own beside it (photo bytes, not base64 inside the JSON).
public struct Payload: Sendable, Equatable {
    /// The JSON body.
    public var body: [UInt8]
    /// The attachment frames, in order.
    public var attachments: [[UInt8]]

    /// - Parameters:
    ///   - body: the JSON body.
    ///   - attachments: the attachment frames, in order.
    public init(body: [UInt8], attachments: [[UInt8]] = []) {
        self.body = body
        self.attachments = attachments
    }
}

/// A request or reply whose large byte fields travel as attachments: frames of their own
/// beside the JSON body. Its `Codable` form leaves those fields out; ``attachments`` reads
/// and writes them.
///
/// ```swift
/// struct Upload: AttachmentCarrying {
///     var name: String
///     var data: Data                           // travels as an attachment
///     enum CodingKeys: String, CodingKey { case name } // not in the JSON
///     var attachments: [Data] { get { [data] } set { data = newValue.first ?? Data() } }
/// }
/// ```
public protocol AttachmentCarrying: Codable {
    /// The bytes that travel as attachment frames, in order.
    var attachments: [Data] { get set }
    /// How many attachments a well-formed value has; more or fewer are refused.
    static var attachmentCount: ClosedRange<Int> { get }
}

extension MessageCodec {
    /// The payload of `value`: its JSON, and its attachments when it carries any.
    public func encodePayload<T: Encodable>(_ value: T) throws -> Payload {
        let body = try encode(value)
        guard let carrying = value as? any AttachmentCarrying else { return Payload(body: body) }
        return Payload(body: body, attachments: carrying.attachments.map { [UInt8]($0) })
    }

    /// Decodes `payload` as a `T`: its JSON, then its attachments.
    ///
    /// - Throws: ``CanopyError`` `badRequest` when the JSON does not decode, when attachments
    ///   come with a type that takes none, or when their number is not what the type takes.
    public func decodePayload<T: Decodable>(_ type: T.Type, from payload: Payload) throws(CanopyError) -> T {
        let value = try decode(type, from: payload.body)
        guard var carrying = value as? any AttachmentCarrying else {
            guard payload.attachments.isEmpty else {
                throw CanopyError(.badRequest, "this message takes no attachments; got \(payload.attachments.count)")
            }
            return value
        }
        let expected = Swift.type(of: carrying).attachmentCount
        guard expected.contains(payload.attachments.count) else {
            let count = expected.lowerBound == expected.upperBound ? "\(expected.lowerBound)" : "\(expected.lowerBound) to \(expected.upperBound)"
            throw CanopyError(
                .badRequest,
                "this message takes \(count) attachment(s), the bytes as frames after the JSON (canopy send --attach FILE); got \(payload.attachments.count)")
        }
        carrying.attachments = payload.attachments.map { Data(sharing: $0) }
        return carrying as! T // swiftlint:disable:this force_cast — the same value, its attachments set
    }
}

extension Payload {
    /// The size of the largest frame: the broker's frame limit applies to each.
    public var largestFrame: Int { attachments.reduce(body.count) { max($0, $1.count) } }
}

extension Data {
    /// The bytes of a received frame as `Data`; from 64 KiB up without copying them: the
    /// `Data` points into the array's storage and keeps it alive. Receivers treat attachments
    /// as read-only; a photo of a few megabytes is then copied once less on its way to a
    /// handler.
    init(sharing frame: [UInt8]) {
        guard frame.count >= 64 * 1024 else {
            self.init(frame)
            return
        }
        let pointer = frame.withUnsafeBytes { UnsafeMutableRawPointer(mutating: $0.baseAddress!) }
        self.init(bytesNoCopy: pointer, count: frame.count, deallocator: .custom { _, _ in withExtendedLifetime(frame) {} })
    }
}
