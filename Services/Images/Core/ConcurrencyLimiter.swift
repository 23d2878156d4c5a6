/// Waits its turn: per key, the work running at once weighs at most `maximum`; the rest wait
/// in the order they came (a heavy piece at the head of the line is not overtaken, so it is
/// never starved). Remote fetches are limited per host with weight 1 each; full-size image
/// work for the whole process, a WebP encode weighing more than a streaming JPEG one.
actor ConcurrencyLimiter<Key: Hashable & Sendable> {
    private let maximum: Int
    private var running: [Key: Int] = [:]
    private var waiting: [Key: [(weight: Int, continuation: CheckedContinuation<Void, Never>)]] = [:]

    init(maximum: Int) {
        self.maximum = max(1, maximum)
    }

    /// Runs `work` once `weight` (at most `maximum`) is free under `key`.
    func run<T: Sendable>(_ key: Key, weight: Int = 1, _ work: @Sendable () async throws -> T) async throws -> T {
        let weight = min(max(1, weight), maximum)
        await acquire(key, weight)
        defer { release(key, weight) }
        return try await work()
    }

    /// How many wait under `key`.
    func queued(_ key: Key) -> Int { waiting[key]?.count ?? 0 }

    private func acquire(_ key: Key, _ weight: Int) async {
        if waiting[key] == nil, running[key, default: 0] + weight <= maximum {
            running[key, default: 0] += weight
            return
        }
        await withCheckedContinuation { waiting[key, default: []].append((weight, $0)) }
    }

    private func release(_ key: Key, _ weight: Int) {
        running[key, default: weight] -= weight
        // Let in, in order, whoever now fits.
        while var queue = waiting[key], let head = queue.first, running[key, default: 0] + head.weight <= maximum {
            queue.removeFirst()
            waiting[key] = queue.isEmpty ? nil : queue
            running[key, default: 0] += head.weight
            head.continuation.resume()
        }
        if running[key] == 0 { running[key] = nil }
    }
}
