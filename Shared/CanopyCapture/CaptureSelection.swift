import Foundation

/// A time in a capture: an instant, or an offset from the capture's first record.
public enum CaptureTime: Equatable, Sendable {
    /// Nanoseconds since 1970.
    case instant(Int64)
    /// Nanoseconds after the first record.
    case sinceStart(Int64)

    /// Parses ISO 8601 (`2026-11-24T21:00:00Z`, fractions allowed) or `+SECONDS`.
    public init?(_ text: String) {
        if text.hasPrefix("+") {
            guard let seconds = Double(text.dropFirst()), seconds.isFinite, seconds >= 0, seconds < 1e9 else { return nil }
            self = .sinceStart(Int64(seconds * 1e9))
            return
        }
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        guard let date = formatter.date(from: text) ?? ISO8601DateFormatter().date(from: text) else { return nil }
        self = .instant(Int64(date.timeIntervalSince1970 * 1e9))
    }

    func resolved(start: Int64) -> Int64 {
        switch self {
        case .instant(let nanoseconds): nanoseconds
        case .sinceStart(let offset): start + offset
        }
    }
}

/// Which records `canopy capture filter` keeps. A request is kept when it matches every
/// given criterion (services, operations, principals, times: each empty or nil matches all);
/// an answer is kept when its request was, and, when its request is not in the capture (it
/// began before the capture did), when it matches itself.
public struct CaptureSelection {
    public var services: Set<String>
    public var operations: Set<String>
    public var principals: Set<String>
    public var from: CaptureTime?
    public var to: CaptureTime?

    private struct Pending: Hashable {
        let client: String
        let correlation: [UInt8]
    }

    /// Requests kept whose answers have not come yet (Majordomo requests, which have no
    /// correlation id, are counted per client and answered in order).
    private var pending: [Pending: Int] = [:]
    private var seen: Set<Pending> = []
    private var start: Int64?

    public init(services: Set<String> = [], operations: Set<String> = [], principals: Set<String> = [], from: CaptureTime? = nil, to: CaptureTime? = nil) {
        self.services = services
        self.operations = operations
        self.principals = principals
        self.from = from
        self.to = to
    }

    public mutating func keeps(_ record: CaptureRecord) -> Bool {
        if start == nil { start = record.time }
        let key = Pending(client: record.client, correlation: record.correlation)
        switch record.kind {
        case .request:
            seen.insert(key)
            guard matches(record) else { return false }
            pending[key, default: 0] += 1
            return true
        case .reply:
            if let count = pending[key] {
                pending[key] = count > 1 ? count - 1 : nil
                if count == 1 { seen.remove(key) }
                return true
            }
            if seen.contains(key) {
                if record.correlation.isEmpty { return false } // a Majordomo client's earlier request, not kept
                seen.remove(key)
                return false
            }
            return matches(record)
        case .mark:
            // A snapshot's mark stays while the capture keeps its beginning (a later start
            // leaves out requests the snapshot does not hold).
            return from == nil
        }
    }

    private func matches(_ record: CaptureRecord) -> Bool {
        if !services.isEmpty, !services.contains(record.service) { return false }
        if !operations.isEmpty, !operations.contains(record.operation) { return false }
        if !principals.isEmpty, !principals.contains(record.header.principal) { return false }
        let start = self.start ?? record.time
        if let from, record.time < from.resolved(start: start) { return false }
        if let to, record.time >= to.resolved(start: start) { return false }
        return true
    }
}
