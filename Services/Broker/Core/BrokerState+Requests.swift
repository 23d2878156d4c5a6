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

    mutating func clientRequest(_ request: WireRequest, from client: [UInt8], now: ContinuousClock.Instant, into out: inout [Directive]) {
        let hash = ClientTable.hash(client: client, correlation: request.correlation) // the one hash of this request
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
        if hold != nil, holds(intake, now: now, into: &out) { return } // captured when released
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
                if now - flight.createdAt >= configuration.stuckFlightAge {
                    flights.stopJoining(flight) // stuck: it keeps its waiters but takes no new ones
                } else if flight.waiters.count >= configuration.maximumWaitersPerFlight {
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
                    counters.requests += 1
                    counters.coalesced += 1
                    join(flight, intake, now: now, timeout: timeout, coalesced: true)
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
        guard flights.heldBytes + bytes + Self.waiterBytes(intake) + Flight.bookkeepingBytes <= configuration.maximumHeldBytes else {
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
        counters.requests += 1
        let flight = Flight(
            id: flights.makeID(), service: service, operation: intake.operation, header: intake.header, payload: intake.payload,
            key: key, createdAt: now, counters: counters)
        flight.resolved = resolved
        flights.add(flight)
        let waiter = join(flight, intake, now: now, timeout: timeout, coalesced: false)
        if let tracing, waiter.traced {
            flight.traced = true
            tracing.note(
                .flight(flight.id, waiter: waiter.id, service: service.name, operation: intake.operation, queued: worker == nil, at: BrokerTracing.now))
        }
        if let worker {
            dispatch(flight, to: worker, now: now, into: &out)
        } else {
            flights.enqueue(flight)
        }
    }

    /// What a waiter for `intake` will cost (``Waiter/bytes``), before it is made.
    static func waiterBytes(_ intake: Intake) -> Int {
        2 * (intake.client.count + intake.correlation.count) + intake.serviceName.utf8.count + Waiter.bookkeepingBytes
    }

    /// Adds a waiter for `intake` to `flight` (`coalesced`: a flight already in the air).
    @discardableResult
    private mutating func join(_ flight: Flight, _ intake: Intake, now: ContinuousClock.Instant, timeout: Duration, coalesced: Bool) -> Waiter {
        let waiter = Waiter(
            id: flights.makeID(), client: intake.client, correlation: intake.correlation, clientHash: intake.clientHash, dialect: intake.dialect,
            serviceName: intake.serviceName, receivedAt: now, deadline: now + timeout, flight: flight.id)
        if let tracing, let caller = intake.header.trace {
            waiter.traced = true
            tracing.note(
                .waiter(
                    waiter.id, caller: caller, service: flight.service.name, operation: intake.operation, coalesced: coalesced,
                    flight: coalesced && flight.traced ? flight.id : nil, at: BrokerTracing.now))
        }
        flights.add(waiter, to: flight, timeout: intake.header.timeoutMilliseconds)
        return waiter
    }

    mutating func clientCancel(_ correlation: [UInt8], from client: [UInt8], now: ContinuousClock.Instant, into out: inout [Directive]) {
        let hash = ClientTable.hash(client: client, correlation: correlation)
        guard let waiter = flights.waiter(client: client, correlation: correlation, hash: hash) else {
            _ = hold?.cancel(client: client, correlation: correlation)
            return // nothing held under that id: already answered, or never sent
        }
        if waiter.traced {
            tracing?.note(.waiterEnded(waiter.id, shared: false, error: nil, event: "cancelled by the caller", at: BrokerTracing.now))
        }
        detach(waiter, now: now, into: &out)
    }

    /// Removes a waiter from its flight without answering it. The flight goes on for the
    /// others; when the last one leaves, the flight is dropped from the queue or cancelled at
    /// its worker (which keeps the credit until it replies).
    mutating func detach(_ waiter: Waiter, now: ContinuousClock.Instant, into out: inout [Directive]) {
        flights.forget(waiter)
        guard let flight = flights[waiter.flight] else { return }
        flight.waiters.remove(waiter.id)
        if !flight.waiters.isEmpty {
            flight.counters.detached += 1
            return
        }
        if let worker = flight.worker, let cancel = cancelDirective(flight, worker: worker) {
            out.append(cancel)
        }
        close(flight) // a queued one's id stays in the queue, skipped (see ``FlightTable/unqueue(_:)``)
    }

    /// Forgets a flight: no waiter will join it again.
    mutating func close(_ flight: Flight) {
        guard flights.remove(flight) else { return }
        hold?.flightClosed(flight.id)
        if flight.traced { // closed unanswered: its last waiter left
            tracing?.note(
                .flightEnded(flight.id, waiters: flight.totalWaiters, dispatches: flight.dispatches, error: nil, cancelled: true, at: BrokerTracing.now))
            flight.traced = false
        }
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

    /// Answers every waiter of `flight` at once, each under its own correlation id.
    mutating func finish(_ flight: Flight, _ outcome: Outcome, now: ContinuousClock.Instant, into out: inout [Directive]) {
        if flight.traced {
            tracing?.note(
                .flightEnded(
                    flight.id, waiters: flight.totalWaiters, dispatches: flight.dispatches, error: outcome.error, cancelled: false,
                    at: BrokerTracing.now))
            flight.traced = false
        }
        close(flight)
        let shared = flight.totalWaiters > 1
        for id in flight.waiters {
            guard let waiter = flights.waiter(id) else { continue }
            flights.forget(waiter)
            _ = flight.service.latencyMicros.record(UInt64(max(0, (now - waiter.receivedAt).microseconds)))
            if configuration.metrics { noteLatency(flight.service.name, now - waiter.receivedAt) }
            switch outcome {
            case .reply:
                flight.service.served += 1
                flight.counters.count(nil)
            case .failure(let error):
                flight.service.errors += 1
                flight.counters.count(error.code)
            }
            answer(waiter, outcome, shared: shared, flight: flight, now: now, into: &out)
        }
    }

    /// Sends one waiter its answer, in its protocol (and to the capture, while one runs).
    func answer(_ waiter: Waiter, _ outcome: Outcome, shared: Bool, flight: Flight?, now: ContinuousClock.Instant, into out: inout [Directive]) {
        if waiter.traced {
            tracing?.note(.waiterEnded(waiter.id, shared: shared, error: outcome.error, event: nil, at: BrokerTracing.now))
        }
        if capturing {
            out.append(
                .capture(
                    capturedAnswer(
                        outcome, client: waiter.client, correlation: waiter.correlation, dialect: waiter.dialect,
                        service: waiter.serviceName, operation: flight?.operation ?? "", header: flight?.header,
                        worker: flight?.worker?.identity.bytes ?? [], shared: shared, latency: now - waiter.receivedAt)))
        }
        switch (waiter.dialect, outcome) {
        case (.canopy, .reply(let payload, _)):
            out.append(.send(to: waiter.client, .reply(correlation: waiter.correlation, shared: shared, body: payload.first, attachments: payload.rest)))
        case (.canopy, .failure(let error)):
            replyError(to: waiter.client, correlation: waiter.correlation, error, into: &out)
        case (.majordomo, _):
            out.append(
                .sendMajordomo(to: waiter.client, .client(service: Array(waiter.serviceName.utf8), body: MajordomoBridge.answerBody(outcome, codec: codec))))
        }
    }

    /// An error to a request that never became a waiter.
    func send(_ error: CanopyError, to intake: Intake, into out: inout [Directive]) {
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
                } else if service.describe(flight.operation) == nil {
                    finish(
                        flight, .failure(Self.unknownOperation(flight.operation, of: service.name, known: service.operations.map(\.name))), now: now, into: &out
                    )
                }
            }
            flights.compactQueue(of: service)
            if service.workers.isEmpty { workers.drop(service) }
        }
    }
}
