import CanopyMessages
import Foundation

/// A place in a JSON document, written as `$.plants[3].name`.
public typealias JSONPath = String

/// One way a replayed answer differs from the captured one.
public struct Difference: Codable, Sendable, Equatable {
    /// Where: `$` for the whole answer, `$.plant.name`, `$.tasks[2].due`.
    public var path: JSONPath
    /// The captured value (JSON text), or `(absent)`.
    public var captured: String
    /// The replayed value (JSON text), or `(absent)`.
    public var replayed: String

    public init(path: JSONPath, captured: String, replayed: String) {
        self.path = path
        self.captured = captured
        self.replayed = replayed
    }
}

/// Paths a comparison skips (`--ignore`): `$.plant.createdAt` (from the root), `createdAt`
/// or `plant.createdAt` (at any depth), with `*` for any one key or index
/// (`$.plants[*].addedAt`, `tasks.*.due`).
public struct IgnoredPaths: Sendable {
    private let patterns: [(anchored: Bool, segments: [String])]

    public init(_ patterns: [String]) {
        self.patterns = patterns.map { pattern in
            let anchored = pattern.hasPrefix("$")
            return (anchored, Self.segments(anchored ? String(pattern.dropFirst()) : pattern))
        }
    }

    public var isEmpty: Bool { patterns.isEmpty }

    /// `.a[2].b` → ["a", "2", "b"].
    static func segments(_ path: String) -> [String] {
        path.replacingOccurrences(of: "[", with: ".").replacingOccurrences(of: "]", with: "")
            .split(separator: ".", omittingEmptySubsequences: true).map(String.init)
    }

    func contains(_ path: [String]) -> Bool {
        patterns.contains { anchored, segments in
            guard segments.count <= path.count else { return false }
            if anchored && segments.count != path.count { return false }
            let tail = path.suffix(segments.count)
            return zip(segments, tail).allSatisfy { $0 == "*" || $0 == $1 }
        }
    }
}

/// Ids a replay learned: a captured answer carried X where the replayed one carries Y (a new
/// plant's id, a task's id), so later requests that mention X are sent with Y.
public struct Rebindings: Sendable {
    public private(set) var table: [String: String] = [:]
    /// Most ids remembered (a bound on memory for very long replays).
    public static let limit = 1_000_000

    public init() {}

    public var count: Int { table.count }

    /// Whether a field of this name holds an id: `id`, `…ID`, `…Id`, `…IDs`, `sha256`.
    static func isIdentifierKey(_ key: String) -> Bool {
        key == "id" || key == "sha256" || key.hasSuffix("ID") || key.hasSuffix("Id") || key.hasSuffix("IDs") || key.hasSuffix("Ids")
    }

    /// Learns the ids that differ between a captured and a replayed answer, at the same places.
    public mutating func learn(captured: Any, replayed: Any) {
        walk(captured, replayed, key: nil)
    }

    private mutating func walk(_ captured: Any, _ replayed: Any, key: String?) {
        switch (captured, replayed) {
        case (let captured as [String: Any], let replayed as [String: Any]):
            for (name, value) in captured { if let other = replayed[name] { walk(value, other, key: name) } }
        case (let captured as [Any], let replayed as [Any]):
            for (value, other) in zip(captured, replayed) { walk(value, other, key: key) }
        case (let captured as String, let replayed as String):
            // The first answer that shows an id rebinds it: a later list in another order
            // must not move it to another thing.
            // An id made of learned parts is explained by them (or differs for real): not learned whole.
            if let key, Self.isIdentifierKey(key), captured != replayed, !captured.isEmpty, table[captured] == nil, mapped(captured) == nil,
                table.count < Self.limit
            {
                table[captured] = replayed
            }
        default:
            break
        }
    }

    /// `body` with every string value that is a learned id replaced by its new one; the same
    /// bytes when nothing changes.
    public func rewrite(_ body: [UInt8]) -> [UInt8] { Self.substitute(body, by: table) }

    /// `body` with every string `table` maps (whole, or by `:`-joined parts) replaced; the
    /// same bytes when nothing changes.
    private static func substitute(_ body: [UInt8], by table: [String: String]) -> [UInt8] {
        guard !table.isEmpty, !body.isEmpty, let json = try? JSONSerialization.jsonObject(with: Data(body), options: [.fragmentsAllowed]) else {
            return body
        }
        var changed = false
        func replace(_ json: Any) -> Any {
            switch json {
            case let object as [String: Any]: return object.mapValues(replace)
            case let array as [Any]: return array.map(replace)
            case let text as String:
                if let new = mapped(text, by: table) {
                    changed = true
                    return new
                }
                return text
            default: return json
            }
        }
        let replaced = replace(json)
        guard changed, let data = try? JSONSerialization.data(withJSONObject: replaced, options: [.sortedKeys, .withoutEscapingSlashes, .fragmentsAllowed])
        else {
            return body
        }
        return [UInt8](data)
    }

    /// The new form of `text`: its learned id, or for an id made of learned ids and other
    /// parts joined by `:` (a task's `PLANT:water`), each learned part replaced.
    func mapped(_ text: String) -> String? { Self.mapped(text, by: table) }

    static func mapped(_ text: String, by table: [String: String]) -> String? {
        if let new = table[text] { return new }
        guard text.utf8.count <= 512, text.contains(":") else { return nil }
        var changed = false
        let parts = text.split(separator: ":", omittingEmptySubsequences: false).map { part -> Substring in
            guard part.utf8.count >= 8, let new = table[String(part)] else { return part }
            changed = true
            return Substring(new)
        }
        return changed ? parts.joined(separator: ":") : nil
    }

