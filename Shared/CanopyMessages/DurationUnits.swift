/// A `Duration` in the units the project counts in: the one place a duration becomes a
/// number (timeouts on the wire in milliseconds, latencies in micro- or nanoseconds, rates per
/// second). Each reads `components` once: it divides a 128-bit count of attoseconds, which
/// showed in the broker's profile when read twice a conversion.
extension Duration {
    /// In seconds, with fractions.
    public var seconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }

    /// Whole milliseconds, rounded down, at least zero.
    public var wholeMilliseconds: Int64 {
        let (seconds, attoseconds) = components
        return max(0, seconds * 1_000 + attoseconds / 1_000_000_000_000_000)
    }

    /// Whole microseconds, rounded down.
    public var microseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000 + attoseconds / 1_000_000_000_000
    }

    /// Whole nanoseconds, rounded down.
    public var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}
