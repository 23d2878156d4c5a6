import CanopyCapture
import CanopyIO
import CanopyMessages
import CanopyWire
import Collections
import Histogram

/// The broker's routing logic as a pure state machine: messages and clock ticks go in,
/// frames to send come out. It owns no socket and reads no clock; the time is always an
/// argument, so tests drive it without sockets or sleeps. ``BrokerServer`` is the IO shell.
///
/// Routing: requests go by service name to a worker of that service that declared the
/// operation and has credit, round robin; otherwise they wait in a bounded per-service
/// queue. Each request has a deadline. A dead worker's idempotent requests are sent once
/// more to another worker; its other requests are answered `workerLost`.
///
/// Coalescing: what goes to a worker is a *flight*; the clients waiting for it are its
/// *waiters*. A request identical to a coalescable flight in the air (same service,
/// operation, principal and body bytes) joins it as one more waiter instead of reaching a
/// worker; the reply fans out to every waiter under its own correlation id.
///
/// It is the router over parts that each keep one kind of state and are tested on their own:
/// ``FlightTable`` (flights, waiters, deadlines, held bytes), ``WorkerTable`` (workers, their
/// services, operation counters), ``Hold`` (the snapshot hold), ``MajordomoBridge`` (7/MDP
/// peers in Canopy's terms) and ``Management`` (the broker's own operations). This type
/// decides: which flight a request joins, which worker takes it, who is answered what.
///
/// Owned by one loop and never copied: workers, services and flights are references inside.
public struct BrokerState {
    /// Something the IO shell must do.
    public enum Directive: Equatable, Sendable {
        /// Send a canopy/3 message to the peer with routing identity `to`.
        case send(to: [UInt8], WireMessage)
        /// Send a Majordomo message to the peer with routing identity `to`.
        case sendMajordomo(to: [UInt8], MajordomoMessage)
        /// A message was dropped or refused; the shell writes one log line.
        case log(String, peer: [UInt8])
        /// A client's request or its answer, for the capture (only while ``capturing``); the
        /// shell stamps the wall-clock time and hands it to the capture's writer.
        case capture(CaptureEvent)
        /// `broker.capture.*` from a client: the shell starts or stops the capture and answers.
        case captureControl(CaptureControl, client: [UInt8], correlation: [UInt8])
    }

    /// What a `broker.capture.*` request asks.
    public enum CaptureControl: Equatable, Sendable {
        case start(Broker.CaptureStart.Request)
        case stop
        case status
        /// A hold's requests in the air are all answered: answer its `capture.start` (the cut).
        case cut
        /// A hold ended before its cut: its `capture.start` is answered with this error (and
        /// the shell stops the capture when `stopCapture`: requests in the air were not
        /// answered in time; not when a `capture.stop` ended it, which stops it itself).
        case holdFailed(CanopyError, stopCapture: Bool)
        /// `capture.release` ended the hold (true) or found none (false).
        case released(Bool)
    }

    /// Which protocol a peer speaks.
    enum Dialect {
        case canopy
        case majordomo
    }

