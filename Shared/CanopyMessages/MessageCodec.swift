import Foundation

/// Encodes and decodes message bodies: JSON with sorted keys, so equal requests are equal
/// bytes, and dates as ISO 8601 with fractional seconds.
///
/// Build one and keep it: encoders and decoders are not built per message. Safe to share
/// between tasks; each call uses its own encoder state.
public struct MessageCodec: Sendable {
    private let encoder: JSONEncoder
    private let decoder: JSONDecoder

    /// Makes a codec with Canopy's wire settings.
    public init() {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .custom { date, encoder in
            var container = encoder.singleValueContainer()
            try container.encode(date.formatted(Self.dateStyle))
        }
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .custom { decoder in
            let container = try decoder.singleValueContainer()
            let text = try container.decode(String.self)
            if let date = try? Self.dateStyle.parse(text) { return date }
            if let date = try? Date.ISO8601FormatStyle().parse(text) { return date }
            throw DecodingError.dataCorruptedError(
                in: container, debugDescription: "expected an ISO 8601 date such as 2026-03-29T09:00:00.000Z, got \(text)")
        }
        self.encoder = encoder
        self.decoder = decoder
    }

    private static let dateStyle = Date.ISO8601FormatStyle(includingFractionalSeconds: true)

    /// The wire bytes of a value.
    public func encode<T: Encodable>(_ value: T) throws -> [UInt8] {
        [UInt8](try encoder.encode(value))
    }

    /// Decodes a value, turning any decoding failure into a ``CanopyError/Code/badRequest``
    /// that says what was wrong.
    public func decode<T: Decodable>(_ type: T.Type, from bytes: [UInt8]) throws(CanopyError) -> T {
        do {
            return try decoder.decode(type, from: Data(bytes))
        } catch let error as DecodingError {
            throw CanopyError(.badRequest, "invalid JSON for \(T.self): \(Self.describe(error))")
        } catch {
            throw CanopyError(.badRequest, "invalid JSON for \(T.self): \(error)")
        }
    }

    private static func describe(_ error: DecodingError) -> String {
        func path(_ context: DecodingError.Context) -> String {
            let keys = context.codingPath.map { $0.intValue.map(String.init) ?? $0.stringValue }
            return keys.isEmpty ? "" : " at \(keys.joined(separator: "."))"
        }
        switch error {
        case .dataCorrupted(let context):
            return "the body is not valid JSON\(path(context)): \(context.debugDescription)"
        case .keyNotFound(let key, let context):
            return "missing key '\(key.stringValue)'\(path(context))"
        case .typeMismatch(let type, let context):
            return "expected \(type)\(path(context))"
        case .valueNotFound(let type, let context):
            return "missing \(type) value\(path(context))"
        @unknown default:
            return String(describing: error)
        }
    }
}
