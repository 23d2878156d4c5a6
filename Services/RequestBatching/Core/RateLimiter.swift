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

    /// Takes a token for `user` at `now` (seconds); `nil` when there was one, else the seconds
    /// until there is.
    mutating func take(_ user: String, now: Double) -> Double? {
        var bucket = buckets[user] ?? (burst, now)
        bucket.tokens = min(burst, bucket.tokens + max(0, now - bucket.at) * rate)
        bucket.at = now
        guard bucket.tokens >= 1 else {
            buckets[user] = bucket
            return (1 - bucket.tokens) / rate
        }
        bucket.tokens -= 1
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

    init(rate: Double, burst: Double, capacity: Int = 100_000) {
        buckets = Mutex(TokenBuckets(rate: rate, burst: burst, capacity: capacity))
    }

    /// `nil` when `user` may go on, else whole seconds to wait (for `Retry-After`).
    func take(_ user: String) -> Int? {
        let elapsed = ContinuousClock.now - start
        let now = elapsed.seconds
        return buckets.withLock { $0.take(user, now: now) }.map { Int($0.rounded(.up)) }
    }
}
