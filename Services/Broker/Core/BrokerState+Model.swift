import CanopyIO
import CanopyMessages
import CanopyWire
import Collections
import Histogram

// The broker's bookkeeping types. Flights and waiters are plain values in slabs
// (``Slab``), read and changed in place by handle: a request makes no object. Workers and
// services are reference types: one dictionary lookup per message, then changes in place.
// Their stored properties are `@exclusivity(unchecked)`: only the loop thread touches them,
// and the runtime's dynamic exclusivity check on every access was 2% of the loop thread's time.

extension BrokerState {
    /// One client's request: who to answer, under which correlation id, by when. A plain
    /// value in the ``FlightTable``'s waiter slab, named by its ``SlabHandle``.
    struct Waiter {
        let client: [UInt8]
        /// The client's correlation id (empty for Majordomo clients, which have none).
        let correlation: [UInt8]
        /// Its entry's hash in ``ClientTable`` (Canopy clients), kept so removing it hashes nothing.
        let clientHash: Int
        let dialect: Dialect
        /// The service as the client named it (Majordomo replies repeat it).
        let serviceName: String
        let receivedAt: ContinuousClock.Instant
        let deadline: ContinuousClock.Instant
        /// The flight this waiter waits on.
        let flight: SlabHandle
        /// What holding it costs, counted against the broker's memory bounds: its names and
        /// ids (the client's routing id, kept once for all its requests by ``ClientNames`` but
        /// counted with each, and its correlation), and the bookkeeping around them (its slab
        /// slot, its by-client index entry, its deadline entry).
        let bytes: Int
        static let bookkeepingBytes = 192
        /// Whether its request is traced and the broker traces (``BrokerTracing``).
        var traced = false

        init(
            client: [UInt8], correlation: [UInt8], clientHash: Int, dialect: Dialect, serviceName: String,
            receivedAt: ContinuousClock.Instant, deadline: ContinuousClock.Instant, flight: SlabHandle
        ) {
            self.client = client
            self.correlation = correlation
            self.clientHash = clientHash
            self.dialect = dialect
            self.serviceName = serviceName
            self.receivedAt = receivedAt
            self.deadline = deadline
            self.flight = flight
            bytes = Self.bytes(client: client, correlation: correlation, serviceName: serviceName)
        }

        /// What a waiter of these costs (``bytes``), known before it is made: the bound is
        /// checked against it.
        static func bytes(client: [UInt8], correlation: [UInt8], serviceName: String) -> Int {
            client.count + correlation.count + serviceName.utf8.count + bookkeepingBytes
        }
    }

    /// What goes to a worker: one call, answered to all of its waiters. A plain value in the
    /// ``FlightTable``'s flight slab, named by its ``SlabHandle``, which is also the request
    /// id its worker answers.
    struct Flight {
        let service: ServiceEntry
        /// The operation; empty for a Majordomo client's request to a Majordomo worker.
        let operation: String
        let header: RequestHeader
        /// The body frames: one JSON body and its attachments, or a Majordomo client's body
        /// passed as it came.
        let payload: Payload
        /// Set while identical requests may join (coalescable, not stuck, not answered).
        var key: FlightKey?
        let createdAt: ContinuousClock.Instant
        let counters: OperationCounters
        /// Its operation as resolved when it came (``ResolvedOperation/servedByAll`` spares
        /// asking each worker when it leaves the queue).
        var resolved: ResolvedOperation?
        var waiters = WaiterList()
        /// Waiters that ever joined, for "shared" and the waiters-per-flight histogram.
        var totalWaiters = 0
        var worker: Worker?
        var dispatches = 0
        /// What holding it costs, counted against the broker's memory bounds: its body frames,
        /// operation and header (the principal again in its coalescing key), and the
        /// bookkeeping around them (its slab slot, its queue slot).
        let bytes: Int
        static let bookkeepingBytes = 256
        /// Whether it waits in its service's queue (and counts in its queued bytes).
        var isQueued = false
        /// Whether the request that started it is traced and the broker traces.
        var traced = false
        /// Its place in the order flights were made (handles say nothing of it: slots are
        /// reused), for sending a lost worker's flights again in the order they came.
        var serial: UInt64 = 0

