import CanopyWire
import CanopyIO
import CZeroMQ
import CanopyMessages
import Foundation
import Logging
import Metrics
import ServiceLifecycle
import Synchronization

/// Hosts one ``BusService`` on the bus: connects to the broker, announces the service's
/// operations and credit (READY), heartbeats both ways, runs handlers concurrently up to
/// its credit, and re-registers by itself when the broker restarts.
///
/// Graceful shutdown sends DRAIN (the broker stops sending new requests), waits for the
/// handlers that are running to reply, then sends DISCONNECT. The DEALER socket is owned by
/// the runner's loop thread; handlers run as Swift tasks and hand results back through a
/// ``Mailbox``.
public final class ServiceRunner: Service, @unchecked Sendable {
    /// How a runner connects and behaves.
    public struct Configuration: Sendable {
        /// The broker's endpoint.
        public var endpoint: String
        /// How many requests this worker holds at once.
        public var credit: Int = 8
        /// Heartbeat interval, both ways.
        public var heartbeatInterval: Duration = BusDefaults.heartbeatInterval
        /// Missed broker heartbeats before the runner reconnects.
        public var liveness: Int = BusDefaults.liveness
        /// How long a graceful shutdown waits for running handlers.
        public var drainTimeout: Duration = BusDefaults.drainTimeout
        /// CurveZMQ settings when the broker runs with CURVE; `nil` connects without.
        public var curve: CurveClientSettings?

        /// - Parameter endpoint: the broker's endpoint, for example `tcp://127.0.0.1:5555`.
        public init(endpoint: String) {
            self.endpoint = endpoint
        }
    }

    private enum Control: Sendable {
        case finished(id: UInt64, session: Int, Result<Payload, CanopyError>)
        case shutdown
    }

    private let handlers: OperationHandlers
    private let configuration: Configuration
    private let context: ZMQContext
    private let logger: Logger
    private let mailbox = Mailbox<Control>()
    private let codec = MessageCodec()
    private let registered = Atomic<Bool>(false)
    private let metrics: RunnerMetrics

    /// Whether the broker took this worker's READY and its heartbeats are flowing (for
    /// `/health`): set by the broker's first heartbeat, cleared when the connection is
    /// replaced or the runner stops.
    public var isRegistered: Bool { registered.load(ordering: .relaxed) }

    /// - Parameters:
    ///   - service: the service to host.
    ///   - configuration: endpoint, credit and timings.
    ///   - context: the ZeroMQ context.
    ///   - logger: where the runner and handlers log.
    public init(service: some BusService, configuration: Configuration, context: ZMQContext, logger: Logger) {
        var handlers = OperationHandlers(service: service.name)
        service.register(&handlers)
        precondition(!handlers.descriptors.isEmpty, "service '\(service.name)' registers no operation")
        self.handlers = handlers
        self.metrics = RunnerMetrics(service: service.name)
        metrics.credit.record(configuration.credit)
        self.configuration = configuration
        self.context = context
        var logger = logger
        logger[metadataKey: "service.name"] = "\(service.name)"
        self.logger = logger
    }

    /// Serves until graceful shutdown or ``stop()``.
    public func run() async throws {
        try await withGracefulShutdownHandler {
            try await LoopThread.run(name: "canopy-\(handlers.service)") { [self] in try loop() }
        } onGracefulShutdown: { [mailbox] in
            mailbox.post(.shutdown)
        }
    }

    /// Begins a graceful shutdown, as SIGTERM does.
    public func stop() {
        mailbox.post(.shutdown)
    }

    // MARK: - Loop (the loop thread only)

    private final class Session {
        let socket: ZMQSocket
        let number: Int
        var lastHeard: ContinuousClock.Instant
        init(socket: ZMQSocket, number: Int, now: ContinuousClock.Instant) {
            self.socket = socket
            self.number = number
            self.lastHeard = now
        }
    }

    private func connect(number: Int) throws -> Session {
        let socket = try ZMQSocket(context, type: .dealer)
        if let curve = configuration.curve { try socket.becomeCurveClient(curve) }
        try socket.setHighWaterMarks(100_000)
        try socket.set(ZMQ_RECONNECT_IVL, 100)
        try socket.set(ZMQ_RECONNECT_IVL_MAX, 5_000) // libzmq's reconnect backoff
        try socket.setHeartbeats(interval: configuration.heartbeatInterval, timeout: configuration.heartbeatInterval * configuration.liveness)
        try socket.connect(configuration.endpoint)
        let ready = WireMessage.ready(service: handlers.service, operations: handlers.descriptors, credit: UInt32(configuration.credit))
        try socket.send(ready.encoded, dontWait: false)
        logger.info("service.registering", metadata: ["service.endpoint": "\(configuration.endpoint)", "service.credit": "\(configuration.credit)"])
        return Session(socket: socket, number: number, now: .now)
    }

