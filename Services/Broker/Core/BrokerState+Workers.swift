import CanopyIO
import CanopyMessages
import CanopyWire
import Collections

// Workers of both protocols: registration, replies, heartbeats, loss, and dispatch.

extension BrokerState {
    mutating func workerReady(
        service: String, operations: [OperationDescriptor], credit: UInt32, from peer: PeerKey, key: String?,
        now: ContinuousClock.Instant, into out: inout [Directive]
    ) {
        func refuse(_ reason: String) {
            out.append(.log("worker refused: \(reason)", peer: peer.bytes))
            out.append(.send(to: peer.bytes, .brokerDisconnect(reason: reason)))
        }
        guard let name = KeyPolicy.serviceName(Array(service.utf8)) else {
            return refuse("invalid or reserved service name; use 1 to 128 of a-z, 0-9, '.', '-', '_', not 'broker' or 'mmi.'")
        }
        if let reason = keys.unauthorizedWorker(key, service: name) { return refuse(reason) }
        guard credit >= 1, credit <= 100_000 else {
            return refuse("credit must be a 4-byte big-endian number from 1 to 100000")
        }
        var table: [String: OperationDescriptor] = [:]
        for operation in operations {
            // Only idempotent operations may be coalesced.
            table[operation.name] = OperationDescriptor(
                name: operation.name, idempotent: operation.idempotent, coalescable: operation.coalescable && operation.idempotent)
        }
        if let reason = register(peer, dialect: .canopy, service: name, operations: table, credit: Int(credit), key: key, now: now, into: &out) {
            refuse(reason)
        }
    }

    /// Takes a reloaded allow-list: workers whose key may no longer serve their service are told
    /// DISCONNECT and removed (what they held goes as for a lost worker), and requests from
    /// keys on neither list are refused from now on.
    public mutating func replaceKeys(workers: WorkerKeys, clients: Set<String>?, into out: inout [Directive]) {
        configuration.workerKeys = workers
        configuration.clientKeys = clients
        keys = KeyPolicy(workerKeys: workers, clientKeys: clients)
        let now = ContinuousClock.now
        for worker in Array(self.workers.all) where !workers.allows(worker.key, service: worker.service.name) {
            out.append(.log("worker removed: its key left the allow-list", peer: worker.identity.bytes))
            out.append(worker.disconnect(reason: "this worker's key was taken off the broker's allow-list"))
            workerGone(worker.identity, now: now, into: &out)
        }
    }

    /// Adds a worker to its service; returns why not when it cannot join.
    mutating func register(
        _ peer: PeerKey, dialect: Dialect, service name: String, operations: [String: OperationDescriptor],
        majordomoDescriptor: OperationDescriptor? = nil, credit: Int, key: String?, now: ContinuousClock.Instant, into out: inout [Directive]
    ) -> String? {
        if workers[peer] != nil { workerGone(peer, now: now, into: &out) }
        switch workers.add(
            peer, dialect: dialect, service: name, operations: operations, majordomoDescriptor: majordomoDescriptor, credit: credit,
            key: key, expiry: now + workerExpiry)
        {
        case .failure(let refusal):
            return refusal.reason
        case .success(let worker):
            // The first heartbeat at once: it tells a Canopy worker the broker's frame limit.
            out.append(worker.heartbeat(maximumFrameBytes: configuration.maximumFrameBytes))
            dispatchQueued(worker.service, now: now, into: &out)
            return nil
        }
    }

    /// A Canopy worker's reply: the body and its attachments.
    mutating func workerReply(id: UInt64, failed: Bool, payload: Payload, from worker: Worker, now: ContinuousClock.Instant, into out: inout [Directive]) {
        worker.expiry = now + workerExpiry
        let outcome: Outcome
        if payload.largestFrame > configuration.maximumFrameBytes {
            // Refused, but answered: the callers hear why at once and the credit comes back.
            rejected += 1
            out.append(.log("worker reply over the size limit", peer: worker.identity.bytes))
            outcome = .failure(oversizedReply(payload.largestFrame, flight: id))
        } else if !failed {
            outcome = .reply(payload, fromMajordomo: false)
        } else {
            outcome = .failure((try? codec.decode(CanopyError.self, from: payload.first)) ?? CanopyError(.internal, "the worker sent an unreadable error"))
        }
        complete(id, by: worker, outcome, now: now, into: &out)
    }