    /// The settings in force.
    public internal(set) var configuration: BrokerConfiguration
    let startedAt: ContinuousClock.Instant
    /// ``BrokerConfiguration/workerExpiry``, worked out once (a `Duration` times an integer
    /// goes through 128-bit arithmetic, and every worker message renews an expiry).
    let workerExpiry: Duration
    /// Flights and their waiters, with their deadlines and bytes.
    let flights: FlightTable
    /// Workers and the services they make up.
    var workers = WorkerTable()
    /// Clients' routing identities, each kept once.
    var clientNames = ClientNames()
    /// The allow-list in force, read from ``configuration`` (``replaceKeys(workers:clients:into:)``
    /// changes both). Kept rather than made per request: every request consults it.
    var keys: KeyPolicy
    var nextHeartbeat: ContinuousClock.Instant
    var rejected: UInt64 = 0
    /// Messages dropped or refused because they were malformed (bad frames, bad commands).
    var malformed: UInt64 = 0
    /// Bytes of request bodies held now, queued or at a worker (see ``BrokerConfiguration/maximumHeldBytes``).
    public var heldBytes: Int { flights.heldBytes }
    var shuttingDown = false
    /// Answer latencies not yet handed to the metrics: (service, nanoseconds). Only when
    /// ``BrokerConfiguration/metrics`` is on; drained each loop pass.
    var latencies: [(service: String, nanoseconds: Int64)] = []
    /// Until then, requests for services no worker has registered yet wait in a queue
    /// instead of being answered `noWorkers`: after a broker restart, clients reconnect
    /// before workers do.
    var startupGraceEnds: ContinuousClock.Instant?
    let codec = MessageCodec()
    /// Whether requests and answers go to the capture (set by the shell while one runs).
    public var capturing = false
    /// A hold for a snapshot, while one is in force (see BrokerState+Hold.swift).
    var hold: Hold?
    /// Whether ``hold`` holds one: asked on every request, where `hold != nil` copied the
    /// whole hold to compare it.
    var holding = false
    /// Requests held for a snapshot now.
    public var heldCount: Int? { hold.map { $0.held.count } }
    /// The capture's counts as the shell last saw them (at most a second old), for `broker.stats`.
    public var captureStatus: CaptureStatus?
    /// Bytes of replies waiting unread for clients, and replies dropped at the bounds since
    /// the start, as the shell counts them (``ReplyBacklog``), for `broker.stats`.
    public var unreadReplies: (bytes: Int, dropped: UInt64) = (0, 0)
    /// The broker's part of sampled traces, when it records one (``traceRequests(into:)``).
    var tracing: BrokerTracing?

    /// - Parameters:
    ///   - configuration: the broker's tunables.
    ///   - now: the time the broker starts.
    public init(configuration: BrokerConfiguration, now: ContinuousClock.Instant) {
        self.configuration = configuration
        self.startedAt = now
        workerExpiry = configuration.workerExpiry
        flights = FlightTable(startedAt: now)
        keys = KeyPolicy(workerKeys: configuration.workerKeys, clientKeys: configuration.clientKeys)
        self.nextHeartbeat = now + configuration.heartbeatInterval
        self.startupGraceEnds = now + (configuration.startupGrace ?? configuration.workerExpiry)
    }

    /// Notes sampled requests for the broker's spans in `tracing` (see ``BrokerTracing``).
    /// Either way a request's trace context passes to its worker untouched.
    public mutating func traceRequests(into tracing: BrokerTracing) {
        self.tracing = tracing
    }

    // MARK: - Queries

    /// Client requests held now, queued, at a worker, or waiting on a flight.
    public var pendingCount: Int { flights.waiterCount }

    /// Workers connected now.
    public var workerCount: Int { workers.count }

    /// Flights held now (what is queued for or at workers).
    public var flightCount: Int { flights.count }

    /// Deadlines kept, answered ones not yet dropped included (bounded: ``DeadlineQueue``).
    public var deadlineCount: Int { flights.deadlineCount }

    /// When ``tick(now:into:)`` next has work: the next heartbeat or deadline.
    public mutating func nextWakeup() -> ContinuousClock.Instant {
        var wakeup = nextHeartbeat
        if let deadline = flights.nextDeadline(), deadline < wakeup { wakeup = deadline }
        if holding, let hold { wakeup = min(wakeup, hold.nextWakeup) }
        return wakeup
    }

    // MARK: - Input

    /// Handles one message from a peer. `frames` excludes the identity frame the ROUTER adds.
    ///
    /// - Parameters:
    ///   - frames: the message, without the ROUTER's identity frame.
    ///   - peer: the peer's routing identity.
    ///   - key: the CurveZMQ public key (Z85) the peer authenticated with, when the broker
    ///     runs with CURVE; it decides whether the peer may register as a worker.
    ///   - stack: the stack the peer announced, when it announced one; a peer of another stack
    ///     than ``BrokerConfiguration/stack`` is refused.
    ///   - now: the time.
    ///   - out: where the directives go.
    public mutating func receive(
        _ frames: [[UInt8]], from peer: [UInt8], key: String? = nil, stack: String? = nil,
        now: ContinuousClock.Instant, into out: inout [Directive]
    ) {
        handle(frames, from: peer, key: key, stack: stack, now: now, into: &out)
    }

    /// The frames read in place from the broker's socket (``ReceivedFrames``); see above.
    public mutating func receive(
        _ frames: ReceivedFrames, from peer: [UInt8], key: String? = nil, stack: String? = nil,
        now: ContinuousClock.Instant, into out: inout [Directive]
    ) {
        handle(frames, from: peer, key: key, stack: stack, now: now, into: &out)
    }

