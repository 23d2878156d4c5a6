extension BrokerState {
    /// Clients' routing identities, each kept once. A request's waiter keeps its client's
    /// identity until it is answered; taking the copy kept here instead of the bytes the socket
    /// just read leaves the loop's receive buffer its own, so the next message is read into it
    /// with no allocation (one fewer a request).
    ///
    /// Bounded: at most ``maximumCount`` identities (65,536 of at most 255 bytes: under 24 MiB),
    /// those idle for ``idleAfter`` given up (a ROUTER socket names every connection anew, so
    /// identities of clients that left pile up otherwise). Past the bound with none idle, a
    /// request keeps its own copy, as before.
    struct ClientNames {
        private struct Entry {
            let identity: [UInt8]
            var lastUsed: ContinuousClock.Instant
        }

        private var entries: [PeerKey: Entry] = [:]
        private var lastSweep: ContinuousClock.Instant?
        let maximumCount: Int
        /// Identities unused this long go at the next sweep.
        static let idleAfter: Duration = .seconds(30)

        init(maximumCount: Int = 65_536) {
            self.maximumCount = maximumCount
        }

        var count: Int { entries.count }

        /// The identity kept for `peer` (entered now when there is room).
        mutating func intern(_ peer: [UInt8], now: ContinuousClock.Instant) -> [UInt8] {
            let key = PeerKey(peer)
            if let index = entries.index(forKey: key) {
                entries.values[index].lastUsed = now
                return entries.values[index].identity
            }
            guard entries.count < maximumCount || sweep(now: now) else { return peer }
            let kept = peer.withUnsafeBufferPointer { Array($0) } // a buffer of its own: the caller's stays unshared
            entries[PeerKey(kept)] = Entry(identity: kept, lastUsed: now)
            return kept
        }

        /// Gives up identities idle for ``idleAfter``; whether there is room now. Scans at most
        /// once a second when full (a flood of new clients costs no scan each), else once an
        /// ``idleAfter``.
        @discardableResult
        mutating func sweep(now: ContinuousClock.Instant) -> Bool {
            let every: Duration = entries.count >= maximumCount ? .seconds(1) : Self.idleAfter
            if lastSweep.map({ now - $0 >= every }) ?? true {
                lastSweep = now
                entries = entries.filter { now - $0.value.lastUsed < Self.idleAfter }
            }
            return entries.count < maximumCount
        }
    }
}
