/// Decides which repeated warnings are written: at most ``burst`` lines per reason in each
/// ``window``; the rest are counted, and the count is reported once the window ends. A peer
/// that sends 20,000 malformed messages costs a few log lines, not megabytes.
///
/// A pure value: the time is an argument. Not thread-safe; one owner (a loop thread).
public struct LogRateLimiter {
    /// What to do with one warning.
    public enum Decision: Equatable, Sendable {
        /// Write it.
        case write
        /// Drop it (it is counted).
        case suppress
    }

    /// Lines written per reason in one window.
    public let burst: Int
    /// How long a window lasts.
    public let window: Duration

    private struct Entry {
        var windowStart: ContinuousClock.Instant
        var written = 0
        var suppressed = 0
    }

    private var entries: [String: Entry] = [:]

    /// - Parameters:
    ///   - burst: lines written per reason in one window.
    ///   - window: how long a window lasts.
    public init(burst: Int = 5, window: Duration = .seconds(10)) {
        self.burst = burst
        self.window = window
    }

    /// Whether to write a warning for `reason` now.
    public mutating func decide(_ reason: String, now: ContinuousClock.Instant) -> Decision {
        var entry = entries[reason] ?? Entry(windowStart: now)
        defer { entries[reason] = entry }
        if entry.written < burst {
            entry.written += 1
            return .write
        }
        entry.suppressed += 1
        return .suppress
    }

    /// Ends the windows that are over and returns, per reason, how many warnings each
    /// suppressed (only reasons that suppressed some). Call it now and then (each loop pass).
    public mutating func endWindows(now: ContinuousClock.Instant) -> [(reason: String, suppressed: Int)] {
        guard !entries.isEmpty else { return [] } // the usual pass: nothing was warned about
        var report: [(reason: String, suppressed: Int)] = []
        for (reason, entry) in entries where now - entry.windowStart >= window {
            if entry.suppressed > 0 { report.append((reason, entry.suppressed)) }
            entries[reason] = nil
        }
        return report.sorted { $0.reason < $1.reason }
    }
}