    /// One body for both, specialized in this module for each.
    private mutating func handle<Frames: FrameList>(
        _ frames: Frames, from peer: [UInt8], key: String?, stack: String?,
        now: ContinuousClock.Instant, into out: inout [Directive]
    ) {
        if MajordomoMessage.claims(frames) {
            receiveMajordomo(frames.arrays, from: peer, key: key, now: now, into: &out)
            return
        }
        let message: WireMessage
        do {
            message = try WireMessage(frames: frames)
        } catch {
            switch error.command {
            case .ready?:
                // A worker hears why it may not register, as for every refused READY.
                out.append(.log("worker refused: \(error.reason.rawValue)", peer: peer))
                out.append(.send(to: peer, .brokerDisconnect(reason: error.description)))
            case .workerReply?, .workerReplyBatch?, .workerHeartbeat?, .workerDisconnect?, .drain?, .credit?:
                dropMalformed(error.reason.rawValue, peer: peer, into: &out) // workers get no error frames
            default:
                dropMalformed(error.reason.rawValue, peer: peer, into: &out)
                replyError(to: peer, correlation: error.correlation, CanopyError(.badRequest, error.description), into: &out)
            }
            return
        }
        if let stack, let own = configuration.stack, stack != own {
            refuseForeignStack(message, stack: stack, own: own, peer: peer, into: &out)
            return
        }
        // A worker's oversized reply still answers its callers (with `tooLarge`) and gives its
        // credit back; workerReply checks the body's size.
        if message.command != .workerReply, message.command != .workerReplyBatch,
            let oversized = (0..<frames.count).first(where: { frames.byteCount($0) > configuration.maximumFrameBytes })
        {
            rejected += 1
            out.append(.log("frame over the size limit", peer: peer))
            var correlation: [UInt8] = []
            if case .request(let request) = message { correlation = request.correlation }
            replyError(to: peer, correlation: correlation, tooLarge(frames.byteCount(oversized)), into: &out)
            return
        }
        switch message {
        case .workerReply, .workerReplyBatch, .workerHeartbeat, .workerDisconnect, .drain:
            // Looked up only when workers have keys: without them no worker can pose as another.
            if keys.checksWorkerKeys, let worker = workers[PeerKey(peer)], keys.impersonates(worker, key: key) {
                dropMalformed("worker message with another key than the worker registered with", peer: peer, into: &out)
                return
            }
        default: break
        }
        switch message {
        case .request(let request):
            if let reason = keys.unauthorizedCaller(key) ?? keys.unauthorizedService(key, flags: request.header.flags) {
                rejected += 1
                replyError(to: peer, correlation: request.correlation, CanopyError(.unauthorized, reason), into: &out)
                return
            }
            clientRequest(request, from: peer, now: now, into: &out)
        case .cancel(let correlation): clientCancel(correlation, from: peer, now: now, into: &out)
        case .ready(let service, let operations, let credit):
            workerReady(service: service, operations: operations, credit: credit, from: PeerKey(peer), key: key, now: now, into: &out)
        case .workerReply(let id, let failed, let body, let attachments):
            guard let worker = workers[PeerKey(peer)] else { return unknownWorker(PeerKey(peer), into: &out) }
            workerReply(id: id, failed: failed, payload: Payload(body: body, attachments: attachments), from: worker, now: now, into: &out)
        case .workerReplyBatch(let replies):
            // Looked up once for the batch; an unknown worker is told once, not once a reply.
            guard let worker = workers[PeerKey(peer)] else { return unknownWorker(PeerKey(peer), into: &out) }
            for reply in replies {
                workerReply(id: reply.requestID, failed: reply.failed, payload: Payload(body: reply.body), from: worker, now: now, into: &out)
            }
        case .workerHeartbeat: workerHeartbeat(from: PeerKey(peer), now: now, into: &out)
        case .workerDisconnect: workerGone(PeerKey(peer), now: now, into: &out)
        case .drain: workerDrain(from: PeerKey(peer), now: now, into: &out)
        case .credit(let credit): workerCredit(credit, from: PeerKey(peer), now: now, into: &out)
        case .reply, .error, .dispatch, .dispatchBatch, .cancelDispatch, .brokerHeartbeat, .brokerDisconnect:
            dropMalformed("command not accepted by a broker", peer: peer, into: &out)
            replyError(
                to: peer, correlation: [],
                CanopyError(.badRequest, "command 0x\(String(message.command.rawValue, radix: 16)) is sent by the broker, not to it"), into: &out)
        }
    }

