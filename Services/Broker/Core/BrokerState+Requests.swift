import CanopyCapture
import CanopyIO
import CanopyMessages
import CanopyWire
import Collections

// Client requests: intake, coalescing, cancel, and answering every waiter of a flight.

extension BrokerState {
    /// A request as it came in, in either protocol.
    struct Intake {
        let client: [UInt8]
        let correlation: [UInt8]
        /// ``ClientTable/hash(client:correlation:)`` of the two, for a Canopy client (0 else).
        var clientHash = 0
        let dialect: Dialect
        let serviceName: String
        let operation: String
        let header: RequestHeader
        let payload: Payload
    }

    mutating func clientRequest(_ request: WireRequest, from peer: [UInt8], now: ContinuousClock.Instant, into out: inout [Directive]) {
        let client = clientNames.intern(peer, now: now)
        let hash = ClientTable.hash(client: client, correlation: request.correlation) // kept by the waiter: removing it hashes nothing
        guard flights.waiter(client: client, correlation: request.correlation, hash: hash) == nil else {
            return // the same request again (a client resending after a reconnect): the first will be answered
        }
        if request.service == Broker.service {
            management(request.operation, body: request.body, header: request.header, to: client, correlation: request.correlation, now: now, into: &out)
            return
        }
        var intake = Intake(
            client: client, correlation: request.correlation, dialect: .canopy, serviceName: request.service,
            operation: request.operation, header: request.header, payload: Payload(body: request.body, attachments: request.attachments))
        intake.clientHash = hash
        admit(intake, now: now, into: &out)
    }

