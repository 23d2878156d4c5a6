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
        /// The stack this worker belongs to (`--stack`, set by `canopy up`): announced to the
        /// broker, and the broker must announce the same, or the runner stops with
        /// ``ForeignBroker`` instead of serving another stack. `nil` serves any broker.
        public var stack: String?

        /// - Parameter endpoint: the broker's endpoint, for example `tcp://127.0.0.1:5555`.
        public init(endpoint: String) {
            self.endpoint = endpoint
        }

        /// How the service calls other services: through the same broker with the same key
        /// and stack, its requests marked as caused by others (``BusClient/Configuration/derived``).
        public var client: BusClient.Configuration {
            var client = BusClient.Configuration(endpoint: endpoint)
            client.curve = curve
            client.stack = stack
            client.derived = true
            return client
        }
    }

    /// The broker a runner reached belongs to another stack than the runner's (or to none):
    /// the runner stops rather than serve it.
    public struct ForeignBroker: Error, CustomStringConvertible {
        public var endpoint: String
        public var expected: String
        public var announced: String?

        public var description: String {
            "the broker at \(endpoint) belongs to \(announced.map { "stack \($0.prefix(64))" } ?? "no stack"), not this service's stack \(expected.prefix(64)): "
                + "another stack's broker holds that endpoint; stop it or give this stack its own (canopy up --broker)"
        }
    }

    private enum Control: Sendable {
        case finished(id: UInt64, connection: Int, Result<Payload, CanopyError>)
        case shutdown
    }

    private let handlers: OperationHandlers
    private let configuration: Configuration
    private let context: ZMQContext
    private let logger: Logger
    private let mailbox = Mailbox<Control>()
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

    /// Serves until graceful shutdown, ``stop()`` or cancellation. Cancellation (the group
    /// ending because another of its services failed, such as a listener whose port is taken)
    /// shuts down as SIGTERM does, so the process never outlives its group.
    public func run() async throws {
        try await LoopThread.serve(name: "canopy-\(handlers.service)", stop: { [mailbox] in mailbox.post(.shutdown) }) { [self] in try loop() }
    }

    /// Begins a graceful shutdown, as SIGTERM does.
    public func stop() {
        mailbox.post(.shutdown)
    }

    // MARK: - Loop (the loop thread only)

    /// Connects a new DEALER socket to the broker.
    private func connect() throws -> ZMQSocket {
        let socket = try ZMQSocket(context, type: .dealer)
        if let curve = configuration.curve { try socket.becomeCurveClient(curve) }
        if let stack = configuration.stack { try socket.announceStack(stack) }
        try socket.setHighWaterMarks(100_000)
        try socket.set(ZMQ_RECONNECT_IVL, 100)
        try socket.set(ZMQ_RECONNECT_IVL_MAX, 5_000) // libzmq's reconnect backoff
        try socket.setHeartbeats(interval: configuration.heartbeatInterval, timeout: configuration.heartbeatInterval * configuration.liveness)
        try socket.connect(configuration.endpoint)
        return socket
    }

    /// The IO shell around ``WorkerSession``: one socket, the handlers' tasks, the mailbox.
    private func loop() throws {
        var session = WorkerSession(settings: .init(
            service: handlers.service, operations: handlers.descriptors, credit: configuration.credit,
            heartbeatInterval: configuration.heartbeatInterval, liveness: configuration.liveness, drainTimeout: configuration.drainTimeout),
            now: .now)
        var socket = try connect()
        defer { socket.close() }
        var tasks: [UInt64: Task<Void, Never>] = [:]
        // With a stack, every message says which stack the broker belongs to.
        let reading: PeerProperties.Names = configuration.stack == nil ? [] : .stack
        var broker = PeerProperties()
        var warnings = LogRateLimiter()
        var poller = Poller()
        func watch(_ socket: ZMQSocket) {
            poller.removeAll()
            poller.add(socket)
            poller.add(fileDescriptor: mailbox.fileDescriptor)
        }
        watch(socket)
        let (socketItem, mailboxItem) = (0, 1)

        /// Carries out the session's directives; false once it says stop.
        func carryOut(_ directives: [WorkerSession.Directive]) throws -> Bool {
            for directive in directives {
                switch directive {
                case .send(let message):
                    if try !socket.send(message.encoded) {
                        log(.dropped(reason: "send queue full"), &warnings)
                    }
                case .start(let id, let operation, let header, let payload):
                    tasks[id] = start(id: id, operation: operation, header: header, payload: payload,
                                      maximumReplyBytes: session.maximumReplyBytes, connection: session.connection)
                case .cancel(let id):
                    tasks.removeValue(forKey: id)?.cancel()
                case .reconnect(let backoff):
                    registered.store(false, ordering: .relaxed)
                    socket.close()
                    if backoff > .zero { Thread.sleep(forTimeInterval: Double(backoff.wholeMilliseconds) / 1_000) }
                    socket = try connect()
                    watch(socket)
                    _ = try carryOut(session.connected(now: .now))
                case .stop:
                    registered.store(false, ordering: .relaxed)
                    return false
                case .log(let event):
                    log(event, &warnings)
                }
            }
            registered.store(session.isRegistered, ordering: .relaxed)
            metrics.inFlight.record(session.running.count)
            return true
        }

        guard try carryOut(session.connected(now: .now)) else { return }
        while true {
            try poller.poll(timeout: max(.zero, session.nextWakeup - .now))
            if poller.isReadable(mailboxItem) {
                for control in mailbox.drain() {
                    switch control {
                    case .finished(let id, let connection, let result):
                        if connection == session.connection { tasks.removeValue(forKey: id) }
                        guard try carryOut(session.finished(id: id, connection: connection, result)) else { return }
                    case .shutdown:
                        guard try carryOut(session.shutdown(now: .now)) else { return }
                    }
                }
            }
            if poller.isReadable(socketItem) {
                // What follows a DISCONNECT on the old connection is not read.
                while !session.disconnected, let frames = try socket.receive(reading: reading, properties: &broker) {
                    if let stack = configuration.stack, broker.stack != stack {
                        throw ForeignBroker(endpoint: configuration.endpoint, expected: stack, announced: broker.stack)
                    }
                    guard try carryOut(session.receive(frames, now: .now)) else { return }
                }
            }
            let now = ContinuousClock.now
            guard try carryOut(session.tick(now: now)) else { return }
            for (reason, count) in warnings.endWindows(now: now) {
                logger.warning("service.dropped.suppressed", metadata: ["service.reason": "\(reason)", "service.suppressed": "\(count)"])
            }
        }
    }

    /// Writes one of the session's events (repeated warnings a few at a time).
    private func log(_ event: WorkerSession.Event, _ warnings: inout LogRateLimiter) {
        switch event {
        case .registering:
            logger.info("service.registering", metadata: ["service.endpoint": "\(configuration.endpoint)", "service.credit": "\(configuration.credit)"])
        case .draining(let running):
            logger.info("service.draining", metadata: ["service.running": "\(running)"])
        case .stopped(let abandoned):
            logger.info("service.stopped", metadata: ["service.abandoned": "\(abandoned)"])
        case .brokerSilent:
            logger.notice("service.broker.silent", metadata: ["service.reconnecting": "true"])
        case .disconnected(let reason):
            if warnings.decide("disconnected", now: .now) == .write {
                logger.notice("service.disconnected", metadata: ["service.reason": "\(reason.prefix(512))"])
            }
        case .replyTooLarge(let operation, let bytes):
            logger.error("service.reply.tooLarge", metadata: ["service.operation": "\(operation)", "service.bytes": "\(bytes)"])
        case .dropped(let reason):
            if warnings.decide(reason, now: .now) == .write {
                logger.warning("service.dropped", metadata: ["service.reason": "\(reason)"])
            }
        }
    }

    private func start(id: UInt64, operation: String, header: RequestHeader, payload: Payload, maximumReplyBytes: Int, connection: Int) -> Task<Void, Never> {
        let context = RequestContext(header: header, operation: operation, logger: logger, maximumReplyBytes: maximumReplyBytes)
        return Task { [handlers, mailbox, metrics] in
            let started = ContinuousClock.now
            let result = await handlers.handle(operation, payload: payload, context: context)
            metrics.record(operation: operation, result: result, duration: .now - started)
            mailbox.post(.finished(id: id, connection: connection, result))
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
        timer.recordNanoseconds(duration.nanoseconds)
    }
}