    /// What the callers of a flight whose reply was over the frame limit are told.
    func oversizedReply(_ count: Int, flight id: UInt64) -> CanopyError {
        var name = "the service"
        if let flight = SlabHandle(raw: id), flights.contains(flight) { name = "\(flights[flight].service.name).\(flights[flight].operation)" }
        return CanopyError(
            .tooLarge,
            "the reply of \(name) was \(count) bytes, over the broker's limit of \(configuration.maximumFrameBytes) bytes; ask for less (a smaller page, or the data in pieces)"
        )
    }

    /// A worker answered flight `id`: release its credit, answer the waiters, feed it more.
    mutating func complete(_ id: UInt64, by worker: Worker, _ outcome: Outcome, now: ContinuousClock.Instant, into out: inout [Directive]) {
        guard worker.held.removeValue(forKey: id) != nil else {
            out.append(.log("reply for a request the worker does not hold", peer: worker.identity.bytes))
            return
        }
        worker.service.inFlight -= 1
        if let flight = flights.answered(id), flights[flight].worker === worker {
            finish(flight, outcome, now: now, into: &out)
        } // else: every waiter left (cancel or deadline), and the flight's slot may hold another since; the late answer is dropped and counted
        dispatchQueued(worker.service, now: now, into: &out)
    }

    mutating func workerHeartbeat(from peer: PeerKey, now: ContinuousClock.Instant, into out: inout [Directive]) {
        guard let worker = workers[peer] else { return unknownWorker(peer, into: &out) }
        worker.expiry = now + workerExpiry
    }

    /// A worker's credit at this broker from now on (a worker of several brokers moves its
    /// credit between them): more is dispatched at once; less takes effect as it replies.
    mutating func workerCredit(_ credit: UInt32, from peer: PeerKey, now: ContinuousClock.Instant, into out: inout [Directive]) {
        guard let worker = workers[peer] else { return unknownWorker(peer, into: &out) }
        worker.expiry = now + workerExpiry
        guard worker.dialect == .canopy, credit <= 100_000 else {
            return dropMalformed("credit must be a 4-byte big-endian number from 0 to 100000", peer: peer.bytes, into: &out)
        }
        let more = Int(credit) > worker.credit
        worker.credit = Int(credit)
        if more { dispatchQueued(worker.service, now: now, into: &out) }
    }

    mutating func workerDrain(from peer: PeerKey, now: ContinuousClock.Instant, into out: inout [Directive]) {
        guard let worker = workers[peer] else { return unknownWorker(peer, into: &out) }
        worker.draining = true
        worker.expiry = now + workerExpiry
    }

    /// A worker the broker does not know (it registered with an earlier broker): tell it
    /// to register again.
    func unknownWorker(_ peer: PeerKey, into out: inout [Directive]) {
        out.append(.send(to: peer.bytes, .brokerDisconnect(reason: "unknown worker; send READY again")))
    }

