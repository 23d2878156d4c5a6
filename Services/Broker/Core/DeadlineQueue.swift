import Collections

/// Waiters' deadlines, earliest first.
///
/// Callers use few timeouts (the edge its call timeout, services their client's default, the
/// broker its own for requests that name none), and requests arrive in time order, so the
/// deadlines of one timeout arrive in order: each of the first few timeouts seen gets a FIFO
/// of its own (a *lane*), O(1) in and out. A deadline of another timeout, or one that would
/// come before the last of its lane, goes to a heap. The earliest is the smallest of the
/// lanes' fronts and the heap's. In the broker's profile the heap alone (every request in and
/// out of a heap of the requests in flight) was 3% of the loop thread.
///
/// Deadlines of waiters answered meanwhile stay until they reach the front, where the broker
/// drops them (``BrokerState/nextWakeup()``). Behind one slow request they would pile up
/// (every request of its timeout, up to 600 s), so once they outnumber the live ones the
/// broker sweeps them out (``removeAll(where:)``, amortized O(1) a request).
package struct DeadlineQueue {
    /// How many timeouts get a lane; a lane that empties may be taken by another timeout.
    static let laneCount = 4

    private struct Lane {
        var timeout: UInt64
        var deadlines: Deque<BrokerState.Deadline> = []
    }

    private var lanes: [Lane] = []
    private var others = Heap<BrokerState.Deadline>()
    /// The earliest deadline and where it is (a lane's index, or -1 for the heap), kept up to
    /// date as deadlines come and go, so that reading it scans nothing.
    private var front: (deadline: BrokerState.Deadline, lane: Int)?
    /// Deadlines held, in the lanes and the heap.
    package private(set) var count = 0

    package init() {}

    /// Adds a deadline; `timeout` (any unit, the same for every call) says which lane it may join.
    package mutating func insert(_ deadline: BrokerState.Deadline, timeout: UInt64) {
        count += 1
        var lane = -1
        if let index = lanes.firstIndex(where: { $0.timeout == timeout }) {
            if let last = lanes[index].deadlines.last, deadline.key < last.key {
                others.insert(deadline)
            } else {
                lanes[index].deadlines.append(deadline)
                lane = index
            }
        } else if lanes.count < Self.laneCount {
            lanes.append(Lane(timeout: timeout, deadlines: [deadline]))
            lane = lanes.count - 1
        } else if let index = lanes.firstIndex(where: { $0.deadlines.isEmpty }) {
            lanes[index].timeout = timeout
            lanes[index].deadlines.append(deadline)
            lane = index
        } else {
            others.insert(deadline)
        }
        // Strictly earlier only: among equal keys the front stays where it is, which holds
        // whichever lane or heap it names.
        if front == nil || deadline.key < front!.deadline.key { front = (deadline, lane) }
    }

    /// The earliest deadline.
    package var min: BrokerState.Deadline? { front?.deadline }

    /// Removes the earliest deadline.
    package mutating func removeMin() {
        guard let (_, lane) = front else { return }
        count -= 1
        if lane >= 0 {
            lanes[lane].deadlines.removeFirst()
        } else {
            _ = others.popMin()
        }
        findFront()
    }

    /// Removes the deadlines `isGone` says are answered.
    package mutating func removeAll(where isGone: (BrokerState.Deadline) -> Bool) {
        for index in lanes.indices { lanes[index].deadlines.removeAll(where: isGone) }
        others = Heap(others.unordered.filter { !isGone($0) })
        count = lanes.reduce(others.count) { $0 + $1.deadlines.count }
        findFront()
    }

    /// The smallest of the lanes' fronts and the heap's.
    private mutating func findFront() {
        var best = others.min.map { (deadline: $0, lane: -1) }
        for index in lanes.indices {
            guard let first = lanes[index].deadlines.first else { continue }
            if best == nil || first.key < best!.deadline.key { best = (first, index) }
        }
        front = best
    }
}