        init(
            service: ServiceEntry, operation: String, header: RequestHeader, payload: Payload,
            key: FlightKey?, createdAt: ContinuousClock.Instant, counters: OperationCounters, resolved: ResolvedOperation? = nil
        ) {
            self.resolved = resolved
            self.service = service
            self.operation = operation
            self.header = header
            self.payload = payload
            self.key = key
            self.createdAt = createdAt
            self.counters = counters
            self.bytes = Self.bytes(payload: payload, operation: operation, principal: header.principal, keyed: key != nil)
        }

        /// What a flight of these costs (``bytes``), known before it is made: the bound is
        /// checked against it.
        static func bytes(payload: Payload, operation: String, principal: String, keyed: Bool) -> Int {
            payload.byteCount + 24 * payload.count + operation.utf8.count + principal.utf8.count * (keyed ? 2 : 1)
                + 32 + bookkeepingBytes // 32: the header's fixed fields and the strings' storage
        }
    }

    /// What makes two requests identical: service, operation, principal and body bytes.
    /// The hash is computed once from the bytes; equality compares the bytes. Nothing here is
    /// compared as Unicode text: Swift `String` equality treats canonically equivalent text
    /// (`jos\u{E9}` and `jose\u{301}`) as equal, and services compare principals as bytes.
    struct FlightKey: Hashable {
        let service: String
        let operation: String
        let principal: String
        let payload: Payload
        /// The key's hash, computed once (SipHash over all of it, seeded per process: the
        /// payload is a peer's own); the coalescing index keeps it.
        let digest: Int

        init(service: String, operation: String, principal: String, payload: Payload) {
            self.service = service
            self.operation = operation
            self.principal = principal
            self.payload = payload
            var hasher = Hasher()
            func combine(_ text: String) {
                hasher.combine(text.utf8.count)
                let bulk: Void? = text.utf8.withContiguousStorageIfAvailable { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
                if bulk == nil { for byte in text.utf8 { hasher.combine(byte) } }
            }
            combine(service)
            combine(operation)
            combine(principal)
            payload.forEachFrame { frame in
                hasher.combine(frame.count)
                frame.withUnsafeBytes { Self.combine($0, into: &hasher) }
            }
            digest = hasher.finalize()
        }

        /// Frames up to this size are hashed whole.
        static let wholeHashBytes = 8 * 1024
        /// Where larger frames are sampled: chosen at random once per process, so nobody can
        /// aim payloads that differ elsewhere at one bucket.
        static let sampleSeeds: [UInt64] = (0..<16).map { _ in UInt64.random(in: .min ... .max) }

        /// A frame's bytes into the hash: whole when small. A large frame (a photo) goes in by
        /// a sample: its first and last 2 KiB and 64 bytes at 16 secret places. The cost then
        /// no longer grows with the frame. Equality still compares every byte, so a sample can
        /// only make two different payloads share a bucket, never join one flight.
        static func combine(_ bytes: UnsafeRawBufferPointer, into hasher: inout Hasher) {
            guard bytes.count > wholeHashBytes else {
                hasher.combine(bytes: bytes)
                return
            }
            hasher.combine(bytes: UnsafeRawBufferPointer(rebasing: bytes[..<2048]))
            hasher.combine(bytes: UnsafeRawBufferPointer(rebasing: bytes[(bytes.count - 2048)...]))
            for seed in sampleSeeds {
                let offset = Int(seed % UInt64(bytes.count - 64))
                hasher.combine(bytes: UnsafeRawBufferPointer(rebasing: bytes[offset..<(offset + 64)]))
            }
        }

        static func == (lhs: Self, rhs: Self) -> Bool {
            lhs.digest == rhs.digest && lhs.service.utf8.elementsEqual(rhs.service.utf8) && lhs.operation.utf8.elementsEqual(rhs.operation.utf8)
                && lhs.principal.utf8.elementsEqual(rhs.principal.utf8) && lhs.payload == rhs.payload
        }

        func hash(into hasher: inout Hasher) {
            hasher.combine(digest)
        }
    }

