import CanopyWire
import Collections

extension BrokerState {
    /// Flights and their waiters: what the broker holds for clients, by id and by the client's
    /// (routing identity, correlation id), with the deadlines, the coalescable flights that
    /// still take waiters, and the bytes all of it costs. Bookkeeping only: which flight a
    /// request joins, and what anyone is answered, the router decides.
    struct FlightTable {
        private var flights = IDTable<Flight>(capacity: 1_024)
        private var waiters = IDTable<Waiter>(capacity: 1_024)
        /// Coalescable flights that still take waiters.
        private var open: [FlightKey: Flight] = [:]
        /// Canopy clients' requests held now, by (routing identity, correlation id).
        private var byClient = ClientTable()
        private var deadlines = DeadlineQueue()
        private var nextID: UInt64 = 1
        /// Deadlines are ordered by nanoseconds since then.
        private let startedAt: ContinuousClock.Instant
        /// Bytes held now: flights' bodies and bookkeeping, and their waiters'
        /// (see ``BrokerConfiguration/maximumHeldBytes``).
        private(set) var heldBytes = 0

        init(startedAt: ContinuousClock.Instant) {
            self.startedAt = startedAt
        }

        // MARK: Reading

        subscript(id: UInt64) -> Flight? { flights[id] }

        func waiter(_ id: UInt64) -> Waiter? { waiters[id] }

        /// The waiter a Canopy client holds under `correlation` (`hash`: ``ClientTable/hash(client:correlation:)``).
        func waiter(client: [UInt8], correlation: [UInt8], hash: Int) -> Waiter? {
            byClient.find(hash: hash, client: client, correlation: correlation).flatMap { waiters[$0] }
        }

        /// The coalescable flight identical requests join, if one is in the air.
        func open(_ key: FlightKey) -> Flight? { open[key] }

        var count: Int { flights.count }
        var waiterCount: Int { waiters.count }
        var openCount: Int { open.count }
        var deadlineCount: Int { deadlines.count }
        var ids: [UInt64] { flights.ids }

        /// The earliest deadline of a waiter still held (answered ones are dropped on the way).
        mutating func nextDeadline() -> ContinuousClock.Instant? {
            while let first = deadlines.min, waiters[first.waiter]?.deadline != first.at {
                deadlines.removeMin() // answered already; drop lazily
            }
            return deadlines.min?.at
        }

        /// The next waiter whose deadline is at or before `now`, taken off the deadlines (it is
        /// still held: the router answers it).
        mutating func nextExpired(now: ContinuousClock.Instant) -> Waiter? {
            while let first = deadlines.min, first.at <= now {
                deadlines.removeMin()
                if let waiter = waiters[first.waiter], waiter.deadline == first.at { return waiter }
            }
            return nil
        }

        // MARK: Changing

        /// A new id for a flight or a waiter (one sequence: they never collide).
        mutating func makeID() -> UInt64 {
            defer { nextID += 1 }
            return nextID
        }

        /// Holds `flight`; a coalescable one (with a key) takes identical requests from now on.
        mutating func add(_ flight: Flight) {
            flights[flight.id] = flight
            heldBytes += flight.bytes
            if let key = flight.key { open[key] = flight }
        }

        /// Identical requests no longer join `flight` (it is stuck); it keeps its waiters.
        mutating func stopJoining(_ flight: Flight) {
            if let key = flight.key, open[key] === flight { open[key] = nil }
            flight.key = nil
        }

        /// Holds `waiter` on `flight`: by id, by its client's correlation (a Canopy client's),
        /// and by its deadline (`timeout`: the request's own, 0 for the broker's default).
        mutating func add(_ waiter: Waiter, to flight: Flight, timeout: UInt32) {
            waiters[waiter.id] = waiter
            heldBytes += waiter.bytes
            if waiter.dialect == .canopy {
                byClient.insert(hash: waiter.clientHash, client: waiter.client, correlation: waiter.correlation, id: waiter.id)
            }
            deadlines.insert(Deadline(at: waiter.deadline, key: deadlineKey(waiter.deadline), waiter: waiter.id), timeout: UInt64(timeout))
            if deadlines.count > 2 * waiters.count + 4_096 { // answered ones piled up behind a slow one
                let waiters = self.waiters
                deadlines.removeAll { waiters[$0.waiter]?.deadline != $0.at }
            }
            flight.waiters.append(waiter.id)
            flight.totalWaiters += 1
        }

        /// Forgets a waiter (answered, or gone); its flight's list is the caller's.
        mutating func forget(_ waiter: Waiter) {
            waiters[waiter.id] = nil
            heldBytes -= waiter.bytes
            if waiter.dialect == .canopy {
                byClient.remove(hash: waiter.clientHash, id: waiter.id)
            }
        }

        /// Forgets a flight: out of its queue's counts, no waiter joins it again, its waiters
        /// counted in its operation's histogram. False when it was gone already.
        mutating func remove(_ flight: Flight) -> Bool {
            guard flights.removeValue(forKey: flight.id) != nil else { return false }
            heldBytes -= flight.bytes
            unqueue(flight)
            stopJoining(flight)
            _ = flight.counters.waitersPerFlight.record(UInt64(flight.totalWaiters))
            flight.counters.mostWaiters = max(flight.counters.mostWaiters, UInt64(flight.totalWaiters))
            return true
        }

        /// Puts a flight in its service's queue (at the back, or at the front when it goes again
        /// after its worker died) and counts its bytes there.
        func enqueue(_ flight: Flight, atFront: Bool = false) {
            if atFront {
                flight.service.queue.prepend(flight.id)
            } else {
                flight.service.queue.append(flight.id)
            }
            flight.isQueued = true
            flight.service.queuedCount += 1
            flight.service.queuedBytes += flight.bytes
        }

        /// Takes a flight out of its service's queue counts (it was dispatched or closed). Its id
        /// may still sit in the queue: it is skipped there, and the queue is compacted once such
        /// ids outnumber the live ones, so taking a flight out is O(1) amortized wherever it
        /// stands.
        func unqueue(_ flight: Flight) {
            guard flight.isQueued else { return }
            flight.isQueued = false
            let service = flight.service
            service.queuedCount -= 1
            service.queuedBytes -= flight.bytes
            if service.queue.count > 2 * service.queuedCount + 1_024 {
                service.queue.removeAll { flights[$0]?.isQueued != true }
            }
        }

        /// The flights waiting in `service`'s queue, oldest first (skipping ids taken out).
        func queued(in service: ServiceEntry) -> [Flight] {
            service.queue.compactMap { id in flights[id].flatMap { $0.isQueued ? $0 : nil } }
        }

        /// Drops from `service`'s queue the ids of flights no longer held.
        func compactQueue(of service: ServiceEntry) {
            service.queue.removeAll { flights[$0] == nil }
        }

        /// A deadline as nanoseconds since the broker started, for the heap's ordering.
        private func deadlineKey(_ deadline: ContinuousClock.Instant) -> UInt64 {
            let (seconds, attoseconds) = (deadline - startedAt).components
            return UInt64(clamping: seconds) &* 1_000_000_000 &+ UInt64(clamping: attoseconds / 1_000_000_000)
        }
    }
}
