/// A small, fast, deterministic generator (SplitMix64): the same seed always gives the same
/// numbers, so a made-up photo or a built index is the same on every run.
public struct SplitMix: RandomNumberGenerator, Sendable {
    private var state: UInt64

    /// - Parameter seed: where the sequence starts.
    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A number from `low` up to (not including) `high`.
    public mutating func uniform(_ low: Double, _ high: Double) -> Double {
        low + (high - low) * Double(next() >> 11) / Double(1 << 53)
    }
}
