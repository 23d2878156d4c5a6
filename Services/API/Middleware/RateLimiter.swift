import Synchronization

/// Each person's requests as token buckets: `burst` at once, then `rate` a second. A pure
/// value (the time comes in), kept by ``RateLimiter``.
struct TokenBuckets {
    /// Tokens a second.
    let rate: Double
    /// The most tokens a bucket holds: the requests one person may make at once.
    let burst: Double
    /// The most people remembered; past it, full buckets are forgotten first (a full bucket
    /// is the same as none), then any (that person gets a fresh burst).
    let capacity: Int
    private var buckets: [String: (tokens: Double, at: Double)] = [:]

    init(rate: Double, burst: Double, capacity: Int = 100_000) {
        precondition(rate > 0 && burst >= 1 && capacity >= 1, "a bucket fills, holds one request at least, and someone is remembered")
        self.rate = rate
        self.burst = burst
        self.capacity = capacity
    }

    var count: Int { buckets.count }

    /// Takes `cost` tokens (1 unless said) for `user` at `now` (seconds); `nil` when there
    /// were that many, else the seconds until there are. A cost above the burst is taken from a
    /// full bucket (a request never becomes impossible; it waits for the whole burst).
    mutating func take(_ user: String, cost: Double = 1, now: Double) -> Double? {
        var bucket = buckets[user] ?? (burst, now)
        bucket.tokens = min(burst, bucket.tokens + max(0, now - bucket.at) * rate)
        bucket.at = now
        let needed = min(cost, burst)
        guard bucket.tokens >= needed else {
            buckets[user] = bucket
            return (needed - bucket.tokens) / rate
        }
        bucket.tokens -= needed
        if buckets[user] == nil, buckets.count >= capacity { forget(now: now) }
        buckets[user] = bucket
        return nil
    }

    /// Makes room: every bucket full by now goes; if that freed less than a quarter, others go
    /// too, down to three quarters, so that this runs once per many new people.
    private mutating func forget(now: Double) {
        let fill = burst / rate
        buckets = buckets.filter { now - $0.value.at < fill }
        let keep = capacity * 3 / 4
        while buckets.count > keep, let some = buckets.keys.first { buckets[some] = nil }
    }
}

/// ``TokenBuckets`` behind a lock, on the monotonic clock.
final class RateLimiter: Sendable {
    private let buckets: Mutex<TokenBuckets>
    private let start = ContinuousClock.now
    /// Tokens a second.
    let rate: Double

    init(rate: Double, burst: Double, capacity: Int = 100_000) {
        buckets = Mutex(TokenBuckets(rate: rate, burst: burst, capacity: capacity))
        self.rate = rate
    }

    /// `nil` when `user` may go on (`cost` tokens taken), else whole seconds to wait (for
    /// `Retry-After`).
    func take(_ user: String, cost: Double = 1) -> Int? {
        let elapsed = ContinuousClock.now - start
        let now = elapsed.seconds
        return buckets.withLock { $0.take(user, cost: cost, now: now) }.map { max(1, Int($0.rounded(.up))) }
    }
}