    /// A peer's routing identity as a dictionary key, hashed in bulk.
    struct PeerKey: Hashable {
        let bytes: [UInt8]

        init(_ bytes: [UInt8]) { self.bytes = bytes }

        func hash(into hasher: inout Hasher) {
            bytes.withUnsafeBytes { hasher.combine(bytes: $0) }
        }
    }

    /// A connected worker.
    final class Worker {
        let identity: PeerKey
        let dialect: Dialect
        let service: ServiceEntry
        /// The operations it declared (Canopy workers).
        let operations: [String: OperationDescriptor]
        /// What a Majordomo worker's operations count as (they declare nothing).
        let majordomoDescriptor: OperationDescriptor?
        /// How many flights it may hold: its READY's, then its latest CREDIT's.
        @exclusivity(unchecked) var credit: Int
        /// The CurveZMQ key it registered with; its later messages must come with the same.
        let key: String?
        /// Flights it holds.
        @exclusivity(unchecked) var held: IDTable<Void>
        @exclusivity(unchecked) var expiry: ContinuousClock.Instant
        @exclusivity(unchecked) var draining = false

        init(
            identity: PeerKey, dialect: Dialect, service: ServiceEntry, operations: [String: OperationDescriptor],
            majordomoDescriptor: OperationDescriptor? = nil, credit: Int, key: String? = nil, expiry: ContinuousClock.Instant
        ) {
            self.identity = identity
            self.key = key
            self.dialect = dialect
            self.service = service
            self.operations = operations
            self.majordomoDescriptor = majordomoDescriptor
            self.credit = credit
            self.expiry = expiry
            self.held = IDTable(capacity: min(credit, 64)) // grows with what it holds, not with what a READY claims
        }

        var available: Int { draining ? 0 : max(0, credit - held.count) }

        /// The flags of `operation`, or `nil` when this worker does not serve it.
        func descriptor(for operation: String) -> OperationDescriptor? {
            switch dialect {
            case .canopy: operations[operation]
            case .majordomo: majordomoDescriptor.map { OperationDescriptor(name: operation, idempotent: $0.idempotent, coalescable: $0.coalescable) }
            }
        }

        /// A heartbeat to this worker; a Canopy worker's carries the broker's frame limit, so
        /// that its runner never sends a reply the broker would refuse.
        func heartbeat(maximumFrameBytes: Int) -> Directive {
            switch dialect {
            case .canopy: .send(to: identity.bytes, .brokerHeartbeat(maximumFrameBytes: UInt64(maximumFrameBytes)))
            case .majordomo: .sendMajordomo(to: identity.bytes, .heartbeat)
            }
        }

        /// Tells this worker to go (or register again).
        func disconnect(reason: String) -> Directive {
            switch dialect {
            case .canopy: .send(to: identity.bytes, .brokerDisconnect(reason: reason))
            case .majordomo: .sendMajordomo(to: identity.bytes, .disconnect)
            }
        }
    }

    /// A service: its workers in round-robin order, its queue of flights and its counters.
    final class ServiceEntry {
        let name: String
        /// Set by the first worker; a service is served in one protocol only.
        @exclusivity(unchecked) var dialect: Dialect?
        @exclusivity(unchecked) var workers: [Worker] = [] {
            didSet { forgetResolvedOperations() }
        }
        @exclusivity(unchecked) var cursor = 0
        /// Flight handles in order; those of flights taken out meanwhile are skipped (and compacted).
        @exclusivity(unchecked) var queue: Deque<SlabHandle> = []
        /// Flights waiting in the queue (its live ids).
        @exclusivity(unchecked) var queuedCount = 0
        /// Bytes of the queued flights' bodies.
        @exclusivity(unchecked) var queuedBytes = 0
        @exclusivity(unchecked) var inFlight = 0
        @exclusivity(unchecked) var served: UInt64 = 0
        @exclusivity(unchecked) var errors: UInt64 = 0
        @exclusivity(unchecked) var latencyMicros = Histogram<UInt64>(highestTrackableValue: 3_600_000_000, numberOfSignificantValueDigits: .two)
        /// Operations its workers serve, resolved once per name while its workers stay the
        /// same (``BrokerState/resolve(_:of:)``): a request then costs one look-up by name.
        /// Their counters live in the broker's table, which outlives this entry.
        @exclusivity(unchecked) var resolved: [String: ResolvedOperation] = [:]

