import CanopyMessages
import Metrics
import Synchronization

/// Implicit batching: lookups of one kind from any callers go out together as one multi-key
/// call, and each caller gets its own key's answer back, value or error.
///
/// A batch leaves when it holds `maximumKeys` keys, when `window` has passed since its first
/// key, or at once while fewer than `maximumInFlight` batches of its kind are in the air: a
/// lookup on a quiet edge never waits, and under load keys gather while earlier batches are
/// answered (as Nagle's algorithm gathers bytes), never longer than the window.
///
/// Keys carry the person they are looked up for (see ``Lookup``), so two people asking for
/// the same photo are two keys, each checked by the service for its own person. Equal keys
/// (the same person asking twice) share one slot, and a key already in the air is not sent
/// again: its caller waits for that answer, as the broker's coalescing does for equal
/// requests.
final class ImplicitBatcher<Key: Hashable & Sendable, Value: Sendable>: Sendable {
    /// Answers a batch: one result per key, in order.
    typealias Fetch = @Sendable ([Key]) async -> [Result<Value, any Error>]

    private typealias Waiter = CheckedContinuation<Value, any Error>

    private struct Batch {
        var keys: [Key] = []
        var waiters: [Key: [Waiter]] = [:]
        /// Which batch this is, so that a window's timer never sends a later one early.
        var number: UInt64
    }

    private struct State {
        var open: Batch?
        var opened: UInt64 = 0
        /// Batches sent and not yet answered.
        var inFlight = 0
        /// The keys in the air, with everyone waiting for each.
        var flying: [Key: [Waiter]] = [:]

        /// The open batch's keys, taken to be sent; their waiters wait in ``flying``.
        mutating func take() -> [Key]? {
            guard let batch = open else { return nil }
            open = nil
            inFlight += 1
            flying.merge(batch.waiters) { $0 + $1 }
            return batch.keys
        }

        /// The waiters of keys that came back.
        mutating func land(_ keys: [Key]) -> [[Waiter]] {
            inFlight -= 1
            return keys.map { flying.removeValue(forKey: $0) ?? [] }
        }
    }

    let window: Duration
    let maximumKeys: Int
    let maximumInFlight: Int
    private let fetch: Fetch
    private let state = Mutex(State())
    /// Keys per batch sent: how full batches are (`canopy_api_implicit_batch_keys{kind}`).
    private let fill: Recorder

    /// - Parameters:
    ///   - kind: what is looked up, for the fill metric (`variant`, `next-task`).
    ///   - window: the longest a key waits for others while a batch is in the air.
    ///   - maximumKeys: the most keys one call carries (1 to ``Lookup/maximumKeys``).
    ///   - maximumInFlight: how many batches may be in the air before keys wait for one.
    ///   - fetch: answers a batch.
    init(kind: String, window: Duration, maximumKeys: Int, maximumInFlight: Int, fetch: @escaping Fetch) {
        self.window = window
        self.maximumKeys = max(1, min(maximumKeys, Lookup.maximumKeys))
        self.maximumInFlight = max(1, maximumInFlight)
        self.fetch = fetch
        self.fill = Recorder(label: "canopy_api_implicit_batch_keys", dimensions: [("kind", kind)], aggregate: true)
    }

    /// `key`'s answer, looked up with whatever other keys gather with it.
    func load(_ key: Key) async throws -> Value {
        // With room in the air and nothing gathering, the key goes at once, from this task:
        // no continuation, no task of its own (the quiet edge's path).
        let alone = state.withLock { state -> Bool in
            guard state.open == nil, state.flying[key] == nil, state.inFlight < maximumInFlight else { return false }
            state.inFlight += 1
            state.flying[key] = []
            return true
        }
        if alone { return try await send([key], answering: key).get() }
        return try await withCheckedThrowingContinuation { continuation in
            let (ready, startWindow) = state.withLock { state -> ([Key]?, UInt64?) in
                if state.flying[key] != nil { // already in the air: wait for that answer
                    state.flying[key]!.append(continuation)
                    return (nil, nil)
                }
                var started: UInt64?
                if state.open == nil {
                    state.opened += 1
                    state.open = Batch(number: state.opened)
                    started = state.opened
                }
                if state.open!.waiters[key] == nil { state.open!.keys.append(key) }
                state.open!.waiters[key, default: []].append(continuation)
                if state.open!.keys.count >= maximumKeys || state.inFlight < maximumInFlight { return (state.take(), nil) }
                return (nil, started)
            }
            if let ready {
                Task { _ = await self.send(ready) }
            } else if let number = startWindow {
                Task { [window] in
                    try? await Task.sleep(for: window)
                    self.closeWindow(number)
                }
            }
        }
    }

    /// Sends batch `number` when its window ends, unless it was sent already.
    private func closeWindow(_ number: UInt64) {
        let batch = state.withLock { state in state.open?.number == number ? state.take() : nil }
        if let batch { Task { _ = await self.send(batch) } }
    }

    /// Sends `keys` (already counted in the air) and hands each waiter its key's answer; the
    /// answer for `own`, the sender's key, is returned rather than handed.
    private func send(_ keys: [Key], answering own: Key? = nil) async -> Result<Value, any Error> {
        fill.record(keys.count)
        let results = await fetch(keys)
        // The next batch goes as soon as there is room in the air for it.
        let (waiters, next) = state.withLock { state in
            let waiters = state.land(keys)
            return (waiters, state.inFlight < self.maximumInFlight ? state.take() : nil)
        }
        if let next { Task { _ = await self.send(next) } }
        var answer: Result<Value, any Error> = .failure(CanopyError(.internal, "the lookup was not among the keys sent"))
        for (index, waiting) in waiters.enumerated() {
            let result: Result<Value, any Error> =
                index < results.count
                ? results[index]
                : .failure(CanopyError(.internal, "the lookup answered \(results.count) of \(keys.count) keys"))
            for waiter in waiting { waiter.resume(with: result) }
            if keys[index] == own { answer = result }
        }
        return answer
    }
}
