import CanopyMessages
import DequeModule
import Synchronization

/// The people a service erased lately (an account deleted), whose other requests it refuses.
///
/// Every edge refuses a deleted person's tokens within its watch interval of the sign-out,
/// but a request one of them let through just before is still on its way. Without this, it
/// would land after the erasure and leave the person's data behind (a plant, a photo, a
/// device) owned by an account that no longer exists. ``OperationHandlers`` notes the person
/// when an erasing operation (``BusOperation/erases``) arrives, before it runs, and refuses
/// their other operations for ``window``, far longer than any request waits: the ones the
/// edge sends for them, not another service's follow-ups (the erasing follow-up behind them
/// clears what they leave). An id reused for a new account within the window is refused too.
///
/// It keeps a keyed hash of each person (SipHash under this process's random seed), not the
/// id, at most ``capacity`` of them (16 bytes each, and a queue entry): the oldest go first.
/// Memory only: a service restarted inside the window forgets, and canopy-care's second pass
/// (``Care/DeleteAccount``) erases what got through meanwhile (docs/operations/data.md, "Erasure").
public final class ErasedPeople: Sendable {
    /// How long a person stays refused after their erasure.
    public let window: Duration
    /// The most people remembered at once.
    public let capacity: Int
    private let state: Mutex<State>

    private struct State {
        var since: [Int: ContinuousClock.Instant] = [:]
        var order: Deque<(person: Int, at: ContinuousClock.Instant)> = []
    }

    /// A quarter of an hour: every edge refuses the person's tokens within its watch interval
    /// (0.1 s), and no request waits longer than its deadline (seconds).
    public static let defaultWindow: Duration = .seconds(900)

    public init(window: Duration = defaultWindow, capacity: Int = 200_000) {
        precondition(capacity > 0, "ErasedPeople remembers one person at least")
        self.window = window
        self.capacity = capacity
        state = Mutex(State())
    }

    /// Notes that `person` is being erased now.
    public func note(_ person: String, now: ContinuousClock.Instant = .now) {
        let key = person.hashValue
        state.withLock { state in
            Self.forgetExpired(&state, before: now - window)
            if state.order.count >= capacity, let oldest = state.order.popFirst(), state.since[oldest.person] == oldest.at {
                state.since[oldest.person] = nil
            }
            state.since[key] = now
            state.order.append((key, now))
        }
    }

    /// Whether `person` was erased within the window.
    public func contains(_ person: String, now: ContinuousClock.Instant = .now) -> Bool {
        let key = person.hashValue
        return state.withLock { state in
            guard let at = state.since[key] else { return false }
            return at > now - window
        }
    }

    /// How many people are remembered now.
    public var count: Int { state.withLock { $0.since.count } }

    private static func forgetExpired(_ state: inout State, before cutoff: ContinuousClock.Instant) {
        while let first = state.order.first, first.at <= cutoff {
            state.order.removeFirst()
            if state.since[first.person] == first.at { state.since[first.person] = nil }
        }
    }

    /// The refusal of a request for someone erased.
    static let refusal = CanopyError(.unauthorized, "this account was deleted; nothing more is kept or added for it")
}