        init(name: String) { self.name = name }

        /// Its workers changed: what was resolved is no longer known to hold.
        private func forgetResolvedOperations() {
            guard !resolved.isEmpty else { return }
            for operation in resolved.values { operation.servedByAll = false } // flights may still hold them
            resolved.removeAll(keepingCapacity: true)
        }

        /// The next worker in round-robin order that has credit and serves `operation`
        /// (`servedByAll`: every worker does, so none is asked).
        func freeWorker(for operation: String, servedByAll: Bool = false) -> Worker? {
            let count = workers.count
            for step in 0..<count {
                let index = (cursor + step) % count
                let worker = workers[index]
                if worker.available > 0, servedByAll || worker.descriptor(for: operation) != nil {
                    cursor = (index + 1) % count
                    return worker
                }
            }
            return nil
        }

        /// The flags of `operation` as the service's workers declared them.
        func describe(_ operation: String) -> OperationDescriptor? {
            for worker in workers {
                if let descriptor = worker.descriptor(for: operation) { return descriptor }
            }
            return nil
        }

        /// Every operation any of its workers declared.
        var operations: [OperationDescriptor] {
            var table: [String: OperationDescriptor] = [:]
            for worker in workers {
                table.merge(worker.operations) { first, _ in first }
                if let any = worker.majordomoDescriptor { table[any.name] = any } // "*": any operation
            }
            return table.values.sorted { $0.name < $1.name }
        }
    }

    /// An operation of a service as its workers declared it, with its counters.
    final class ResolvedOperation {
        let descriptor: OperationDescriptor
        let counters: OperationCounters
        /// Every worker of the service serves it (the common case): finding a free worker
        /// asks none of them. Cleared when the service's workers change.
        @exclusivity(unchecked) var servedByAll: Bool

        init(descriptor: OperationDescriptor, counters: OperationCounters, servedByAll: Bool) {
            self.descriptor = descriptor
            self.counters = counters
            self.servedByAll = servedByAll
        }
    }

    /// A waiter's deadline in the ``DeadlineQueue``, ordered by nanoseconds since the broker
    /// started (comparing integers, not `Duration`s, on the hot path).
    package struct Deadline: Comparable {
        package let at: ContinuousClock.Instant
        package let key: UInt64
        package let waiter: UInt64

        package init(at: ContinuousClock.Instant, key: UInt64, waiter: UInt64) {
            self.at = at
            self.key = key
            self.waiter = waiter
        }

        package static func < (lhs: Self, rhs: Self) -> Bool { lhs.key < rhs.key }
        package static func == (lhs: Self, rhs: Self) -> Bool { lhs.key == rhs.key && lhs.waiter == rhs.waiter }
    }

    /// Per-operation coalescing counters, kept across worker comings and goings.
    final class OperationCounters {
        let service: String
        let operation: String
        @exclusivity(unchecked) var requests: UInt64 = 0
        @exclusivity(unchecked) var coalesced: UInt64 = 0
        @exclusivity(unchecked) var workerCalls: UInt64 = 0
        @exclusivity(unchecked) var detached: UInt64 = 0
        @exclusivity(unchecked) var redispatched: UInt64 = 0
        @exclusivity(unchecked) var mostWaiters: UInt64 = 0 // exact; the histogram rounds to two significant digits
        /// Requests answered, by outcome: index 0 is `ok`, then one per error code.
        @exclusivity(unchecked) var outcomes = [UInt64](repeating: 0, count: 1 + CanopyError.Code.allCases.count)

        /// Counts one answered request: `nil` for a reply, else the error's code.
        func count(_ code: CanopyError.Code?) {
            outcomes[code.map { 1 + Self.codeIndex[$0]! } ?? 0] += 1
        }