    /// `body` with every learned new id put back to the captured one (what another replay of
    /// the same capture compares against); the same bytes when nothing changes.
    public func restore(_ body: [UInt8]) -> [UInt8] {
        var inverse: [String: String] = [:]
        for (captured, replayed) in table { inverse[replayed] = captured }
        return Self.substitute(body, by: inverse)
    }

    /// Whether `captured` became `replayed` by a learned id.
    func explains(captured: String, replayed: String) -> Bool {
        mapped(captured) == replayed
    }
}

/// How far a replayed time may be from the captured one and still be the same time: the
/// stack's clock stood `shift` nanoseconds later (or earlier) when the replayed request was
/// sent than when the captured one came, and the service read its clock somewhere between
/// taking the request and answering it, on either side.
public struct TimeWindow: Sendable, Equatable {
    /// Replayed minus captured, as the clocks differed for this request.
    public var shift: Int64
    /// What the difference may fall short of `shift` (the captured request's time at the broker).
    public var below: Int64
    /// What it may pass `shift` by (the replayed request's time in the air, and a tolerance).
    public var above: Int64

    public init(shift: Int64, below: Int64, above: Int64) {
        self.shift = shift
        self.below = below
        self.above = above
    }

    /// Whether `replayed` is `captured` moved by the clocks' difference.
    public func explains(captured: Int64, replayed: Int64) -> Bool {
        let difference = replayed &- captured
        return difference >= shift &- below && difference <= shift &+ above
    }
}

/// Compares two answers as JSON, value by value.
public enum ReplyComparison {
    /// The differences between a captured and a replayed body, skipping `ignored` paths and
    /// ids `rebindings` explain. Bodies that are not JSON are compared as bytes. With
    /// `times`, two date-times that differ by the clocks' shift are the same; the paths where
    /// that happened go to `timed` (`$.tasks[*].due`: indexes as `*`).
    public static func differences(
        captured: [UInt8], replayed: [UInt8], ignored: IgnoredPaths, rebindings: Rebindings, limit: Int = 20,
        times: TimeWindow? = nil, timed: inout Set<String>
    ) -> [Difference] {
        if captured == replayed { return [] }
        guard let left = try? JSONSerialization.jsonObject(with: Data(captured), options: [.fragmentsAllowed]),
            let right = try? JSONSerialization.jsonObject(with: Data(replayed), options: [.fragmentsAllowed])
        else {
            return [Difference(path: "$", captured: "\(captured.count) bytes (not JSON)", replayed: "\(replayed.count) bytes")]
        }
        var found: [Difference] = []
        var context = Context(ignored: ignored, rebindings: rebindings, limit: limit, times: times)
        compare(left, right, path: [], &context, into: &found)
        timed.formUnion(context.timed)
        return found
    }

    /// ``differences(captured:replayed:ignored:rebindings:limit:times:timed:)`` without times.
    public static func differences(captured: [UInt8], replayed: [UInt8], ignored: IgnoredPaths, rebindings: Rebindings, limit: Int = 20) -> [Difference] {
        var timed = Set<String>()
        return differences(captured: captured, replayed: replayed, ignored: ignored, rebindings: rebindings, limit: limit, times: nil, timed: &timed)
    }

    private struct Context {
        let ignored: IgnoredPaths
        let rebindings: Rebindings
        let limit: Int
        let times: TimeWindow?
        var timed = Set<String>()
    }

    static func render(_ path: [String]) -> JSONPath {
        "$" + path.map { segment in Int(segment) != nil ? "[\(segment)]" : ".\(segment)" }.joined()
    }

    static func text(_ value: Any?) -> String {
        guard let value else { return "(absent)" }
        if value is NSNull { return "null" }
        guard let data = try? JSONSerialization.data(withJSONObject: value, options: [.sortedKeys, .withoutEscapingSlashes, .fragmentsAllowed]) else {
            return "\(value)"
        }
        let text = String(decoding: data, as: UTF8.self)
        return text.count > 200 ? String(text.prefix(200)) + "…" : text
    }

    private static func compare(_ left: Any?, _ right: Any?, path: [String], _ context: inout Context, into found: inout [Difference]) {
        guard found.count < context.limit, !(context.ignored.contains(path) && !path.isEmpty) else { return }
        switch (left, right) {
        case (let left as [String: Any], let right as [String: Any]):
            for key in Set(left.keys).union(right.keys).sorted() {
                compare(left[key], right[key], path: path + [key], &context, into: &found)
            }
        case (let left as [Any], let right as [Any]):
            for index in 0..<max(left.count, right.count) {
                compare(index < left.count ? left[index] : nil, index < right.count ? right[index] : nil, path: path + ["\(index)"], &context, into: &found)
            }
        case (let left as String, let right as String):
            guard left != right, !context.rebindings.explains(captured: left, replayed: right) else { return }
            if let window = context.times, let was = WireTime.nanoseconds(left), let now = WireTime.nanoseconds(right),
                window.explains(captured: was, replayed: now)
            {
                context.timed.insert("$" + path.map { Int($0) != nil ? "[*]" : ".\($0)" }.joined())
                return
            }
            found.append(Difference(path: render(path), captured: text(left), replayed: text(right)))
        case (let left as NSNumber, let right as NSNumber):
            if left != right { found.append(Difference(path: render(path), captured: text(left), replayed: text(right))) }
        case (nil, nil), (is NSNull, is NSNull):
            break
        default:
            found.append(Difference(path: render(path), captured: text(left), replayed: text(right)))
        }
    }
}
