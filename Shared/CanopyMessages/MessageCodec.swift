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
            try container.encode(WireDate.format(date) ?? date.formatted(Self.dateStyle))
        }
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .custom { decoder in
            let container = try decoder.singleValueContainer()
            let text = try container.decode(String.self)
            switch WireDate.parse(text) {
            case .date(let date): return date
            case .invalid:
                throw DecodingError.dataCorruptedError(in: container, debugDescription: "\(text) is not a date that exists")
            case .other: break
            }
            if let date = try? Self.dateStyle.parse(text) { return date }
            if let date = try? Date.ISO8601FormatStyle().parse(text) { return date }
            throw DecodingError.dataCorruptedError(
                in: container, debugDescription: "expected an ISO 8601 date such as 2026-03-29T09:00:00.000Z, got \(text)")
        }
        self.encoder = encoder
        self.decoder = decoder
    }

    private static let dateStyle = Date.ISO8601FormatStyle(includingFractionalSeconds: true)

    /// One codec for code that keeps none of its own (protocol extensions): building a
    /// codec's encoder and decoder is not done per message.
    public static let shared = MessageCodec()

    /// A date as the wire writes it, `2026-03-29T09:00:00.000Z` (the HTTP API too).
    public static func string(from date: Date) -> String {
        WireDate.format(date) ?? date.formatted(dateStyle)
    }

    /// A date the wire would take: ISO 8601, with or without fractions, `Z` or an offset;
    /// `nil` for anything else, and for dates that do not exist (February 30).
    public static func date(from text: String) -> Date? {
        switch WireDate.parse(text) {
        case .date(let date): return date
        case .invalid: return nil
        case .other: return (try? dateStyle.parse(text)) ?? (try? Date.ISO8601FormatStyle().parse(text))
        }
    }

    /// The wire bytes of a value.
    public func encode<T: Encodable>(_ value: T) throws -> [UInt8] {
        [UInt8](try encoder.encode(value))
    }

    /// Decodes a value, turning any decoding failure into a ``CanopyError/Code/badRequest``
    /// that says what was wrong.
    public func decode<T: Decodable>(_ type: T.Type, from bytes: [UInt8]) throws(CanopyError) -> T {
        try JSONShape.check(bytes)
        do {
            return try decoder.decode(type, from: Data(bytes))
        } catch let error as DecodingError {
            if case .dataCorrupted(let context) = error, context.codingPath.isEmpty, let field = misfitNumber(in: bytes, for: type) {
                // Valid JSON whose number does not fit its field: this decoder reports it without a path.
                throw CanopyError(
                    .badRequest,
                    "invalid value for \(T.self): the number at '\(field.path)' (\(field.text)) does not fit its field; whole numbers are integers from -2^63 to 2^63-1"
                )
            }
            throw CanopyError(.badRequest, "invalid JSON for \(T.self): \(Self.describe(error))")
        } catch {
            throw CanopyError(.badRequest, "invalid JSON for \(T.self): \(error)")
        }
    }

    /// When `bytes` are valid JSON that fails to decode as `T` for one number (a fraction or a
    /// number past 64 bits where a whole number is expected), that number's key path. Found by
    /// setting each such number to 0 in turn and decoding again; only on the error path.
    private func misfitNumber<T: Decodable>(in bytes: [UInt8], for type: T.Type) -> (path: String, text: String)? {
        guard let object = try? JSONSerialization.jsonObject(with: Data(bytes), options: [.fragmentsAllowed]) else { return nil }
        var candidates: [(path: [Any], text: String)] = []
        func collect(_ value: Any, _ path: [Any]) {
            guard candidates.count < 64, path.count < 16 else { return }
            if let dictionary = value as? [String: Any] {
                for (key, child) in dictionary { collect(child, path + [key]) }
            } else if let array = value as? [Any] {
                for (index, child) in array.prefix(256).enumerated() { collect(child, path + [index]) }
            } else if let number = value as? NSNumber { // true and false are whole, never candidates
                let double = number.doubleValue
                if double != double.rounded() || abs(double) >= 9.2e18 { candidates.append((path, number.stringValue)) }
            }
        }
        collect(object, [])
        func replacing(_ value: Any, at path: ArraySlice<Any>) -> Any {
            guard let first = path.first else { return 0 }
            if let key = first as? String, var dictionary = value as? [String: Any], let child = dictionary[key] {
                dictionary[key] = replacing(child, at: path.dropFirst())
                return dictionary
            }
            if let index = first as? Int, var array = value as? [Any], array.indices.contains(index) {
                array[index] = replacing(array[index], at: path.dropFirst())
                return array
            }
            return value
        }
        for candidate in candidates {
            guard let data = try? JSONSerialization.data(withJSONObject: replacing(object, at: candidate.path[...]), options: [.fragmentsAllowed]) else {
                continue
            }
            do {
                _ = try decoder.decode(type, from: data)
            } catch DecodingError.dataCorrupted(let context) where context.codingPath.isEmpty {
                continue // still the same failure: not this number
            } catch {}
            return (candidate.path.map { "\($0)" }.joined(separator: "."), candidate.text)
        }
        return nil
    }

    private static func describe(_ error: DecodingError) -> String {
        func path(_ context: DecodingError.Context) -> String {
            let keys = context.codingPath.map { $0.intValue.map(String.init) ?? $0.stringValue }
            return keys.isEmpty ? "" : " at \(keys.joined(separator: "."))"
        }
        switch error {
        case .dataCorrupted(let context) where !context.codingPath.isEmpty:
            // Valid JSON, but a value its field cannot hold (1.5 or 2^64 for a whole number).
            return "the value\(path(context)) is out of range for its field: \(context.debugDescription)"
        case .dataCorrupted(let context):
            return "the body is not valid JSON: \(context.debugDescription)"
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
