import Foundation

/// A request type that checks its own fields: every field has a limit in bytes and a range,
/// checked here, in one place per type. ``OperationHandlers`` (CanopyBus) calls
/// ``validate()`` on every decoded request before its handler runs, so a handler never sees
/// a value out of range and a store is never asked to keep one.
public protocol Validatable {
    /// Throws `badRequest` (or `tooLarge` for a field over its size) naming the field.
    func validate() throws(CanopyError)
}

/// The checks fields are made of; each error names the field and its limit.
public enum Field {
    /// Earliest date any request may carry.
    public static let earliestDate = Date(timeIntervalSince1970: 0)
    /// Latest date any request may carry (2200-01-01).
    public static let latestDate = Date(timeIntervalSince1970: 7_258_118_400)

    /// Text of at most `maximumBytes` UTF-8 bytes (bytes, not characters: one character with
    /// thousands of combining marks counts as what it weighs). Control characters are refused,
    /// but for line breaks and tabs where `multiline`.
    public static func text(_ value: String?, _ name: String, maximumBytes: Int, required: Bool = false, multiline: Bool = false) throws(CanopyError) {
        guard let value else {
            if required { throw CanopyError(.badRequest, "\(name) is required", field: name) }
            return
        }
        let bytes = value.utf8.count
        guard bytes <= maximumBytes else {
            throw CanopyError(.tooLarge, "\(name) is \(bytes) bytes; the limit is \(maximumBytes) bytes of UTF-8", field: name)
        }
        if required, value.allSatisfy(\.isWhitespace) {
            throw CanopyError(.badRequest, "\(name) must not be empty", field: name)
        }
        for scalar in value.unicodeScalars where scalar.value < 0x20 || scalar.value == 0x7F {
            if multiline, scalar == "\n" || scalar == "\t" || scalar == "\r" { continue }
            throw CanopyError(.badRequest, "\(name) contains a control character (U+\(String(scalar.value, radix: 16, uppercase: true)))", field: name)
        }
    }

    /// A whole number within `range`.
    public static func integer(_ value: Int?, _ name: String, _ range: ClosedRange<Int>) throws(CanopyError) {
        guard let value else { return }
        guard range.contains(value) else {
            throw CanopyError(.badRequest, "\(name) is \(value); it must be from \(range.lowerBound) to \(range.upperBound)", field: name)
        }
    }

    /// A finite number within `range`.
    public static func number(_ value: Double?, _ name: String, _ range: ClosedRange<Double>) throws(CanopyError) {
        guard let value else { return }
        guard value.isFinite, range.contains(value) else {
            throw CanopyError(.badRequest, "\(name) is \(value); it must be from \(range.lowerBound) to \(range.upperBound)", field: name)
        }
    }

    /// A date from 1970 to 2200.
    public static func date(_ value: Date?, _ name: String) throws(CanopyError) {
        guard let value else { return }
        guard value >= earliestDate, value < latestDate else {
            throw CanopyError(.badRequest, "\(name) must be from 1970-01-01 to 2199-12-31", field: name)
        }
    }

    /// A list of at most `maximumCount` items, each checked by `each` (with the item's
    /// name, e.g. `commonNames[3]`).
    public static func list<Item>(
        _ values: [Item], _ name: String, maximumCount: Int,
        each: (Item, String) throws(CanopyError) -> Void
    ) throws(CanopyError) {
        guard values.count <= maximumCount else {
            throw CanopyError(.tooLarge, "\(name) has \(values.count) items; the limit is \(maximumCount)", field: name)
        }
        for (index, value) in values.enumerated() {
            try each(value, "\(name)[\(index)]")
        }
    }

    /// The most bytes a principal (a user id) has, on the wire and in a body.
    public static let maximumPrincipalBytes = 256

    /// A principal named in a body (the keys of a ``Lookup``), by the header's rule: 1 to
    /// ``maximumPrincipalBytes`` bytes of printable ASCII, compared as bytes.
    public static func principal(_ value: String, _ name: String) throws(CanopyError) {
        let bytes = value.utf8
        guard !bytes.isEmpty, bytes.count <= maximumPrincipalBytes, bytes.allSatisfy({ $0 >= 0x21 && $0 <= 0x7E }) else {
            throw CanopyError(.badRequest, "\(name) must be 1 to \(maximumPrincipalBytes) bytes of printable ASCII (a user id)", field: name)
        }
    }

    /// An identifier: 1 to `maximumBytes` bytes of ASCII letters, digits, `.`, `_`, `:` and `-`.
    public static func identifier(_ value: String?, _ name: String, maximumBytes: Int = 128) throws(CanopyError) {
        guard let value else { return }
        guard !value.isEmpty, value.utf8.count <= maximumBytes,
            value.utf8.allSatisfy({ byte in
                (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A) || byte == 0x2E || byte == 0x5F
                    || byte == 0x3A || byte == 0x2D
            })
        else {
            throw CanopyError(.badRequest, "\(name) must be 1 to \(maximumBytes) ASCII letters, digits, '.', '_', ':' or '-'", field: name)
        }
    }
}
