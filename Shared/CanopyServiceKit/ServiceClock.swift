import Foundation

/// The time a service goes by: the system's, or one injected for tests and replays
/// (`--clock`), so that schedule times, `addedAt` and `createdAt` come out the same on every
/// run and replayed answers can be compared exactly.
public struct ServiceClock: Sendable, Equatable, CustomStringConvertible {
    enum Mode: Sendable, Equatable {
        case system
        /// Always this instant.
        case fixed(Date)
        /// The system's time moved by this many seconds (a clock that began at an instant
        /// when the process started, and runs).
        case shifted(TimeInterval)
    }

    let mode: Mode

    init(mode: Mode) {
        self.mode = mode
    }

    /// The system's clock.
    public static let system = ServiceClock(mode: .system)

    /// A clock stopped at `instant`.
    public static func fixed(_ instant: Date) -> ServiceClock { ServiceClock(mode: .fixed(instant)) }

    /// Now, by this clock.
    public func now() -> Date {
        switch mode {
        case .system: Date()
        case .fixed(let instant): instant
        case .shifted(let seconds): Date(timeIntervalSinceNow: seconds)
        }
    }

    /// Parses `system`, `fixed:2026-11-24T09:00:00Z` (stopped there),
    /// `from:2026-11-24T09:00:00Z` (starting there now, and running), or
    /// `from:2026-11-24T09:00:00Z,at:2026-11-26T10:00:00.250Z` (standing there at that
    /// instant of the system's clock, and running: every process given it keeps the same
    /// time, whenever it started; what a fresh replay stack runs on).
    public init?(parsing text: String) {
        if text == "system" {
            mode = .system
            return
        }
        let formatter = ISO8601DateFormatter()
        func instant(_ value: Substring) -> Date? {
            // The formatter takes trailing text it does not read: only a date-time's characters here.
            guard value.allSatisfy({ "0123456789-:.TZ+".contains($0) }) else { return nil }
            formatter.formatOptions = [.withInternetDateTime]
            if let date = formatter.date(from: String(value)) { return date }
            formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
            return formatter.date(from: String(value))
        }
        if text.hasPrefix("fixed:"), let date = instant(text.dropFirst(6)) {
            mode = .fixed(date)
        } else if text.hasPrefix("from:"), case let parts = text.dropFirst(5).split(separator: ",", maxSplits: 1), parts.count == 2,
            parts[1].hasPrefix("at:"), let date = instant(parts[0]), let at = instant(parts[1].dropFirst(3))
        {
            mode = .shifted(date.timeIntervalSince(at))
        } else if text.hasPrefix("from:"), !text.contains(","), let date = instant(text.dropFirst(5)) {
            mode = .shifted(date.timeIntervalSinceNow)
        } else {
            return nil
        }
    }

    public var description: String {
        switch mode {
        case .system: "system"
        case .fixed(let instant): "fixed:\(instant.formatted(.iso8601))"
        case .shifted(let seconds): "from:\(Date(timeIntervalSinceNow: seconds).formatted(.iso8601))"
        }
    }
}