    /// Removes a worker. Its idempotent flights go once more to another worker with their
    /// waiters still attached; the rest are answered `workerLost`.
    mutating func workerGone(_ peer: PeerKey, now: ContinuousClock.Instant, into out: inout [Directive]) {
        guard let worker = workers.remove(peer) else { return }
        let service = worker.service
        var retry: [SlabHandle] = []
        // Oldest first, so the flights go again in the order they came.
        let held = worker.held.ids.compactMap { SlabHandle(raw: $0) }.filter { flights.contains($0) && flights[$0].worker === worker }
        for flight in held.sorted(by: { flights[$0].serial < flights[$1].serial }) {
            let idempotent = worker.descriptor(for: flights[flight].operation)?.idempotent ?? false
            if idempotent && flights[flight].dispatches < 2 {
                flights[flight].worker = nil
                flights[flight].counters.redispatched += 1
                if flights[flight].traced {
                    let attempt = flights[flight].dispatches
                    tracing?.note(.flightEvent(flight.raw, name: "retried after worker loss", worker: nil, attempt: attempt, at: BrokerTracing.now))
                    tracing?.note(.flightEvent(flight.raw, name: "queued", worker: nil, attempt: attempt, at: BrokerTracing.now))
                }
                retry.append(flight)
            } else {
                let message =
                    idempotent
                    ? "the request was lost with two workers in a row; it was not sent a third time"
                    : "the worker died while holding this request; it may or may not have run, and it is not idempotent, so it was not sent again"
                finish(flight, .failure(CanopyError(.workerLost, message)), now: now, into: &out)
            }
        }
        for flight in retry.reversed() { // finish above closes only its own flight: these are all held
            flights.enqueue(flight, atFront: true)
        }
        if service.workers.isEmpty {
            workers.drop(service)
            for flight in flights.queued(in: service) {
                finish(
                    flight, .failure(CanopyError(.noWorkers, "the last worker of '\(service.name)' went away before it could take this request")), now: now,
                    into: &out)
            }
            service.queue.removeAll()
            return
        }
        dispatchQueued(service, now: now, into: &out)
    }

    // MARK: - Dispatch

    mutating func dispatch(_ flight: SlabHandle, to worker: Worker, now: ContinuousClock.Instant, into out: inout [Directive]) {
        flights.unqueue(flight)
        flights[flight].worker = worker
        flights[flight].dispatches += 1
        flights[flight].counters.workerCalls += 1
        worker.held[flight.raw] = ()
        flights[flight].service.inFlight += 1
        switch worker.dialect {
        case .canopy:
            // The worker may work until the last waiter gives up.
            var deadline = now
            for id in flights[flight].waiters where flights.containsWaiter(id) {
                deadline = max(deadline, flights[waiter: id].deadline)
            }
            var header = flights[flight].header
            header.timeoutMilliseconds = UInt32(clamping: max(1, (deadline - now).wholeMilliseconds))
            if flights[flight].traced {
                tracing?.note(
                    .flightEvent(flight.raw, name: "dispatched", worker: worker.identity.bytes.hex, attempt: flights[flight].dispatches, at: BrokerTracing.now))
            }
            let message = WireMessage.dispatch(
                requestID: flight.raw, operation: flights[flight].operation, header: header,
                body: flights[flight].payload.first, attachments: flights[flight].payload.rest)
            out.append(.send(to: worker.identity.bytes, message))
        case .majordomo:
            out.append(.sendMajordomo(to: worker.identity.bytes, MajordomoBridge.request(for: flights[flight], id: flight)))
        }
    }

    /// What tells `worker` to stop working on `flight`; `nil` for a Majordomo worker, which
    /// has no such command (its reply will be dropped).
    func cancelDirective(_ flight: SlabHandle, worker: Worker) -> Directive? {
        switch worker.dialect {
        case .canopy: .send(to: worker.identity.bytes, .cancelDispatch(requestID: flight.raw))
        case .majordomo: nil
        }
    }

    /// Hands queued flights of `service` to workers with credit, oldest first.
    ///
    /// Flights no worker with credit serves are skipped and put back at the front, in order;
    /// the rest of the queue is not touched (a reply that frees one credit costs one dispatch,
    /// not a copy of the queue).
    mutating func dispatchQueued(_ service: ServiceEntry, now: ContinuousClock.Instant, into out: inout [Directive]) {
        guard !service.queue.isEmpty else { return }
        var skipped: [SlabHandle] = []
        // No worker with credit: nothing to pop (and no list of skipped flights to make).
        while service.workers.contains(where: { $0.available > 0 }), let flight = service.queue.popFirst() {
            guard flights.isQueued(flight) else { continue }
            if let worker = service.freeWorker(for: flights[flight].operation, servedByAll: flights[flight].resolved?.servedByAll == true) {
                dispatch(flight, to: worker, now: now, into: &out)
            } else {
                skipped.append(flight) // no worker with credit serves its operation
            }
        }
        service.queue.prepend(contentsOf: skipped)
    }
}