        private static let codeIndex = Dictionary(uniqueKeysWithValues: CanopyError.Code.allCases.enumerated().map { ($1, $0) })
        @exclusivity(unchecked) var waitersPerFlight = Histogram<UInt64>(highestTrackableValue: 1_000_000, numberOfSignificantValueDigits: .two)

        init(service: String, operation: String) {
            self.service = service
            self.operation = operation
        }

        var statistics: OperationStatistics {
            OperationStatistics(
                service: service, operation: operation, requests: requests, coalesced: coalesced,
                workerCalls: workerCalls, workerCallsSaved: coalesced, detachedWaiters: detached, redispatchedFlights: redispatched,
                flights: waitersPerFlight.totalCount,
                waitersPerFlightP50: waitersPerFlight.totalCount == 0 ? UInt64(0) : waitersPerFlight.valueAtPercentile(50),
                waitersPerFlightP99: waitersPerFlight.totalCount == 0 ? UInt64(0) : waitersPerFlight.valueAtPercentile(99),
                waitersPerFlightMax: mostWaiters,
                outcomes: Dictionary(uniqueKeysWithValues: zip(["ok"] + CanopyError.Code.allCases.map(\.rawValue), outcomes).filter { $0.1 > 0 }))
        }
    }
}

extension BrokerState {
    /// A request's or reply's frames as the broker holds them: the body, then attachments
    /// (a Majordomo body passes as it came: any number of frames, perhaps none). The common
    /// single frame is kept without an array around it, so holding one costs no allocation
    /// beyond the frame's own.
    struct Payload: Equatable {
        /// How many frames.
        let count: Int
        /// The first frame (the body); empty when there is none.
        let first: [UInt8]
        /// The frames after the first (attachments).
        let rest: [[UInt8]]

        /// A body and its attachments.
        init(body: [UInt8], attachments: [[UInt8]] = []) {
            count = 1 + attachments.count
            first = body
            rest = attachments
        }

        /// Frames as they came (a Majordomo body).
        init(frames: [[UInt8]]) {
            count = frames.count
            first = frames.first ?? []
            rest = frames.count > 1 ? Array(frames.dropFirst()) : []
        }

        /// Every frame, in order, as one array (for the paths that pass frames on as a list).
        var frames: [[UInt8]] { count == 0 ? [] : [first] + rest }

        /// The frames' bytes together.
        var byteCount: Int { rest.reduce(first.count) { $0 + $1.count } }

        /// The largest frame's size.
        var largestFrame: Int { rest.reduce(first.count) { max($0, $1.count) } }

        /// Calls `body` with each frame in order.
        func forEachFrame(_ body: ([UInt8]) -> Void) {
            guard count > 0 else { return }
            body(first)
            rest.forEach(body)
        }
    }

    /// The waiters of a flight, in the order they joined. Most flights have one, held inline:
    /// an array is made only when a second joins (a coalesced request).
    struct WaiterList: Sequence {
        /// The first waiter's handle; nil when there is none. Never nil while ``others``
        /// holds any.
        private var head: SlabHandle?
        private var others: [SlabHandle] = []

        var count: Int { head == nil ? 0 : 1 + others.count }
        var isEmpty: Bool { head == nil }

        mutating func append(_ id: SlabHandle) {
            if head == nil { head = id } else { others.append(id) }
        }

        /// Removes `id`, keeping the others' order.
        mutating func remove(_ id: SlabHandle) {
            if head == id {
                head = others.isEmpty ? nil : others.removeFirst()
            } else {
                others.removeAll { $0 == id }
            }
        }

        func makeIterator() -> Iterator { Iterator(head: head, others: others) }

        struct Iterator: IteratorProtocol {
            fileprivate let head: SlabHandle?
            fileprivate let others: [SlabHandle]
            private var index = -1

            fileprivate init(head: SlabHandle?, others: [SlabHandle]) {
                self.head = head
                self.others = others
            }

            mutating func next() -> SlabHandle? {
                defer { index += 1 }
                if index == -1 { return head }
                return index < others.count ? others[index] : nil
            }
        }
    }
}
