import Metrics

/// Feeds swift-metrics counters from running totals kept elsewhere (a broker's or a cache's
/// own statistics): each call advances a counter by what its total grew since the last call.
/// A total that went down started again (a service that lost its last worker), and counts
/// from zero. Not thread-safe: one owner, or a lock around it.
public struct CounterTotals {
    private var last: [String: UInt64] = [:]

    public init() {}

    /// Advances `counter` to `total`; `name` tells this total apart from the others.
    public mutating func advance(_ counter: Counter, _ name: String, to total: UInt64) {
        let before = last[name] ?? 0
        let delta = total >= before ? total - before : total
        if delta > 0 { counter.increment(by: Int64(clamping: delta)) }
        last[name] = total
    }
}
