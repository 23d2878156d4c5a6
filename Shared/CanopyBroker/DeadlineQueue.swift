import Collections

/// Waiters' deadlines, earliest first.
///
/// Almost every request carries the same timeout (the caller's default, or the broker's), and
/// requests arrive in time order, so their deadlines arrive in order too: those go to the back
/// of a FIFO, O(1) in and out. Only a deadline earlier than the last one queued (a caller with
/// a shorter timeout than the one before) goes to a heap. The earliest is the smaller of the
/// two fronts. In the broker's profile the heap alone (every request in and out of a heap of
/// the requests in flight) was 3% of the loop thread.
///
/// Deadlines of waiters answered meanwhile stay until they reach the front, where the broker
/// drops them (``BrokerState/nextWakeup()``). Behind one slow request they would pile up
/// (every request of its timeout, up to 600 s), so once they outnumber the live ones the
/// broker sweeps them out (``removeAll(where:)``, amortized O(1) a request).
package struct DeadlineQueue {
    private var ordered: Deque<BrokerState.Deadline> = []
    private var others = Heap<BrokerState.Deadline>()

    package init() {}

    package var count: Int { ordered.count + others.count }

    package mutating func insert(_ deadline: BrokerState.Deadline) {
        if let last = ordered.last, deadline.key < last.key {
            others.insert(deadline)
        } else {
            ordered.append(deadline)
        }
    }

    /// The earliest deadline.
    package var min: BrokerState.Deadline? {
        guard let first = ordered.first else { return others.min }
        guard let other = others.min else { return first }
        return other.key < first.key ? other : first
    }

    /// Removes the earliest deadline.
    package mutating func removeMin() {
        guard let first = ordered.first else {
            _ = others.popMin()
            return
        }
        if let other = others.min, other.key < first.key {
            _ = others.popMin()
        } else {
            ordered.removeFirst()
        }
    }

    /// Removes the deadlines `isGone` says are answered.
    package mutating func removeAll(where isGone: (BrokerState.Deadline) -> Bool) {
        ordered.removeAll(where: isGone)
        others = Heap(others.unordered.filter { !isGone($0) })
    }
}