    /// Refuses a message from a peer of another stack: a READY with DISCONNECT, a request
    /// with `unauthorized`, anything else dropped; each says which stacks met.
    private mutating func refuseForeignStack(_ message: WireMessage, stack: String, own: String, peer: [UInt8], into out: inout [Directive]) {
        let reason =
            "this broker belongs to stack \(own.prefix(64)), the peer to stack \(stack.prefix(64)): two stacks share one broker endpoint; give each stack its own (canopy up --broker)"
        switch message {
        case .ready:
            out.append(.log("worker refused: another stack", peer: peer))
            out.append(.send(to: peer, .brokerDisconnect(reason: reason)))
        case .request(let request):
            rejected += 1
            replyError(to: peer, correlation: request.correlation, CanopyError(.unauthorized, reason), into: &out)
        default:
            dropMalformed("message from another stack", peer: peer, into: &out)
        }
    }

    /// Expires deadlines and, when due, sends heartbeats and expires silent workers.
    public mutating func tick(now: ContinuousClock.Instant, into out: inout [Directive]) {
        while let id = flights.nextExpired(now: now) {
            let flightID = flights[waiter: id].flight
            if flights.contains(flightID) {
                flights[flightID].service.errors += 1
                flights[flightID].counters.count(.timeout)
                if configuration.metrics { noteLatency(flights[flightID].service.name, nanoseconds: (now - flights[waiter: id].receivedAt).nanoseconds) }
            }
            let facts = capturing ? captureFacts(flightID) : nil // before the flight closes with its last waiter
            let waiter = detach(id, now: now, into: &out)
            withUnsafePointer(to: waiter) { answer(id, $0, .failure(Self.timeout(waiter.serviceName)), shared: false, flight: facts, now: now, into: &out) }
        }
        if holding { checkHold(now: now, into: &out) }
        if let graceEnds = startupGraceEnds, now >= graceEnds {
            startupGraceEnds = nil
            endStartupGrace(now: now, into: &out)
        }
        guard now >= nextHeartbeat else { return }
        nextHeartbeat = now + configuration.heartbeatInterval
        clientNames.sweep(now: now)
        for worker in workers.all {
            out.append(worker.heartbeat(maximumFrameBytes: configuration.maximumFrameBytes))
        }
        for worker in workers.expired(now: now) {
            out.append(.log("worker expired after missed heartbeats", peer: worker.identity.bytes))
            workerGone(worker.identity, now: now, into: &out)
        }
    }

    /// The ids a service's queue holds, live or taken out and not yet compacted (for tests of
    /// its bound).
    public func queueLength(of service: String) -> Int {
        workers.service(service)?.queue.count ?? 0
    }

    /// Stops taking new requests (they are answered `shuttingDown`: not run, so a client of
    /// several brokers sends them to another); held ones are still answered.
    public mutating func beginShutdown() {
        shuttingDown = true
    }

    /// Tells every worker to go away; called last in a graceful shutdown.
    public mutating func disconnectAll(into out: inout [Directive]) {
        for worker in workers.all {
            out.append(worker.disconnect(reason: "broker shutting down"))
        }
    }

    /// Hands every answer latency recorded since the last call to `body`, then forgets them.
    public mutating func drainLatencies(_ body: (_ service: String, _ nanoseconds: Int64) -> Void) {
        guard !latencies.isEmpty else { return }
        for (service, nanoseconds) in latencies { body(service, nanoseconds) }
        latencies.removeAll(keepingCapacity: true)
    }

    mutating func noteLatency(_ service: String, nanoseconds: Int64) {
        latencies.append((service, nanoseconds))
    }

    // MARK: - Errors

    /// A message of more frames than the shell keeps (``ReceivedFrames/maximumFrames``: more
    /// than any canopy/3 or Majordomo message has): dropped whole, counted and logged, as
    /// malformed frames are (it cannot be read far enough to be answered).
    public mutating func dropOverlong(from peer: [UInt8], into out: inout [Directive]) {
        dropMalformed("message of more than \(ReceivedFrames.maximumFrames) frames", peer: peer, into: &out)
    }