    private func loop() throws {
        let expiry = configuration.heartbeatInterval * configuration.liveness
        var session = try connect(number: 0)
        defer { session.socket.close() }
        var running: [UInt64: (operation: String, task: Task<Void, Never>)] = [:]
        var nextHeartbeat = ContinuousClock.now + configuration.heartbeatInterval
        var drainDeadline: ContinuousClock.Instant?
        // The broker's frame limit, from its heartbeats; no reply may be larger.
        var maximumReplyBytes = RequestContext.defaultMaximumReplyBytes
        // Refusals in a row (a READY the broker answered with DISCONNECT), for the backoff.
        var refusals = 0
        var warnings = LogRateLimiter()
        func warn(_ reason: String) {
            if warnings.decide(reason, now: .now) == .write {
                logger.warning("service.dropped", metadata: ["service.reason": "\(reason)"])
            }
        }

        // Rebuilt only when a reconnect replaces the socket, not on every pass.
        var poller = Poller()
        var polled = session.socket
        let socketItem = poller.add(session.socket)
        let mailboxItem = poller.add(fileDescriptor: mailbox.fileDescriptor)

        while true {
            if polled !== session.socket {
                poller.removeAll()
                poller.add(session.socket)
                poller.add(fileDescriptor: mailbox.fileDescriptor)
                polled = session.socket
            }
            try poller.poll(timeout: max(.zero, nextHeartbeat - .now))

            if poller.isReadable(mailboxItem) {
                for control in mailbox.drain() {
                    switch control {
                    case .finished(let id, let number, let result):
                        guard number == session.number, let operation = running.removeValue(forKey: id)?.operation else { continue }
                        metrics.inFlight.record(running.count)
                        let reply: WireMessage
                        switch result {
                        case .success(let payload) where payload.largestFrame > maximumReplyBytes:
                            // The broker would refuse it: say why instead.
                            let size = payload.largestFrame
                            logger.error("service.reply.tooLarge", metadata: ["service.operation": "\(operation)", "service.bytes": "\(size)"])
                            let error = CanopyError(.tooLarge, "a frame of the reply of \(handlers.service).\(operation) is \(size) bytes, over the broker's limit of \(maximumReplyBytes) bytes; ask for less (a smaller page, or the data in pieces)")
                            reply = .workerReply(requestID: id, failed: true, body: (try? codec.encode(error)) ?? [])
                        case .success(let payload):
                            reply = .workerReply(requestID: id, failed: false, body: payload.body, attachments: payload.attachments)
                        case .failure(let error):
                            reply = .workerReply(requestID: id, failed: true, body: (try? codec.encode(error)) ?? [])
                        }
                        if try !session.socket.send(reply.encoded) {
                            logger.warning("service.reply.dropped", metadata: ["service.reason": "send queue full"])
                        }
                    case .shutdown where drainDeadline == nil:
                        drainDeadline = .now + configuration.drainTimeout
                        try session.socket.send(WireMessage.drain.encoded)
                        logger.info("service.draining", metadata: ["service.running": "\(running.count)"])
                    case .shutdown:
                        break
                    }
                }
            }

            var reconnect = false
            if poller.isReadable(socketItem) {
                while let frames = try session.socket.receive() {
                    session.lastHeard = .now
                    let message: WireMessage
                    do {
                        message = try WireMessage(frames: frames)
                    } catch {
                        warn("malformed message from the broker: \(error.reason.rawValue)")
                        continue
                    }
                    switch message {
                    case .dispatch(let id, let operation, let header, let body, let attachments):
                        refusals = 0
                        running[id] = (operation, start(id: id, operation: operation, header: header, payload: Payload(body: body, attachments: attachments),
                                                        maximumReplyBytes: maximumReplyBytes, session: session.number))
                        metrics.inFlight.record(running.count)
                    case .cancelDispatch(let id):
                        running[id]?.task.cancel()
                    case .brokerHeartbeat(let limit):
                        // The registration was taken, and no frame may be larger than the limit.
                        refusals = 0
                        registered.store(true, ordering: .relaxed)
                        if limit >= 1024 { maximumReplyBytes = Int(clamping: limit) }
                    case .brokerDisconnect(let reason):
                        if warnings.decide("disconnected", now: .now) == .write {
                            logger.notice("service.disconnected", metadata: ["service.reason": "\(reason)"])
                        }
                        refusals += 1
                        reconnect = true
                    default:
                        warn("command not sent to workers")
                    }
                    if reconnect { break }
                }
            }

            let now = ContinuousClock.now
            if let deadline = drainDeadline, running.isEmpty || now >= deadline || reconnect {
                _ = try? session.socket.send(WireMessage.workerDisconnect.encoded)
                registered.store(false, ordering: .relaxed)
                metrics.inFlight.record(0)
                logger.info("service.stopped", metadata: ["service.abandoned": "\(running.count)"])
                running.values.forEach { $0.task.cancel() }
                return
            }
            if reconnect || now - session.lastHeard > expiry {
                if !reconnect { logger.notice("service.broker.silent", metadata: ["service.reconnecting": "true"]) }
                // What the old broker held is its to answer (or to send to another worker).
                running.values.forEach { $0.task.cancel() }
                running.removeAll()
                metrics.inFlight.record(0)
                registered.store(false, ordering: .relaxed)
                session.socket.close()
                if refusals > 1 {
                    // Refused again and again (a key not on the allow-list, a reserved name): back off, up to 5 s.
                    Thread.sleep(forTimeInterval: min(5, 0.1 * Double(1 << min(refusals - 2, 6))))
                }
                session = try connect(number: session.number + 1)
                nextHeartbeat = .now + configuration.heartbeatInterval
                continue
            }
            if now >= nextHeartbeat {
                try session.socket.send(WireMessage.workerHeartbeat.encoded)
                nextHeartbeat = now + configuration.heartbeatInterval
                for (reason, count) in warnings.endWindows(now: now) {
                    logger.warning("service.dropped.suppressed", metadata: ["service.reason": "\(reason)", "service.suppressed": "\(count)"])
                }
            }
        }
    }

