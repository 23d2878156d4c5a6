import CZeroMQ
import CanopyIO
import CanopyMessages
import CanopyWire
import Foundation
import Logging
import Metrics
import ServiceLifecycle
import Synchronization
import Tracing

/// Hosts one ``BusService`` on the bus: connects to the broker (or to each of several live
/// brokers), announces the service's operations and credit (READY), heartbeats both ways,
/// runs handlers concurrently up to its credit, and re-registers by itself when a broker
/// restarts. With several brokers its credit is shared between them (``CreditShare``: CREDIT
/// messages move it), so it never holds more than its credit in all; a broker that goes
/// silent is dropped and connected again in the background while the others go on.
///
/// Graceful shutdown sends DRAIN (the brokers stop sending new requests), waits for the
/// handlers that are running to reply, then sends DISCONNECT. The DEALER sockets are owned by
/// the runner's loop thread; handlers run as Swift tasks and hand results back through a
/// ``Mailbox``.
public final class ServiceRunner: Service, @unchecked Sendable {
    /// How a runner connects and behaves.
    public struct Configuration: Sendable {
        /// The brokers' endpoints: one, or several live brokers, each served.
        public var endpoints: [String]
        /// The first broker's endpoint; setting it names that broker alone (a list in one
        /// string, `A,B`, names each).
        public var endpoint: String {
            get { endpoints[0] }
            set { endpoints = BusClient.Configuration(endpoint: newValue).endpoints }
        }
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
        /// The tracer of the handlers' spans (and of the service's own calls); `nil` takes
        /// the process's (`InstrumentationSystem`).
        public var tracer: (any Tracer)?
        /// How long the service refuses a person it erased (``ErasedPeople``).
        public var erasureWindow: Duration = ErasedPeople.defaultWindow

        /// - Parameter endpoint: the broker's endpoint, for example `tcp://127.0.0.1:5555`, or
        ///   several separated by commas.
        public init(endpoint: String) {
            endpoints = BusClient.Configuration(endpoint: endpoint).endpoints
        }

        /// - Parameter endpoints: the brokers' endpoints (at least one).
        public init(endpoints: [String]) {
            self.endpoints = BusClient.Configuration(endpoints: endpoints).endpoints
        }

        /// How the service calls other services: through the same brokers with the same key
        /// and stack, its requests marked as caused by others (``BusClient/Configuration/derived``).
        public var client: BusClient.Configuration {
            var client = BusClient.Configuration(endpoints: endpoints)
            client.curve = curve
            client.stack = stack
            client.derived = true
            client.tracer = tracer
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
        case finished(id: UInt64, broker: Int, connection: Int, Result<Payload, CanopyError>)
        case shutdown
    }

    private let handlers: OperationHandlers
    private let configuration: Configuration
    private let context: ZMQContext
    private let logger: Logger
    private let mailbox = Mailbox<Control>()
    private let registered = Atomic<Bool>(false)
    private let metrics: RunnerMetrics

    /// Whether a broker took this worker's READY and its heartbeats are flowing (for
    /// `/health`): set by a broker's first heartbeat, cleared when no connection is
    /// registered any more or the runner stops.
    public var isRegistered: Bool { registered.load(ordering: .relaxed) }

