/// A `Duration` in the units the project counts in: the one place a duration becomes a
/// number (timeouts on the wire in milliseconds, latencies in micro- or nanoseconds, rates per
/// second).
extension Duration {
    /// In seconds, with fractions.
    public var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }

    /// Whole milliseconds, rounded down, at least zero.
    public var wholeMilliseconds: Int64 { max(0, components.seconds * 1_000 + components.attoseconds / 1_000_000_000_000_000) }

    /// Whole microseconds, rounded down.
    public var microseconds: Int64 { components.seconds * 1_000_000 + components.attoseconds / 1_000_000_000_000 }

    /// Whole nanoseconds, rounded down.
    public var nanoseconds: Int64 { components.seconds * 1_000_000_000 + components.attoseconds / 1_000_000_000 }
}