    /// Takes a well-formed request: joins an identical flight, or starts a flight that goes
    /// to a worker or waits in the service's queue; or refuses it.
    mutating func admit(_ intake: Intake, now: ContinuousClock.Instant, into out: inout [Directive]) {
        if holding, holds(intake, now: now, into: &out) { return } // captured when released
        if capturing { out.append(.capture(capturedRequest(intake))) }
        func refuse(_ error: CanopyError) {
            rejected += 1
            send(error, to: intake, into: &out)
        }
        if shuttingDown {
            return refuse(
                CanopyError(.shuttingDown, "the broker is shutting down and did not run this request; send it to another broker, or retry in a moment"))
        }
        let service: ServiceEntry
        if let known = workers.service(intake.serviceName) {
            service = known
        } else if startupGraceEnds != nil, let awaited = workers.awaitedService(intake.serviceName, limit: configuration.maximumGraceServices) {
            service = awaited // its workers are expected to register soon; how many such services is bounded
        } else {
            return refuse(Self.noWorkers(intake.serviceName))
        }
        let resolved = workers.resolve(intake.operation, of: service)
        guard resolved != nil || (service.workers.isEmpty && startupGraceEnds != nil) else {
            service.errors += 1
            return refuse(Self.unknownOperation(intake.operation, of: intake.serviceName, known: service.operations.map(\.name)))
        }
        let descriptor = resolved?.descriptor
        let counters = resolved?.counters ?? workers.counters(service: service.name, operation: intake.operation) // only in the start-up grace
        /// A refusal of a request whose operation is known: counted as the service's error
        /// and as the operation's outcome.
        func refuseCounted(_ error: CanopyError) {
            service.errors += 1
            counters.count(error.code)
            refuse(error)
        }
        var timeout = intake.header.timeoutMilliseconds == 0 ? configuration.defaultTimeout : .milliseconds(Int64(intake.header.timeoutMilliseconds))
        timeout = min(timeout, configuration.maximumTimeout)

        // Coalescing: join an identical flight in the air.
        var key: FlightKey?
        if configuration.coalescing, descriptor?.coalescable == true, !configuration.coalescingDisabledServices.contains(service.name) {
            let candidate = FlightKey(service: service.name, operation: intake.operation, principal: intake.header.principal, payload: intake.payload)
            if let flight = flights.open(candidate) {
                if now - flights[flight].createdAt >= configuration.stuckFlightAge {
                    flights.stopJoining(flight) // stuck: it keeps its waiters but takes no new ones
                } else if flights[flight].waiters.count >= configuration.maximumWaitersPerFlight {
                    return refuseCounted(
                        CanopyError(.busy, "\(configuration.maximumWaitersPerFlight) identical requests are already waiting on this one; retry later"))
                } else {
                    guard flights.heldBytes + Self.waiterBytes(intake) <= configuration.maximumHeldBytes else {
                        return refuseCounted(
                            CanopyError(
                                .busy,
                                "the broker holds \(flights.heldBytes) bytes of requests already (its limit is \(configuration.maximumHeldBytes)); retry later")
                        )
                    }
                    guard join(flight, intake, now: now, timeout: timeout, coalesced: true) != nil else {
                        return refuseCounted(Self.tooManyRecords)
                    }
                    counters.requests += 1
                    counters.coalesced += 1
                    return
                }
            }
            guard flights.openCount < configuration.maximumOpenFlights else {
                return refuseCounted(
                    CanopyError(.busy, "the broker holds \(configuration.maximumOpenFlights) distinct coalescable requests already; retry later"))
            }
            key = candidate
        }

        // A new flight, within the memory bounds: everything it and its waiter cost.
        let bytes = intake.payload.byteCount
        let flightBytes = Flight.bytes(payload: intake.payload, operation: intake.operation, principal: intake.header.principal, keyed: key != nil)
        guard flights.heldBytes + flightBytes + Self.waiterBytes(intake) <= configuration.maximumHeldBytes else {
            return refuseCounted(
                CanopyError(
                    .busy, "the broker holds \(flights.heldBytes) bytes of requests already (its limit is \(configuration.maximumHeldBytes)); retry later"))
        }
        let worker = service.freeWorker(for: intake.operation, servedByAll: resolved?.servedByAll == true)
        if worker == nil {
            guard service.queuedCount < configuration.maximumQueuedPerService else {
                return refuseCounted(
                    CanopyError(
                        .busy, "'\(service.name)' has \(configuration.maximumQueuedPerService) requests waiting already; retry later or start more workers"))
            }
            guard service.queuedBytes + bytes <= configuration.maximumQueuedBytesPerService else {
                return refuseCounted(
                    CanopyError(
                        .busy,
                        "'\(service.name)' has \(service.queuedBytes) bytes of requests waiting already (its limit is \(configuration.maximumQueuedBytesPerService)); retry later or start more workers"
                    ))
            }
        }
        // Made in the call, so it is moved into the slab rather than copied.
        let added = flights.add(
            Flight(
                service: service, operation: intake.operation, header: intake.header, payload: intake.payload, key: key, createdAt: now,
                counters: counters, resolved: resolved))
        guard let flight = added else { return refuseCounted(Self.tooManyRecords) }
        guard let waiter = join(flight, intake, now: now, timeout: timeout, coalesced: false) else {
            flights.remove(flight)
            return refuseCounted(Self.tooManyRecords)
        }
        counters.requests += 1
        if let tracing, flights[waiter: waiter].traced {
            flights[flight].traced = true
            tracing.note(
                .flight(flight.raw, waiter: waiter.raw, service: service.name, operation: intake.operation, queued: worker == nil, at: BrokerTracing.now))
        }
        if let worker {
            dispatch(flight, to: worker, now: now, into: &out)
        } else {
            flights.enqueue(flight)
        }
    }

    /// What a waiter for `intake` will cost (``Waiter/bytes``), before it is made.
    static func waiterBytes(_ intake: Intake) -> Int {
        Waiter.bytes(client: intake.client, correlation: intake.correlation, serviceName: intake.serviceName)
    }

    /// What a request is told when the broker holds its most flights or waiters (16,777,216
    /// of each; the memory bounds usually come first).
    static let tooManyRecords = CanopyError(.busy, "the broker holds as many requests as it can; retry later")

    /// Adds a waiter for `intake` to `flight` (`coalesced`: a flight already in the air) and
    /// returns its handle; nil when the broker holds its most waiters.
    private mutating func join(_ flight: SlabHandle, _ intake: Intake, now: ContinuousClock.Instant, timeout: Duration, coalesced: Bool) -> SlabHandle? {
        var waiter = Waiter(
            client: intake.client, correlation: intake.correlation, clientHash: intake.clientHash, dialect: intake.dialect,
            serviceName: intake.serviceName, receivedAt: now, deadline: now + timeout, flight: flight)
        let caller = tracing == nil ? nil : intake.header.trace
        waiter.traced = caller != nil
        guard let id = flights.add(consume waiter, to: flight, timeout: intake.header.timeoutMilliseconds) else { return nil }
        if let tracing, let caller {
            tracing.note(
                .waiter(
                    id.raw, caller: caller, service: flights[flight].service.name, operation: intake.operation, coalesced: coalesced,
                    flight: coalesced && flights[flight].traced ? flight.raw : nil, at: BrokerTracing.now))
        }
        return id
    }

