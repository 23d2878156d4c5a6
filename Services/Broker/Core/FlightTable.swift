import CanopyWire
import Collections

extension BrokerState {
    /// Flights and their waiters: what the broker holds for clients, by id and by the client's
    /// (routing identity, correlation id), with the deadlines, the coalescable flights that
    /// still take waiters, and the bytes all of it costs. Bookkeeping only: which flight a
    /// request joins, and what anyone is answered, the router decides.
    ///
    /// A class: the router reaches it through `self` in its mutating methods, and a struct's
    /// non-mutating members were handed a copy of the whole table each call. Owned by the loop
    /// thread alone, so its properties skip the runtime's exclusivity checks.
    final class FlightTable {
        /// The flights in the air, by handle (a flight's handle is the request id its worker answers).
        let flights = Slab<Flight>(capacity: 1_024)
        /// Their waiters, by handle.
        let waiters = Slab<Waiter>(capacity: 1_024)
        /// Coalescable flights that still take waiters, by their key's digest: the key stays in
        /// the flight, so finding, entering and removing one hashes nothing again (a dictionary
        /// keyed by the key hashed it three times a request).
        @exclusivity(unchecked) private var open = HashIndex(capacity: 256)
        /// Canopy clients' requests held now, by (routing identity, correlation id).
        @exclusivity(unchecked) private var byClient = ClientTable()
        @exclusivity(unchecked) private var deadlines = DeadlineQueue()
        /// Deadlines are ordered by nanoseconds since then.
        private let startedAt: ContinuousClock.Instant
        /// Bytes held now: flights' bodies and bookkeeping, and their waiters'
        /// (see ``BrokerConfiguration/maximumHeldBytes``).
        @exclusivity(unchecked) private(set) var heldBytes = 0
        /// Answers that named a flight no longer held (a worker's late reply after the last
        /// waiter left, its slot perhaps holding another flight since): dropped, never answered
        /// to anyone, and counted.
        @exclusivity(unchecked) private(set) var staleAnswers: UInt64 = 0
        /// The next flight's ``Flight/serial``.
        @exclusivity(unchecked) private var nextSerial: UInt64 = 1

        init(startedAt: ContinuousClock.Instant) {
            self.startedAt = startedAt
        }

        // MARK: Reading

        /// Whether `id` names a flight held now.
        func contains(_ id: SlabHandle) -> Bool { flights.contains(id) }

        /// The flight `id` names, which must be held (``contains(_:)``); read and changed in place.
        subscript(id: SlabHandle) -> Flight {
            unsafeAddress { UnsafePointer(flights.address(of: id)) }
            unsafeMutableAddress { flights.address(of: id) }
        }

        /// The flight a worker's answer names, when it is still held; else counted as stale.
        func answered(_ raw: UInt64) -> SlabHandle? {
            if let id = SlabHandle(raw: raw), flights.contains(id) { return id }
            staleAnswers += 1
            return nil
        }

        /// Whether `id` names a waiter held now.
        func containsWaiter(_ id: SlabHandle) -> Bool { waiters.contains(id) }

        /// The waiter `id` names, which must be held; read in place.
        subscript(waiter id: SlabHandle) -> Waiter {
            unsafeAddress { UnsafePointer(waiters.address(of: id)) }
        }

        /// The waiter a Canopy client holds under `correlation` (`hash`: ``ClientTable/hash(client:correlation:)``).
        func waiter(client: [UInt8], correlation: [UInt8], hash: Int) -> SlabHandle? {
            let waiters = self.waiters
            let found = byClient.find(hash: hash) { raw in
                guard let id = SlabHandle(raw: raw), waiters.contains(id) else { return false }
                let waiter = waiters.address(of: id)
                return waiter.pointee.correlation == correlation && waiter.pointee.client == client
            }
            return found.flatMap(SlabHandle.init(raw:))
        }

        /// The coalescable flight identical requests join, if one is in the air.
        func open(_ key: FlightKey) -> SlabHandle? {
            let flights = self.flights
            let found = open.find(hash: key.digest) { raw in
                guard let id = SlabHandle(raw: raw), flights.contains(id) else { return false }
                return flights[valid: id].key == key
            }
            return found.flatMap(SlabHandle.init(raw:))
        }

        var count: Int { flights.count }
        var waiterCount: Int { waiters.count }
        var openCount: Int { open.count }
        var deadlineCount: Int { deadlines.count }
        var ids: [SlabHandle] { flights.handles }

        /// The earliest deadline of a waiter still held (answered ones are dropped on the way).
        func nextDeadline() -> ContinuousClock.Instant? {
            while let first = deadlines.min, !isLive(first) {
                deadlines.removeMin() // answered already; drop lazily
            }
            return deadlines.min?.at
        }

        /// The next waiter whose deadline is at or before `now`, taken off the deadlines (it is
        /// still held: the router answers it).
        func nextExpired(now: ContinuousClock.Instant) -> SlabHandle? {
            while let first = deadlines.min, first.at <= now {
                deadlines.removeMin()
                if isLive(first) { return SlabHandle(raw: first.waiter) }
            }
            return nil
        }

        /// Whether a deadline is its waiter's, and the waiter still held.
        private func isLive(_ deadline: Deadline) -> Bool {
            guard let id = SlabHandle(raw: deadline.waiter), waiters.contains(id) else { return false }
            return waiters[valid: id].deadline == deadline.at
        }

        // MARK: Changing

        /// Holds `flight` and returns its handle (nil: the broker holds its most flights); a
        /// coalescable one (with a key) takes identical requests from now on.
        func add(_ flight: consuming Flight) -> SlabHandle? {
            let bytes = flight.bytes
            let digest = flight.key?.digest
            flight.serial = nextSerial
            guard let id = flights.insert(consume flight) else { return nil }
            nextSerial += 1
            heldBytes += bytes
            if let digest { open.insert(hash: digest, id: id.raw) }
            return id
        }