    /// Counts a malformed message and asks the shell to log it (the shell rate-limits).
    mutating func dropMalformed(_ reason: String, peer: [UInt8], into out: inout [Directive]) {
        rejected += 1
        malformed += 1
        out.append(.log(reason, peer: peer))
    }

    func tooLarge(_ count: Int) -> CanopyError {
        Self.tooLarge(count, limit: configuration.maximumFrameBytes)
    }

    /// What a request with a frame over the broker's limit is answered.
    public static func tooLarge(_ count: Int, limit: Int) -> CanopyError {
        CanopyError(.tooLarge, "a frame of \(count) bytes is over the broker's limit of \(limit) bytes; send less per request or raise --max-frame-bytes")
    }

    /// What a request for a service without workers is answered.
    public static func noWorkers(_ service: String) -> CanopyError {
        CanopyError(.noWorkers, "no worker serves '\(service)'; start one (canopy services lists what is connected)")
    }

    /// What a request for an operation its service's workers did not declare is answered.
    public static func unknownOperation(_ operation: String, of service: String, known: [String]) -> CanopyError {
        CanopyError(.badRequest, "service '\(service)' has no operation '\(operation)'; it has: \(known.joined(separator: ", "))")
    }

    /// What a request whose deadline passed is answered.
    public static func timeout(_ service: String) -> CanopyError {
        CanopyError(.timeout, "no reply from '\(service)' within the request's deadline; the service may be overloaded")
    }

    /// An error to a Canopy peer.
    mutating func replyError(to peer: [UInt8], correlation: [UInt8], _ error: CanopyError, into out: inout [Directive]) {
        let body = (try? codec.encode(error)) ?? Array(#"{"code":"internal","message":"unencodable error"}"#.utf8)
        out.append(.send(to: peer, .error(correlation: correlation, error: body)))
    }

    // MARK: - Management

    /// Carries out a call of the broker's own operations (``Management``).
    mutating func management(
        _ operation: String, body requestBody: [UInt8], header: RequestHeader, to client: [UInt8], correlation: [UInt8],
        now: ContinuousClock.Instant, into out: inout [Directive]
    ) {
        let call: Management.Call
        switch Management.read(operation, body: requestBody, header: header, codec: codec) {
        case .success(let read): call = read
        case .failure(let error):
            rejected += 1
            return replyError(to: client, correlation: correlation, error, into: &out)
        }
        let body: [UInt8]?
        switch call {
        case .services: body = try? codec.encode(serviceDescriptions())
        case .stats: body = try? codec.encode(statistics(now: now))
        case .captureStart(let request):
            return out.append(.captureControl(.start(request), client: client, correlation: correlation))
        case .captureStop:
            releaseHold(snapshot: nil, now: now, into: &out) // a capture stopped mid-hold lets its held requests go
            return out.append(.captureControl(.stop, client: client, correlation: correlation))
        case .captureRelease(let snapshot):
            let released = hold?.waiting == nil && releaseHold(snapshot: snapshot, now: now, into: &out)
            return out.append(.captureControl(.released(released), client: client, correlation: correlation))
        case .captureStatus:
            return out.append(.captureControl(.status, client: client, correlation: correlation))
        case .hold(let limit):
            guard hold == nil else {
                return replyError(
                    to: client, correlation: correlation,
                    CanopyError(.conflict, "a hold is in force already (a backup or a snapshot is being taken); try again in a moment"), into: &out)
            }
            return beginHold(limit: limit, client: client, correlation: correlation, forCapture: false, now: now, into: &out)
        }
        out.append(.send(to: client, .reply(correlation: correlation, shared: false, body: body ?? [])))
    }

    /// What `broker.services` answers.
    public func serviceDescriptions() -> [ServiceDescription] {
        workers.descriptions()
    }

    /// What `broker.stats` answers.
    public func statistics(now: ContinuousClock.Instant) -> BrokerStatistics {
        var statistics = BrokerStatistics(
            uptimeSeconds: (now - startedAt).seconds, rejected: rejected, malformed: malformed, heldBytes: heldBytes, openFlights: flights.openCount,
            services: workers.statistics(), operations: workers.operationStatistics)
        statistics.capture = captureStatus
        statistics.unreadReplyBytes = unreadReplies.bytes
        statistics.slowReaderDrops = unreadReplies.dropped
        statistics.staleAnswers = flights.staleAnswers
        return statistics
    }
}