    mutating func clientCancel(_ correlation: [UInt8], from client: [UInt8], now: ContinuousClock.Instant, into out: inout [Directive]) {
        let hash = ClientTable.hash(client: client, correlation: correlation)
        guard let waiter = flights.waiter(client: client, correlation: correlation, hash: hash) else {
            if holding { _ = hold?.cancel(client: client, correlation: correlation) }
            return // nothing held under that id: already answered, or never sent
        }
        if flights[waiter: waiter].traced {
            tracing?.note(.waiterEnded(waiter.raw, shared: false, error: nil, event: "cancelled by the caller", at: BrokerTracing.now))
        }
        detach(waiter, now: now, into: &out)
    }

    /// Removes a waiter from its flight without answering it. The flight goes on for the
    /// others; when the last one leaves, the flight is dropped from the queue or cancelled at
    /// its worker (which keeps the credit until it replies). Returns the waiter, no longer held.
    @discardableResult
    mutating func detach(_ id: SlabHandle, now: ContinuousClock.Instant, into out: inout [Directive]) -> Waiter {
        let waiter = flights.forget(id)
        let flight = waiter.flight
        guard flights.contains(flight) else { return waiter }
        flights[flight].waiters.remove(id)
        if !flights[flight].waiters.isEmpty {
            flights[flight].counters.detached += 1
            return waiter
        }
        if let worker = flights[flight].worker, let cancel = cancelDirective(flight, worker: worker) {
            out.append(cancel)
        }
        close(flight) // a queued one's handle stays in the queue, skipped (see ``FlightTable/unqueue(_:)``)
        return waiter
    }

    /// Forgets a flight: no waiter will join it again.
    mutating func close(_ id: SlabHandle) {
        guard flights.contains(id) else { return }
        if flights[id].traced { // closed unanswered: its last waiter left
            tracing?.note(
                .flightEnded(
                    id.raw, waiters: flights[id].totalWaiters, dispatches: flights[id].dispatches, error: nil, cancelled: true, at: BrokerTracing.now))
        }
        flights.remove(id)
        if holding { hold?.flightClosed(id.raw) }
    }

    /// What a flight ended with.
    enum Outcome {
        /// The worker's reply frames (one JSON body and its attachments from a Canopy
        /// worker; whatever a Majordomo worker sent).
        case reply(Payload, fromMajordomo: Bool)
        case failure(CanopyError)

        /// The error, when it failed.
        var error: CanopyError? {
            if case .failure(let error) = self { error } else { nil }
        }
    }

    /// Answers every waiter of `flight` at once, each under its own correlation id, then
    /// forgets the flight.
    mutating func finish(_ id: SlabHandle, _ outcome: Outcome, now: ContinuousClock.Instant, into out: inout [Directive]) {
        guard flights.contains(id) else { return }
        if flights[id].traced {
            tracing?.note(
                .flightEnded(
                    id.raw, waiters: flights[id].totalWaiters, dispatches: flights[id].dispatches, error: outcome.error, cancelled: false,
                    at: BrokerTracing.now))
            flights[id].traced = false
        }
        let shared = flights[id].totalWaiters > 1
        let (service, counters) = (flights[id].service, flights[id].counters)
        let facts = capturing ? captureFacts(id) : nil
        for waiterID in flights[id].waiters {
            guard flights.containsWaiter(waiterID) else { continue }
            flights.forget(waiterID) { waiter in
                let nanoseconds = (now - waiter.pointee.receivedAt).nanoseconds
                _ = service.latencyMicros.record(UInt64(max(0, nanoseconds / 1_000)))
                if configuration.metrics { noteLatency(service.name, nanoseconds: nanoseconds) }
                switch outcome {
                case .reply:
                    service.served += 1
                    counters.count(nil)
                case .failure(let error):
                    service.errors += 1
                    counters.count(error.code)
                }
                answer(waiterID, waiter, outcome, shared: shared, flight: facts, now: now, into: &out)
            }
        }
        close(id)
    }

