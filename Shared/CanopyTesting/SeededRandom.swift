import CanopyImaging

/// A small seeded random number generator (SplitMix64) for property tests, so a failing case
/// runs again the same way.
public typealias SeededRandom = SplitMix