        /// Identical requests no longer join flight `id` (it is stuck); it keeps its waiters.
        /// Its index entry is found by the digest its key keeps; the key is dropped in place.
        func stopJoining(_ id: SlabHandle) {
            let flight = flights.address(of: id)
            guard let digest = flight.pointee.key?.digest else { return }
            flight.pointee.key = nil
            open.remove(hash: digest, id: id.raw)
        }

        /// Holds `waiter` on flight `id`: by handle, by its client's correlation (a Canopy
        /// client's), and by its deadline (`timeout`: the request's own, 0 for the broker's
        /// default). Nil when the broker holds its most waiters.
        func add(_ waiter: consuming Waiter, to id: SlabHandle, timeout: UInt32) -> SlabHandle? {
            let (bytes, deadline) = (waiter.bytes, waiter.deadline)
            let canopy = waiter.dialect == .canopy
            let clientHash = waiter.clientHash
            guard let handle = waiters.insert(consume waiter) else { return nil }
            heldBytes += bytes
            if canopy {
                byClient.insert(hash: clientHash, id: handle.raw)
            }
            deadlines.insert(Deadline(at: deadline, key: deadlineKey(deadline), waiter: handle.raw), timeout: UInt64(timeout))
            if deadlines.count > 2 * waiters.count + 4_096 { // answered ones piled up behind a slow one
                let waiters = self.waiters
                deadlines.removeAll { deadline in
                    guard let id = SlabHandle(raw: deadline.waiter), waiters.contains(id) else { return true }
                    return waiters[valid: id].deadline != deadline.at
                }
            }
            flights[valid: id].waiters.append(handle)
            flights[valid: id].totalWaiters += 1
            return handle
        }

        /// Forgets waiter `id` (answered, or gone) and returns it; its flight's list is the caller's.
        @discardableResult
        func forget(_ id: SlabHandle) -> Waiter {
            let waiter = waiters.remove(id)!
            heldBytes -= waiter.bytes
            if waiter.dialect == .canopy {
                byClient.remove(hash: waiter.clientHash, id: id.raw)
            }
            return waiter
        }

        /// Forgets waiter `id` (answered) once `body` has read it where it lies, through its
        /// address: no copy of it is made (handed over as a value, the record was copied, its
        /// three arrays retained and released: 2.6% of the loop thread). `body` must not add or
        /// remove waiters (the record's address would move).
        func forget(_ id: SlabHandle, after body: (UnsafePointer<Waiter>) -> Void) {
            let waiter = waiters.address(of: id)
            body(waiter)
            heldBytes -= waiter.pointee.bytes
            if waiter.pointee.dialect == .canopy {
                byClient.remove(hash: waiter.pointee.clientHash, id: id.raw)
            }
            waiters.discard(id)
        }

        /// Forgets flight `id`: out of its queue's counts, no waiter joins it again, its waiters
        /// counted in its operation's histogram, and its record ended in place. False when it
        /// was gone already.
        @discardableResult
        func remove(_ id: SlabHandle) -> Bool {
            guard flights.contains(id) else { return false }
            unqueue(id)
            stopJoining(id)
            let flight = flights.address(of: id)
            heldBytes -= flight.pointee.bytes
            let (counters, waiters) = (flight.pointee.counters, UInt64(flight.pointee.totalWaiters))
            _ = counters.waitersPerFlight.record(waiters)
            counters.mostWaiters = max(counters.mostWaiters, waiters)
            return flights.discard(id)
        }

        /// Puts flight `id` in its service's queue (at the back, or at the front when it goes
        /// again after its worker died) and counts its bytes there.
        func enqueue(_ id: SlabHandle, atFront: Bool = false) {
            let service = flights[valid: id].service
            if atFront {
                service.queue.prepend(id)
            } else {
                service.queue.append(id)
            }
            flights[valid: id].isQueued = true
            service.queuedCount += 1
            service.queuedBytes += flights[valid: id].bytes
        }

        /// Takes flight `id` out of its service's queue counts (it was dispatched or closed). Its
        /// handle may still sit in the queue: it is skipped there, and the queue is compacted
        /// once such handles outnumber the live ones, so taking a flight out is O(1) amortized
        /// wherever it stands.
        func unqueue(_ id: SlabHandle) {
            guard flights[valid: id].isQueued else { return }
            flights[valid: id].isQueued = false
            let service = flights[valid: id].service
            service.queuedCount -= 1
            service.queuedBytes -= flights[valid: id].bytes
            if service.queue.count > 2 * service.queuedCount + 1_024 {
                service.queue.removeAll { !isQueued($0) }
            }
        }

        /// Whether `id` names a flight held now and waiting in its service's queue.
        func isQueued(_ id: SlabHandle) -> Bool {
            flights.contains(id) && flights[valid: id].isQueued
        }

        /// The flights waiting in `service`'s queue, oldest first (skipping handles taken out).
        func queued(in service: ServiceEntry) -> [SlabHandle] {
            service.queue.filter(isQueued)
        }

        /// Drops from `service`'s queue the handles of flights no longer held.
        func compactQueue(of service: ServiceEntry) {
            service.queue.removeAll { !flights.contains($0) }
        }

        /// A deadline as nanoseconds since the broker started, for the heap's ordering.
        private func deadlineKey(_ deadline: ContinuousClock.Instant) -> UInt64 {
            let (seconds, attoseconds) = (deadline - startedAt).components
            return UInt64(clamping: seconds) &* 1_000_000_000 &+ UInt64(clamping: attoseconds / 1_000_000_000)
        }
    }
}