    /// - Parameters:
    ///   - service: the service to host.
    ///   - configuration: endpoint, credit and timings.
    ///   - context: the ZeroMQ context.
    ///   - logger: where the runner and handlers log.
    public init(service: some BusService, configuration: Configuration, context: ZMQContext, logger: Logger) {
        var handlers = OperationHandlers(service: service.name, erased: ErasedPeople(window: configuration.erasureWindow))
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

    /// Connects a new DEALER socket to broker `broker`.
    private func connect(_ broker: Int) throws -> ZMQSocket {
        let socket = try ZMQSocket(context, type: .dealer)
        try socket.pin(toIOThread: broker) // a broker whose name hangs in the resolver stalls only its own connection
        if let curve = configuration.curve { try socket.becomeCurveClient(curve, broker: broker) }
        if let stack = configuration.stack { try socket.announceStack(stack) }
        try socket.setHighWaterMarks(100_000)
        try socket.set(ZMQ_RECONNECT_IVL, 100)
        try socket.set(ZMQ_RECONNECT_IVL_MAX, 5_000) // libzmq's reconnect backoff
        try socket.setHeartbeats(interval: configuration.heartbeatInterval, timeout: configuration.heartbeatInterval * configuration.liveness)
        try socket.connect(configuration.endpoints[broker])
        return socket
    }

    /// One broker as the loop holds it: the session, its socket (nil while waiting to connect
    /// again), what its messages said of the broker, and when to connect again.
    private struct Link {
        var session: WorkerSession
        var socket: ZMQSocket?
        var peer = PeerProperties()
        var reconnectAt: ContinuousClock.Instant?
        var stopped = false
    }

    /// The IO shell around a ``WorkerSession`` per broker and the ``CreditShare`` between
    /// them: the sockets, the handlers' tasks, the mailbox.
    private func loop() throws {
        var loop = Loop(runner: self)
        try loop.run()
    }

    /// The loop's state, and one method per event: the mailbox (a handler finished, shutdown),
    /// a broker's socket readable, the clock. Each carries out what its broker's session
    /// answers; once every session has stopped, ``running`` is false and the loop ends.
    private struct Loop {
        let runner: ServiceRunner
        var links: [Link]
        var share: CreditShare
        /// Handlers running, by broker and request id (each broker picks its own ids).
        var tasks: [Int: [UInt64: Task<Void, Never>]] = [:]
        /// With a stack, every message says which stack the broker belongs to.
        let reading: PeerProperties.Names
        var warnings = LogRateLimiter()
        var poller = Poller()
        /// Which broker each polled socket is (the mailbox is item 0).
        var polled: [Int] = []
        /// False once every session has stopped.
        var running = true
        /// Replies without attachments waiting to go to each broker as one `REPLY BATCH`: those
        /// that finished while the mailbox was read go together.
        var replies: [[WireMessage.BatchedReply]]

        init(runner: ServiceRunner) {
            let configuration = runner.configuration
            let settings = WorkerSession.Settings(
                service: runner.handlers.service, operations: runner.handlers.descriptors, credit: configuration.credit,
                heartbeatInterval: configuration.heartbeatInterval, liveness: configuration.liveness, drainTimeout: configuration.drainTimeout)
            self.runner = runner
            links = configuration.endpoints.indices.map { _ in Link(session: WorkerSession(settings: settings, now: .now)) }
            share = CreditShare(total: configuration.credit, brokers: configuration.endpoints.count)
            replies = Array(repeating: [], count: configuration.endpoints.count)
            reading = configuration.stack == nil ? [] : .stack
        }

        mutating func run() throws {
            defer { for link in links { link.socket?.close() } }
            for broker in links.indices where running { try register(broker) }
            while running {
                try poller.poll(timeout: max(.zero, nextWakeup() - .now))
                if poller.isReadable(0) { try readMailbox() }
                for (item, broker) in polled.enumerated() where running && poller.isReadable(item + 1) { try readBroker(broker) }
                if running { try tick(now: .now) }
            }
        }

        /// The sessions that run, and the brokers waiting to connect again (not their
        /// sessions: those went silent, and their wakeups lie in the past).
        func nextWakeup() -> ContinuousClock.Instant {
            var wakeup = ContinuousClock.now + .seconds(1)
            for link in links where !link.stopped { wakeup = min(wakeup, link.reconnectAt ?? link.session.nextWakeup) }
            return wakeup
        }

        // MARK: Events

        mutating func readMailbox() throws {
            for control in runner.mailbox.drain() where running {
                switch control {
                case .finished(let id, let broker, let connection, let result): try finished(id, broker: broker, connection: connection, result)
                case .shutdown: try shutdown()
                }
            }
            for broker in links.indices { try sendReplies(broker) }
        }

        /// Sends the replies waiting for broker `broker`: one as a plain `REPLY`, more as one
        /// `REPLY BATCH`.
        mutating func sendReplies(_ broker: Int) throws {
            guard !replies[broker].isEmpty else { return }
            let waiting = replies[broker]
            replies[broker].removeAll(keepingCapacity: true)
            let message: WireMessage
            if waiting.count == 1, let reply = waiting.first {
                message = .workerReply(requestID: reply.requestID, failed: reply.failed, body: reply.body)
            } else {
                message = .workerReplyBatch(waiting)
            }
            if let socket = links[broker].socket, try !socket.send(message.encoded) {
                runner.log(.dropped(reason: "send queue full"), broker: broker, &warnings)
            }
        }

        /// A handler's answer, for the broker whose connection started it.
        mutating func finished(_ id: UInt64, broker: Int, connection: Int, _ result: Result<Payload, CanopyError>) throws {
            if connection == links[broker].session.connection { tasks[broker]?.removeValue(forKey: id) }
            grant(share.finished(broker))
            try carryOut(links[broker].session.finished(id: id, connection: connection, result), broker: broker)
        }

        mutating func shutdown() throws {
            for broker in links.indices where running && !links[broker].stopped {
                // A broker waiting to be connected again holds nothing: done with it.
                if links[broker].socket == nil {
                    links[broker].stopped = true
                    links[broker].reconnectAt = nil
                    continue
                }
                try carryOut(links[broker].session.shutdown(now: .now), broker: broker)
            }
            if links.allSatisfy(\.stopped) {
                runner.registered.store(false, ordering: .relaxed)
                running = false
            }
        }

        /// Every message broker `broker` sent, until its socket has none (what follows a
        /// DISCONNECT on the old connection is not read).
        mutating func readBroker(_ broker: Int) throws {
            while running, let socket = links[broker].socket, !links[broker].session.disconnected,
                let frames = try socket.receive(reading: reading, properties: &links[broker].peer)
            {
                if let stack = runner.configuration.stack, links[broker].peer.stack != stack {
                    throw ForeignBroker(endpoint: runner.configuration.endpoints[broker], expected: stack, announced: links[broker].peer.stack)
                }
                try carryOut(links[broker].session.receive(frames, now: .now), broker: broker)
            }
        }

        /// Heartbeats, deadlines and reconnects that are due.
        mutating func tick(now: ContinuousClock.Instant) throws {
            for broker in links.indices where running && !links[broker].stopped {
                if let at = links[broker].reconnectAt {
                    if at <= now { try register(broker) }
                    continue
                }
                try carryOut(links[broker].session.tick(now: now), broker: broker)
            }
            for (reason, count) in warnings.endWindows(now: now) {
                runner.logger.warning("service.dropped.suppressed", metadata: ["service.reason": "\(reason)", "service.suppressed": "\(count)"])
            }
        }

        // MARK: Carrying out

        /// Connects to broker `broker` and sends its READY with its share of the credit.
        mutating func register(_ broker: Int) throws {
            links[broker].socket = try runner.connect(broker)
            links[broker].reconnectAt = nil
            watch()
            let changes = share.brokerUp(broker)
            let own = changes.first { $0.broker == broker }?.credit ?? 1
            grant(changes, except: broker)
            try carryOut(links[broker].session.connected(now: .now, credit: own), broker: broker)
        }

        /// Polls the mailbox and every connected broker's socket.
        mutating func watch() {
            poller.removeAll()
            poller.add(fileDescriptor: runner.mailbox.fileDescriptor)
            polled = links.indices.filter { links[$0].socket != nil }
            for broker in polled { poller.add(links[broker].socket!) }
        }

        /// Tells brokers their new grants (a READY's credit goes with the READY itself).
        mutating func grant(_ changes: [CreditShare.Grant], except ready: Int? = nil) {
            for change in changes where change.broker != ready {
                guard let socket = links[change.broker].socket else { continue }
                if (try? socket.send(WireMessage.credit(UInt32(change.credit)).encoded)) != true {
                    runner.log(.dropped(reason: "send queue full"), broker: change.broker, &warnings)
                }
            }
        }

        /// Carries out broker `broker`'s session's directives; ``running`` is false once every
        /// session has stopped.
        mutating func carryOut(_ directives: [WorkerSession.Directive], broker: Int) throws {
            for directive in directives {
                switch directive {
                case .send(.workerReply(let id, let failed, let body, let attachments)) where attachments.isEmpty:
                    replies[broker].append(WireMessage.BatchedReply(requestID: id, failed: failed, body: body))
                    if replies[broker].count == Wire.maximumBatch { try sendReplies(broker) }
                case .send(let message):
                    try sendReplies(broker) // the replies before it go first
                    if let socket = links[broker].socket, try !socket.send(message.encoded) {
                        runner.log(.dropped(reason: "send queue full"), broker: broker, &warnings)
                    }
                case .start(let id, let operation, let header, let payload):
                    share.started(broker)
                    tasks[broker, default: [:]][id] = runner.start(
                        id: id, broker: broker, operation: operation, header: header, payload: payload,
                        maximumReplyBytes: links[broker].session.maximumReplyBytes, connection: links[broker].session.connection)
                case .cancel(let id):
                    tasks[broker]?.removeValue(forKey: id)?.cancel()
                case .reconnect(let backoff):
                    // The others go on meanwhile: this one connects again after its backoff.
                    try sendReplies(broker)
                    links[broker].socket?.close()
                    links[broker].socket = nil
                    links[broker].reconnectAt = .now + backoff
                    watch()
                    grant(share.brokerDown(broker))
                case .stop:
                    try sendReplies(broker)
                    links[broker].stopped = true
                    links[broker].socket?.close()
                    links[broker].socket = nil
                    watch()
                    _ = share.brokerDown(broker)
                case .log(let event):
                    runner.log(event, broker: broker, &warnings)
                }
            }
            runner.registered.store(links.contains { !$0.stopped && $0.session.isRegistered }, ordering: .relaxed)
            runner.metrics.inFlight.record(share.held.reduce(0, +))
            running = links.contains { !$0.stopped }
        }
    }

    /// Writes one of broker `broker`'s session's events (repeated warnings a few at a time).
    private func log(_ event: WorkerSession.Event, broker: Int, _ warnings: inout LogRateLimiter) {
        switch event {
        case .registering:
            logger.info(
                "service.registering", metadata: ["service.endpoint": "\(configuration.endpoints[broker])", "service.credit": "\(configuration.credit)"])
        case .draining(let running):
            logger.info("service.draining", metadata: ["service.running": "\(running)"])
        case .stopped(let abandoned):
            logger.info("service.stopped", metadata: ["service.abandoned": "\(abandoned)"])
        case .brokerSilent:
            logger.notice("service.broker.silent", metadata: ["service.endpoint": "\(configuration.endpoints[broker])", "service.reconnecting": "true"])
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

    private func start(id: UInt64, broker: Int, operation: String, header: RequestHeader, payload: Payload, maximumReplyBytes: Int, connection: Int) -> Task<
        Void, Never
    > {
        let context = RequestContext(header: header, operation: operation, logger: logger, maximumReplyBytes: maximumReplyBytes)
        let tracer = header.trace == nil ? nil : configuration.tracer ?? InstrumentationSystem.tracer
        return Task { [handlers, mailbox, metrics] in
            let started = ContinuousClock.now
            /// Runs the handler; at debug level, one line per request (with the trace's ids
            /// when traced: the logging metadata provider reads the span in force).
            @Sendable func handle() async -> Result<Payload, CanopyError> {
                let result = await handlers.handle(operation, payload: payload, context: context)
                if context.logger.logLevel <= .debug {
                    let outcome =
                        switch result {
                        case .success: "ok"
                        case .failure(let error): error.code.rawValue
                        }
                    context.logger.debug(
                        "service.handled",
                        metadata: [
                            "service.outcome": "\(outcome)",
                            "service.microseconds": "\((ContinuousClock.now - started).microseconds)",
                        ])
                }
                return result
            }
            let result: Result<Payload, CanopyError>
            if let trace = header.trace, let tracer {
                // A sampled request: the handler is a span of its trace, under the call that
                // made the request, and everything it does (store, bus calls, log lines) under that.
                result = await tracer.withSpan(
                    BusTracing.spanName(service: handlers.service, operation: operation),
                    context: BusTracing.context(continuing: trace, tracer: tracer), ofKind: .server
                ) { span in
                    BusTracing.describe(span, service: handlers.service, operation: operation)
                    let result = await handle()
                    if case .failure(let error) = result { BusTracing.fail(span, error) }
                    return result
                }
            } else {
                result = await handle()
            }
            metrics.record(operation: operation, result: result, duration: .now - started)
            mailbox.post(.finished(id: id, broker: broker, connection: connection, result))
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
        let outcome =
            switch result {
            case .success: "ok"
            case .failure(let error): error.code.rawValue
            }
        let key = operation + "|" + outcome
        let timer = timers.withLock { timers in
            if let timer = timers[key] { return timer }
            let timer = Metrics.Timer(
                label: "canopy_service_handler_duration_seconds",
                dimensions: [("service", service), ("operation", operation), ("outcome", outcome)])
            timers[key] = timer
            return timer
        }
        timer.recordNanoseconds(duration.nanoseconds)
    }
}