    private func start(id: UInt64, operation: String, header: RequestHeader, payload: Payload, maximumReplyBytes: Int, session: Int) -> Task<Void, Never> {
        var requestLogger = logger
        requestLogger[metadataKey: "service.operation"] = "\(operation)"
        let context = RequestContext(
            principal: header.principal.isEmpty ? nil : header.principal,
            deadline: .now + .milliseconds(Int64(header.timeoutMilliseconds)),
            logger: requestLogger,
            maximumReplyBytes: maximumReplyBytes)
        return Task { [handlers, mailbox, metrics] in
            let started = ContinuousClock.now
            let result = await handlers.handle(operation, payload: payload, context: context)
            metrics.record(operation: operation, result: result, duration: .now - started)
            mailbox.post(.finished(id: id, session: session, result))
        }
    }
}

/// What every runner reports through swift-metrics, created once per runner; the handler
/// timers are made on first use per operation and outcome (both bounded: the registered
/// operations, `ok` and the error codes).
final class RunnerMetrics: Sendable {
    let service: String
    /// `canopy_service_in_flight{service}`: handlers running now.
    let inFlight: Gauge
    /// `canopy_service_credit{service}`: requests the worker takes at once.
    let credit: Gauge
    private let timers = Mutex<[String: Metrics.Timer]>([:])

    init(service: String) {
        self.service = service
        inFlight = Gauge(label: "canopy_service_in_flight", dimensions: [("service", service)])
        credit = Gauge(label: "canopy_service_credit", dimensions: [("service", service)])
    }

    /// Records one handler run in `canopy_service_handler_duration_seconds{service,operation,outcome}`.
    func record(operation: String, result: Result<Payload, CanopyError>, duration: Duration) {
        let outcome = switch result {
        case .success: "ok"
        case .failure(let error): error.code.rawValue
        }
        let key = operation + "|" + outcome
        let timer = timers.withLock { timers in
            if let timer = timers[key] { return timer }
            let timer = Metrics.Timer(label: "canopy_service_handler_duration_seconds",
                                      dimensions: [("service", service), ("operation", operation), ("outcome", outcome)])
            timers[key] = timer
            return timer
        }
        timer.recordNanoseconds(duration.components.seconds * 1_000_000_000 + duration.components.attoseconds / 1_000_000_000)
    }
}