    /// What the capture records of the flight an answer came from.
    struct CaptureFacts {
        let operation: String
        let header: RequestHeader
        let worker: [UInt8]
    }

    /// The capture's facts of flight `id`, when it is held.
    func captureFacts(_ id: SlabHandle) -> CaptureFacts? {
        guard flights.contains(id) else { return nil }
        return CaptureFacts(operation: flights[id].operation, header: flights[id].header, worker: flights[id].worker?.identity.bytes ?? [])
    }

    /// Sends one waiter (`id`, no longer held) its answer, in its protocol (and to the capture,
    /// while one runs, with `flight`: what it records of the flight the answer came from).
    ///
    /// Mutating, though it changes nothing of the state: a non-mutating method called from the
    /// mutating ones copied the whole state for the call (4.6% of the loop thread).
    mutating func answer(
        _ id: SlabHandle, _ waiter: UnsafePointer<Waiter>, _ outcome: Outcome, shared: Bool, flight: CaptureFacts?, now: ContinuousClock.Instant,
        into out: inout [Directive]
    ) {
        if waiter.pointee.traced {
            tracing?.note(.waiterEnded(id.raw, shared: shared, error: outcome.error, event: nil, at: BrokerTracing.now))
        }
        if capturing {
            out.append(
                .capture(
                    capturedAnswer(
                        outcome, client: waiter.pointee.client, correlation: waiter.pointee.correlation, dialect: waiter.pointee.dialect,
                        service: waiter.pointee.serviceName, operation: flight?.operation ?? "", header: flight?.header,
                        worker: flight?.worker ?? [], shared: shared, latency: now - waiter.pointee.receivedAt)))
        }
        switch waiter.pointee.dialect { // not a switch over a tuple: that copied the outcome
        case .canopy:
            switch outcome {
            case .reply(let payload, _):
                out.append(
                    .send(
                        to: waiter.pointee.client,
                        .reply(correlation: waiter.pointee.correlation, shared: shared, body: payload.first, attachments: payload.rest)))
            case .failure(let error):
                replyError(to: waiter.pointee.client, correlation: waiter.pointee.correlation, error, into: &out)
            }
        case .majordomo:
            out.append(
                .sendMajordomo(
                    to: waiter.pointee.client, .client(service: Array(waiter.pointee.serviceName.utf8), body: MajordomoBridge.answerBody(outcome, codec: codec))
                ))
        }
    }

    /// An error to a request that never became a waiter.
    mutating func send(_ error: CanopyError, to intake: Intake, into out: inout [Directive]) {
        if capturing {
            out.append(
                .capture(
                    capturedAnswer(
                        .failure(error), client: intake.client, correlation: intake.correlation, dialect: intake.dialect,
                        service: intake.serviceName, operation: intake.operation, header: intake.header,
                        worker: [], shared: false, latency: .zero)))
        }
        switch intake.dialect {
        case .canopy:
            replyError(to: intake.client, correlation: intake.correlation, error, into: &out)
        case .majordomo:
            out.append(
                .sendMajordomo(to: intake.client, .client(service: Array(intake.serviceName.utf8), body: MajordomoBridge.errorBody(error, codec: codec))))
        }
    }

    /// After the start-up grace: flights still waiting for a service nobody registered are
    /// answered `noWorkers`, and those for an operation no worker declared `badRequest`.
    mutating func endStartupGrace(now: ContinuousClock.Instant, into out: inout [Directive]) {
        for service in Array(workers.services.values) {
            for flight in flights.queued(in: service) {
                if service.workers.isEmpty {
                    finish(flight, .failure(Self.noWorkers(service.name)), now: now, into: &out)
                } else if service.describe(flights[flight].operation) == nil {
                    let operation = flights[flight].operation
                    finish(
                        flight, .failure(Self.unknownOperation(operation, of: service.name, known: service.operations.map(\.name))), now: now, into: &out)
                }
            }
            flights.compactQueue(of: service)
            if service.workers.isEmpty { workers.drop(service) }
        }
    }
}
