import Foundation

/// Checks what `JSONDecoder` lets through before it decodes: a key twice in one object
/// (`JSONDecoder` keeps the first, most JSON readers the last, so two programs would read
/// different requests from the same bytes) and nesting deeper than ``maximumDepth``.
/// Anything else malformed is left to the decoder, which says what is wrong.
///
/// One pass over the bytes; keys are compared after unescaping (`"a"` and `"\u0061"` are the
/// same key), as bytes. Thread-safe: it keeps no state.
public enum JSONShape {
    /// Deepest nesting of objects and arrays a message may have.
    public static let maximumDepth = 64

    /// Throws `badRequest` for a key twice in one object, or nesting past ``maximumDepth``:
    /// the bus's rule, which the HTTP API applies to JSON bodies too.
    public static func check(_ bytes: [UInt8]) throws(CanopyError) {
        var containers: [(isObject: Bool, keys: Set<[UInt8]>, expectingKey: Bool)] = []
        var index = 0
        let count = bytes.count
        while index < count {
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                guard containers.count < maximumDepth else {
                    throw CanopyError(.badRequest, "the JSON nests deeper than \(maximumDepth) levels")
                }
                containers.append((byte == UInt8(ascii: "{"), [], byte == UInt8(ascii: "{")))
                index += 1
            case UInt8(ascii: "}"), UInt8(ascii: "]"):
                if !containers.isEmpty { containers.removeLast() }
                index += 1
            case UInt8(ascii: ","):
                if let last = containers.indices.last, containers[last].isObject { containers[last].expectingKey = true }
                index += 1
            case UInt8(ascii: "\""):
                let start = index + 1
                var end = start
                var escaped = false
                while end < count, bytes[end] != UInt8(ascii: "\"") {
                    if bytes[end] == UInt8(ascii: "\\") {
                        escaped = true
                        end += 1
                    }
                    end += 1
                }
                if let last = containers.indices.last, containers[last].isObject, containers[last].expectingKey {
                    var key = Array(bytes[start..<min(end, count)])
                    if escaped { key = unescaped(key) }
                    guard containers[last].keys.insert(key).inserted else {
                        let name = String(decoding: key.prefix(100), as: UTF8.self)
                        throw CanopyError(.badRequest, "the key '\(name)' appears twice in one object; send each key once")
                    }
                    containers[last].expectingKey = false
                }
                index = end + 1
            default:
                index += 1
            }
        }
    }

    /// The bytes of a JSON string's escaped content, unescaped (what a reader sees).
    private static func unescaped(_ content: [UInt8]) -> [UInt8] {
        let quoted = [UInt8(ascii: "\"")] + content + [UInt8(ascii: "\"")]
        guard let text = try? JSONDecoderBox.decoder.decode(String.self, from: Data(quoted)) else { return content }
        return Array(text.utf8)
    }
}

/// One decoder for the rare escaped key, built once.
private enum JSONDecoderBox {
    static let decoder = JSONDecoder()
}
