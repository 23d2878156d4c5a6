import CZeroMQ
import CanopyCapture
import CanopyIO
import CanopyMessages
import CanopyWire
import Dispatch
import Foundation
import Glibc
import Logging
import ServiceLifecycle
import Synchronization
import Tracing

/// The broker's IO shell: one ROUTER socket, one loop thread, and a ``BrokerState`` that
/// decides everything. Run it in a `ServiceGroup`; graceful shutdown stops taking new
/// requests, waits for held ones up to ``BrokerConfiguration/drainTimeout``, then tells
/// workers to go away.
///
/// The socket is bound in `init` (so the endpoint, with the port the system chose for
/// `tcp://127.0.0.1:*`, is known at once) and from ``run()`` on is owned by the loop thread.
public final class BrokerServer: Service, @unchecked Sendable {
    private enum Control: Sendable {
        case shutdown
        /// A new allow-list, read by ``reloadAllowList()``.
        case allowList(CurveAllowList)
        /// A stopped capture finished writing (on a thread of its own): answer who stopped it.
        case captureStopped(CaptureStatus, client: [UInt8], correlation: [UInt8])
    }

    /// The endpoint the broker listens on, with the real port.
    public let endpoint: String
    private let configuration: BrokerConfiguration
    private let context: ZMQContext
    private let socket: ZMQSocket
    private let mailbox = Mailbox<Control>()
    private let logger: Logger
    /// The ZAP handler, when the broker runs CurveZMQ.
    private let zap: ZAPHandler?
    /// The CurveZMQ settings it started with (the allow-list's file, for reloads).
    private let curve: CurveServerSettings?
    /// When the loop last went round, in nanoseconds of the monotonic clock (0: not yet).
    private let lastPass = Atomic<UInt64>(0)
    /// Set once the loop has stopped.
    private let stopped = Atomic<Bool>(false)

    /// Whether the loop is turning: it has started, not stopped, and went round within two
    /// heartbeat intervals (it wakes at least once an interval). For `/health`.
    public var isServing: Bool {
        let pass = lastPass.load(ordering: .relaxed)
        guard pass > 0, !stopped.load(ordering: .relaxed) else { return false }
        let now = DispatchTime.now().uptimeNanoseconds
        return now < pass || now - pass < UInt64(configuration.heartbeatInterval.wholeMilliseconds * 2 + 1_000) * 1_000_000
    }

    /// Binds the broker's ROUTER socket.
    ///
    /// - Parameters:
    ///   - endpoint: where to listen, for example `tcp://127.0.0.1:5555` or `tcp://127.0.0.1:*`.
    ///   - configuration: the broker's tunables.
    ///   - curve: CurveZMQ settings; `nil` runs without authentication (the loopback
    ///     default). With them, only allowed keys connect, and only allowed worker keys
    ///     register (the allow-list's workers replace `configuration.workerKeys`).
    ///   - context: the ZeroMQ context (one CURVE broker per context: it holds the ZAP handler).
    ///   - logger: where the broker logs.
    public init(
        endpoint: String, configuration: BrokerConfiguration = .init(), curve: CurveServerSettings? = nil,
        context: ZMQContext, logger: Logger
    ) throws {
        var configuration = configuration
        self.curve = curve
        if let curve {
            configuration.workerKeys = curve.allowList.workers
            configuration.clientKeys = curve.anyClient ? nil : curve.allowList.clients
            let (allowList, anyClient) = (curve.allowList, curve.anyClient)
            zap = try ZAPHandler(context: context) { key in anyClient || allowList.mayConnect(key) }
        } else {
            zap = nil
        }
        self.configuration = configuration
        replies = ReplyBacklog(perClient: configuration.maximumUnreadBytesPerClient, total: configuration.maximumUnreadBytes)
        self.context = context
        self.logger = logger
        socket = try ZMQSocket(context, type: .router)
        if let curve { try socket.becomeCurveServer(curve.keyPair) }
        if let stack = configuration.stack { try socket.announceStack(stack) }
        try socket.setHighWaterMarks(100_000)
        // Frames up to twice the limit still arrive and get a polite `tooLarge`; anything
        // larger makes libzmq drop the connection before it fills memory.
        try socket.setMaximumMessageSize(configuration.maximumFrameBytes * 2 + 4096)
        try socket.setHeartbeats(interval: configuration.heartbeatInterval, timeout: configuration.workerExpiry)
        try socket.bind(endpoint)
        self.endpoint = socket.lastEndpoint
    }

    /// Serves until graceful shutdown, ``stop()`` or cancellation. Cancellation (the group
    /// ending because another of its services failed, such as a listener whose port is taken)
    /// shuts down as SIGTERM does, so the process never outlives its group.
    public func run() async throws {
        // The broker's spans of sampled requests: noted by the loop, made every 100 ms here.
        let tracer = configuration.tracer ?? (InstrumentationSystem.tracer is NoOpTracer ? nil : InstrumentationSystem.tracer)
        let tracing = tracer.map(BrokerTracing.init)
        let flushing = Task {
            guard let tracing else { return }
            while !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(100))
                tracing.flush()
            }
        }
        defer {
            flushing.cancel()
            tracing?.flush(ending: true)
        }
        try await LoopThread.serve(name: "canopy-broker", stop: { [mailbox] in mailbox.post(.shutdown) }) { [self] in try loop(tracing: tracing) }
    }

    /// Begins a graceful shutdown, as SIGTERM does.
    public func stop() {
        mailbox.post(.shutdown)
    }

    /// Reads the allow-list file again (SIGHUP, `canopy keys reload`) and hands it to the
    /// loop: handshakes from then on go by it, workers whose key no longer serves their service
    /// are told DISCONNECT and removed, and requests from keys no longer on it are refused
    /// `unauthorized`, so a key taken off the list stops working without a restart.
    ///
    /// - Returns: the new list's worker and client key counts.
    /// - Throws: ``Curve/KeyError`` when the broker runs without CURVE, or the file cannot be
    ///   read or parsed (the old list stays).
    @discardableResult
    public func reloadAllowList() throws -> (workers: Int, clients: Int) {
        guard let curve else { throw Curve.KeyError("this broker runs without CurveZMQ: there is no allow-list to reload") }
        guard let file = curve.allowListFile else { throw Curve.KeyError("this broker's allow-list was not read from a file; restart it to change it") }
        let list = try CurveServerSettings.readAllowList(file)
        mailbox.post(.allowList(list))
        return (list.workers.services.count, list.clients.count)
    }

    // MARK: - Loop (the loop thread only)

    /// What the loop holds between passes (loop thread only): the routing state, the directives
    /// of the pass, the poller and the drain. A local of ``loop(tracing:)``, handed to each
    /// event's method `inout`, so the hot path pays no exclusivity checks on class properties.
    private struct Loop {
        var state: BrokerState
        var directives: [BrokerState.Directive] = []
        var poller = Poller()
        var socketItem = 0, mailboxItem = 0
        var zapItem: Int?
        let metrics: BrokerMetrics
        var nextMetrics = ContinuousClock.now
        /// Set by SIGTERM: when the broker stops waiting for its requests' answers.
        var drainDeadline: ContinuousClock.Instant?
        /// When a request was last refused while shutting down (the quiet spell before closing).
        var lastReceived = ContinuousClock.now
        var rejectedBefore: UInt64 = 0
        var memory = MemoryGiveBack()
        // Reused for every message received.
        var identity: [UInt8] = []
        var peer = PeerProperties()
        let frames = ReceivedFrames()
        var reading: PeerProperties.Names = []
    }

    /// The loop: waits for the socket, the mailbox, ZAP or the next timer, and hands each to
    /// its method; ends once drained after SIGTERM.
    private func loop(tracing: BrokerTracing?) throws {
        defer {
            stopped.store(true, ordering: .relaxed)
            socket.close()
            zap?.close()
        }
        var loop = Loop(state: BrokerState(configuration: configuration, now: .now), metrics: BrokerMetrics(broker: configuration.name))
        if let tracing { loop.state.traceRequests(into: tracing) }
        loop.directives.reserveCapacity(64)
        loop.socketItem = loop.poller.add(socket)
        loop.mailboxItem = loop.poller.add(fileDescriptor: mailbox.fileDescriptor)
        loop.zapItem = zap.map { loop.poller.add($0.socket) }
        if zap != nil { loop.reading.insert(.userID) }
        if configuration.stack != nil { loop.reading.insert(.stack) }
        if let settings = configuration.capture, !settings.path.isEmpty {
            // A capture asked for at start that cannot begin stops the broker: the operator asked for it.
            capture = try CaptureWriter(settings: settings)
            loop.state.capturing = true
            loop.state.captureStatus = capture?.status
            logger.info("broker.capture.started", metadata: ["broker.capture": "\(settings.path)"])
        }
        defer {
            if let capture {
                let status = capture.stop()
                logger.info(
                    "broker.capture.stopped",
                    metadata: [
                        "broker.capture": "\(status.path ?? "")", "broker.records": "\(status.records)",
                        "broker.dropped": "\(status.dropped)",
                    ])
            }
        }
        lastPass.store(DispatchTime.now().uptimeNanoseconds, ordering: .relaxed) // turning from here on
        logger.info("broker.started", metadata: ["broker.endpoint": "\(endpoint)", "broker.curve": "\(zap != nil)"])

        while true {
            var timeout = max(.zero, loop.state.nextWakeup() - .now)
            if loop.drainDeadline != nil { timeout = min(timeout, .milliseconds(20)) }
            try loop.poller.poll(timeout: timeout)
            if loop.poller.isReadable(loop.mailboxItem) {
                for control in mailbox.drain() { try handle(control, &loop) }
            }
            if let zapItem = loop.zapItem, loop.poller.isReadable(zapItem) {
                try zap?.answerRequests()
            }
            let received = loop.poller.isReadable(loop.socketItem) ? try readMessages(&loop) : 0
            loop.state.tick(now: .now, into: &loop.directives)
            try carryOut(&loop.directives, state: &loop.state)
            try endPass(received: received, &loop)
            if try closeIfDrained(&loop) { return }
        }
    }

    /// A message from another thread: SIGTERM, a new allow-list, a capture that finished.
    private func handle(_ control: Control, _ loop: inout Loop) throws {
        switch control {
        case .shutdown:
            guard loop.drainDeadline == nil else { return }
            loop.state.beginShutdown()
            loop.rejectedBefore = loop.state.rejected
            loop.lastReceived = .now - Self.quietBeforeClosing // nothing refused yet: no spell to wait
            loop.drainDeadline = .now + configuration.drainTimeout
            logger.info("broker.draining", metadata: ["broker.pending": "\(loop.state.pendingCount)"])
        case .allowList(let list):
            let anyClient = curve?.anyClient ?? false
            zap?.mayConnect = { key in anyClient || list.mayConnect(key) }
            loop.state.replaceKeys(workers: list.workers, clients: anyClient ? nil : list.clients, into: &loop.directives)
            try carryOut(&loop.directives, state: &loop.state)
            logger.notice(
                "broker.curve.reloaded",
                metadata: [
                    "broker.worker_keys": "\(list.workers.services.count)",
                    "broker.client_keys": "\(list.clients.count)",
                ])
        case .captureStopped(let status, let client, let correlation):
            lastCapture = status
            loop.state.captureStatus = status
            logger.info(
                "broker.capture.stopped",
                metadata: [
                    "broker.capture": "\(status.path ?? "")", "broker.records": "\(status.records)",
                    "broker.dropped": "\(status.dropped)",
                ])
            try send(.reply(correlation: correlation, shared: false, body: (try? codec.encode(status)) ?? []), to: client)
        }
    }

    /// Reads up to 4,096 messages from the socket (then timers run) and carries out what
    /// they ask; returns how many it read.
    ///
    /// What a batch of messages asks to send goes out together at its end: libzmq wakes its I/O
    /// thread once for a burst instead of once a message. With CURVE, each message carries the
    /// public key its connection authenticated with (`key`). Frames are read in place; only
    /// what a request keeps is copied.
    private func readMessages(_ loop: inout Loop) throws -> Int {
        var received = 0
        while received < 4096, try socket.receiveRouted(into: loop.frames, identity: &loop.identity, reading: loop.reading, properties: &loop.peer) {
            received += 1
            guard loop.frames.count > 0 else { continue } // ROUTER always adds the identity
            if loop.frames.dropped > 0 {
                loop.state.dropOverlong(from: loop.identity, into: &loop.directives)
                continue
            }
            loop.state.receive(loop.frames, from: loop.identity, key: loop.peer.userID, stack: loop.peer.stack, now: .now, into: &loop.directives)
            if loop.directives.count >= 1024 { try carryOut(&loop.directives, state: &loop.state) }
        }
        loop.frames.release()
        try carryOut(&loop.directives, state: &loop.state)
        return received
    }

    /// What every pass ends with: suppressed warnings, memory given back, the health
    /// stamp, and the metrics (at most once a second).
    private func endPass(received: Int, _ loop: inout Loop) throws {
        let now = ContinuousClock.now
        for (reason, count) in warnings.endWindows(now: now) {
            logger.warning("broker.dropped.suppressed", metadata: ["broker.reason": "\(reason)", "broker.suppressed": "\(count)"])
        }
        loop.memory.check(heldBytes: loop.state.heldBytes + replies.bytes, received: received, now: now)
        loop.state.unreadReplies = (replies.bytes, replies.dropped)
        lastPass.store(DispatchTime.now().uptimeNanoseconds, ordering: .relaxed)
        guard configuration.metrics else { return }
        let metrics = loop.metrics
        loop.state.drainLatencies { service, nanoseconds in metrics.recordLatency(service: service, nanoseconds: nanoseconds) }
        if now >= loop.nextMetrics {
            loop.state.captureStatus = captureStatus
            metrics.refresh(loop.state.statistics(now: now))
            loop.nextMetrics = now + .seconds(1)
        }
    }

    /// After SIGTERM: whether the broker is done, having told everyone DISCONNECT.
    ///
    /// Once drained, it goes when no request has been refused for a quiet spell (each new one
    /// is answered shuttingDown, which moves a client of several brokers to another), so a
    /// client that has not heard yet is told rather than left with a request that dies with
    /// the socket; at most until a second past the drain timeout. Not drained by the drain
    /// timeout, it goes then. (Requests refused while shutting down count; workers'
    /// heartbeats do not.)
    private func closeIfDrained(_ loop: inout Loop) throws -> Bool {
        guard let deadline = loop.drainDeadline else { return false }
        let now = ContinuousClock.now
        if loop.state.rejected != loop.rejectedBefore {
            loop.rejectedBefore = loop.state.rejected
            loop.lastReceived = now
        }
        let done =
            loop.state.pendingCount == 0
            ? now - loop.lastReceived >= Self.quietBeforeClosing || now >= deadline + .seconds(1)
            : now >= deadline
        guard done else { return false }
        loop.state.disconnectAll(into: &loop.directives)
        try carryOut(&loop.directives, state: &loop.state)
        logger.info("broker.stopped", metadata: ["broker.unanswered": "\(loop.state.pendingCount)"])
        return true
    }

    /// How long a drained broker waits with no request coming before it closes.
    static let quietBeforeClosing: Duration = .seconds(1)

    /// Repeated warnings are written a few at a time; the rest are counted (loop thread only).
    @exclusivity(unchecked) private var warnings = LogRateLimiter()
    /// Replies waiting in libzmq for clients that read slowly (loop thread only).
    private let replies: ReplyBacklog

    /// The running capture (loop thread only).
    @exclusivity(unchecked) private var capture: CaptureWriter?
    /// Captured messages of the pass being carried out (loop thread only).
    @exclusivity(unchecked) private var captured: [CaptureEvent] = []
    /// The last capture's final counts, once it stopped (loop thread only).
    @exclusivity(unchecked) private var lastCapture: CaptureStatus?
    private let codec = MessageCodec()

    private var captureStatus: CaptureStatus? { capture?.status ?? lastCapture }
    /// When the running capture's hold made its cut (loop thread only).
    @exclusivity(unchecked) private var cutAt: Int64?
    /// Directives a capture control made while the pass's were being carried out (loop thread only).
    @exclusivity(unchecked) private var pendingControls: [BrokerState.Directive] = []

    private func carryOut(_ directives: inout [BrokerState.Directive], state: inout BrokerState) throws {
        var wallClock: Int64 = 0 // read once for the batch's captured messages
        defer {
            capture?.submit(captured) // one hand-over a pass
            captured.removeAll(keepingCapacity: true)
        }
        // Each directive is moved out of the list (a placeholder that holds nothing takes its
        // place), so its frames are not retained again for the loop and released twice after.
        let placeholder = BrokerState.Directive.log("", peer: [])
        for index in directives.indices {
            let directive = directives.withUnsafeMutableBufferPointer { buffer in
                let slot = buffer.baseAddress! + index
                defer { slot.initialize(to: placeholder) }
                return slot.move()
            }
            switch consume directive {
            case .send(let peer, let message):
                switch message {
                case .dispatch(let id, let operation, let header, let body, let attachments) where attachments.isEmpty:
                    try batch(.init(requestID: id, operation: operation, header: header, body: body), to: peer)
                case .dispatch, .cancelDispatch, .brokerHeartbeat, .brokerDisconnect:
                    try sendBatch(to: peer) // a worker's messages keep their order
                    try send(message, to: peer)
                default:
                    try send(message, to: peer)
                }
            case .sendMajordomo(let peer, let message):
                let frames = message.encoded
                var ticket: SendTicket?
                if case .client = message { // a reply to a Majordomo client: bounded as ours are (no error to send instead)
                    ticket = admitReply(frames.reduce(peer.count) { $0 + $1.count }, to: peer)
                    if ticket == nil { continue }
                }
                var writer = try RoutedWriter(socket, to: peer, ticket: ticket)
                for (index, frame) in frames.enumerated() { try writer.write(frame, more: index < frames.count - 1) }
            case .log(let message, let peer):
                if warnings.decide(message, now: .now) == .write {
                    logger.warning("broker.dropped", metadata: ["broker.reason": "\(message)", "broker.peer": "\(peer.hex)"])
                }
            case .capture(var event):
                guard capture != nil else { continue }
                if wallClock == 0 { wallClock = CaptureWriter.wallClockNanoseconds() }
                event.record.time = wallClock
                captured.append(event)
            case .captureControl(let control, let client, let correlation):
                let answer: WireMessage
                do {
                    guard let status = try controlCapture(control, client: client, correlation: correlation, state: &state) else { continue } // answered later
                    answer = .reply(correlation: correlation, shared: false, body: (try? codec.encode(status)) ?? [])
                } catch {
                    answer = .error(correlation: correlation, error: (try? codec.encode(error)) ?? [])
                }
                try send(answer, to: client)
            }
        }
        directives.removeAll(keepingCapacity: true)
        for index in batches.indices where !batches[index].requests.isEmpty { try sendBatch(index) }
        if !pendingControls.isEmpty {
            swap(&directives, &pendingControls)
            try carryOut(&directives, state: &state)
        }
        replies.sweep()
    }

    /// Requests without attachments going to one worker in this pass, sent together as one
    /// REQUEST BATCH when the pass's directives are carried out (or when the batch is full,
    /// or another message goes to that worker first): one message to the worker instead of
    /// one a request. Entries are reused pass after pass (loop thread only).
    @exclusivity(unchecked) private var batches: [(worker: [UInt8], requests: [WireMessage.BatchedDispatch])] = []

    /// Adds `request` to the batch going to `worker`.
    private func batch(_ request: WireMessage.BatchedDispatch, to worker: [UInt8]) throws {
        let index: Int
        if let found = batches.firstIndex(where: { $0.worker == worker }) {
            index = found
        } else if let free = batches.firstIndex(where: { $0.requests.isEmpty }) {
            index = free
            batches[index].worker = worker
        } else {
            index = batches.count
            batches.append((worker, []))
        }
        batches[index].requests.append(request)
        if batches[index].requests.count == Wire.maximumBatch { try sendBatch(index) }
    }

    /// Sends the batch waiting for `worker`, if there is one.
    private func sendBatch(to worker: [UInt8]) throws {
        guard let index = batches.firstIndex(where: { !$0.requests.isEmpty && $0.worker == worker }) else { return }
        try sendBatch(index)
    }

    /// The batch being sent: its storage is swapped with the entry's, so both are reused and
    /// emptying one copies nothing (loop thread only).
    @exclusivity(unchecked) private var sending: [WireMessage.BatchedDispatch] = []

    /// Sends batch `index`: a lone request as a plain `DISPATCH`.
    private func sendBatch(_ index: Int) throws {
        swap(&sending, &batches[index].requests)
        defer { sending.removeAll(keepingCapacity: true) }
        if sending.count == 1, let request = sending.first {
            try send(
                .dispatch(requestID: request.requestID, operation: request.operation, header: request.header, body: request.body), to: batches[index].worker)
        } else {
            try send(.dispatchBatch(sending), to: batches[index].worker)
        }
    }

    /// Sends a message to a peer. Replies and errors for clients wait in libzmq until the
    /// client reads them, so they are bounded (``ReplyBacklog``): one past a bound is dropped
    /// and counted, and the client is told `busy` for it instead.
    private func send(_ message: WireMessage, to peer: [UInt8]) throws {
        var ticket: SendTicket?
        switch message {
        case .reply(let correlation, _, _, _):
            ticket = admitReply(message.byteCount + peer.count, to: peer)
            guard ticket != nil else {
                let error = CanopyError(
                    .busy,
                    "the reply was dropped: more than \(replies.perClient) bytes of replies waited unread for this connection, or \(replies.total) for all (a slow reader); read replies as they come"
                )
                return try send(.error(correlation: correlation, error: (try? codec.encode(error)) ?? []), to: peer)
            }
        case .error:
            ticket = admitReply(message.byteCount + peer.count, to: peer, slack: ReplyBacklog.errorSlack)
            guard ticket != nil else { return }
        default:
            break
        }
        var writer = try RoutedWriter(socket, to: peer, ticket: ticket)
        try message.write(into: &writer)
    }

    /// A ticket for a reply to `peer`, or `nil` (counted and logged) when it passes a bound.
    private func admitReply(_ bytes: Int, to peer: [UInt8], slack: Int = 0) -> SendTicket? {
        if let ticket = replies.admit(bytes, to: peer, slack: slack) { return ticket }
        replies.countDrop()
        if warnings.decide("slow reader: a reply was dropped", now: .now) == .write {
            logger.warning(
                "broker.dropped",
                metadata: [
                    "broker.reason": "slow reader: a reply was dropped", "broker.peer": "\(peer.hex)",
                    "broker.unread_bytes": "\(replies.bytes)",
                ])
        }
        return nil
    }

    /// Starts, stops or reports the capture, as `broker.capture.*` asked; nil when the answer
    /// comes later (a stop: the writer finishes on a thread of its own, so the loop never
    /// waits for the disk, and the answer goes out when it is done).
    private func controlCapture(
        _ control: BrokerState.CaptureControl, client: [UInt8], correlation: [UInt8],
        state: inout BrokerState
    ) throws(CanopyError) -> CaptureStatus? {
        switch control {
        case .status:
            var status = captureStatus ?? CaptureStatus(capturing: false)
            status.cutAt = capture == nil ? nil : cutAt
            status.held = state.heldCount
            return status
        case .cut:
            // The requests in the air are answered: this is the cut a snapshot is consistent with.
            cutAt = CaptureWriter.wallClockNanoseconds()
            logger.info("broker.capture.cut", metadata: ["broker.capture": "\(capture?.settings.path ?? "")"])
            var status = captureStatus ?? CaptureStatus(capturing: capture != nil)
            status.cutAt = cutAt
            status.held = state.heldCount
            return status
        case .holdFailed(let error, let stopCapture):
            // No cut: the capture asked for with it is stopped too (it would carry no snapshot).
            if stopCapture, let running = capture {
                state.capturing = false
                capture = nil
                lastCapture = running.stop()
            }
            throw error
        case .released(let released):
            guard released else { throw CanopyError(.conflict, "no hold is in force (it ended at its limit, or no capture.start asked for one)") }
            var status = captureStatus ?? CaptureStatus(capturing: capture != nil)
            status.cutAt = cutAt
            status.held = 0
            return status
        case .stop:
            guard let running = capture else { throw CanopyError(.conflict, "no capture is running; start one with canopy capture start NAME") }
            running.submit(captured) // what this pass captured before the stop
            captured.removeAll(keepingCapacity: true)
            state.capturing = false
            capture = nil
            let mailbox = self.mailbox
            let thread = Thread {
                mailbox.post(.captureStopped(running.stop(), client: client, correlation: correlation))
            }
            thread.name = "canopy-capture-stop"
            thread.start()
            return nil
        case .start(let request):
            guard let directory = configuration.captureDirectory else {
                throw CanopyError(.unauthorized, "this broker does not take capture requests; start it with --capture-dir DIR to allow them")
            }
            guard capture == nil else {
                throw CanopyError(.conflict, "a capture is running already (\(capture?.settings.path ?? "")); stop it first with canopy capture stop")
            }
            guard Self.isValidCaptureName(request.name) else {
                throw CanopyError(.badRequest, "a capture's name is 1 to 100 of A-Z, a-z, 0-9, '.', '-', '_', not starting with '.'")
            }
            var settings = configuration.capture ?? CaptureSettings(path: "")
            settings.path = directory.hasSuffix("/") ? directory + request.name : directory + "/" + request.name
            settings.pseudonymize = request.pseudonymize ?? settings.pseudonymize
            settings.withoutAttachments = request.withoutAttachments ?? settings.withoutAttachments
            settings.replaceExisting = false
            if let text = request.pseudonymKey {
                guard let key = Data(base64Encoded: text), key.count == 32 else {
                    throw CanopyError(.badRequest, "pseudonymKey is 32 bytes in base64")
                }
                settings.pseudonymKey = [UInt8](key)
            }
            if let milliseconds = request.holdMilliseconds, !(1...Int(BrokerState.maximumHold.wholeMilliseconds)).contains(milliseconds) {
                throw CanopyError(.badRequest, "holdMilliseconds is 1 to \(BrokerState.maximumHold.wholeMilliseconds)")
            }
            if request.holdMilliseconds != nil, state.hold != nil {
                throw CanopyError(.conflict, "a hold is in force already (a backup or a snapshot is being taken); try again in a moment")
            }
            do {
                capture = try CaptureWriter(settings: settings)
            } catch {
                throw CanopyError(.conflict, "the capture could not begin: \(error)")
            }
            state.capturing = true
            state.captureStatus = capture?.status
            cutAt = nil
            logger.info("broker.capture.started", metadata: ["broker.capture": "\(settings.path)"])
            if let milliseconds = request.holdMilliseconds {
                // Answered at the cut (or with the reason there was none).
                var directives: [BrokerState.Directive] = []
                state.beginHold(limit: .milliseconds(milliseconds), client: client, correlation: correlation, now: .now, into: &directives)
                pendingControls += directives
                return nil
            }
            return capture?.status ?? CaptureStatus(capturing: true, path: settings.path)
        }
    }

    /// A capture file's name as `broker.capture.start` takes it: no directories, no hidden files.
    static func isValidCaptureName(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        guard (1...100).contains(bytes.count), bytes[0] != UInt8(ascii: ".") else { return false }
        return bytes.allSatisfy { byte in
            (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
                || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "_")
        }
    }
}

/// Writes a message's frames straight to the ROUTER socket behind the peer's identity frame,
/// with no array of frames built first. A message the socket cannot take (an unroutable peer,
/// a full queue: found at its first frame) is dropped whole, as ``ZMQSocket/send(to:_:)`` does.
/// With a ticket, the last frame carries it until libzmq lets the message go.
struct RoutedWriter: FrameWriter {
    private let socket: ZMQSocket
    private var dropped: Bool
    private var ticket: SendTicket?

    init(_ socket: ZMQSocket, to peer: [UInt8], ticket: SendTicket? = nil) throws(ZMQError) {
        self.socket = socket
        self.ticket = ticket
        dropped = try !socket.sendPart(peer, more: true)
    }

    mutating func write(_ frame: [UInt8], more: Bool) throws(ZMQError) {
        guard !dropped else { return }
        if !more, let ticket {
            self.ticket = nil
            dropped = try !socket.sendLastPart(frame, ticket: ticket)
        } else {
            dropped = try !socket.sendPart(frame, more: more)
        }
    }

    mutating func write(bytes: UnsafeRawBufferPointer, more: Bool) throws(ZMQError) {
        guard !dropped else { return }
        if !more, ticket != nil { return try write(Array(bytes), more: false) }
        dropped = try !socket.sendPart(bytes: bytes, more: more)
    }
}

/// Gives memory back to the system after a burst: once the bytes the broker holds fall to a
/// quarter of their peak (and the peak was over 16 MiB), or once a burst of messages (100,000
/// or more since the last give-back, held or refused: refused ones cost libzmq's and the
/// allocator's memory too) has calmed (a pass with under 64 messages), `malloc_trim` returns
/// the freed pages of every malloc arena (libzmq's I/O thread allocates the large messages in
/// its own). At most once a second. A burst that paused long enough for a give-back and then
/// went on is given back again when it calms after 10,000 more (a loaded machine's pauses
/// come mid-burst).
struct MemoryGiveBack {
    private var peak = 0
    private var receivedSinceTrim = 0
    private var lastTrim: ContinuousClock.Instant?
    /// The last give-back came when a burst calmed, perhaps only for a moment.
    private var trimmedInBurst = false

    mutating func check(heldBytes: Int, received: Int, now: ContinuousClock.Instant) {
        peak = max(peak, heldBytes)
        receivedSinceTrim += received
        let heldFell = peak > 16 * 1024 * 1024 && heldBytes <= peak / 4
        let burst = receivedSinceTrim >= 100_000 || (trimmedInBurst && receivedSinceTrim >= 10_000)
        let burstCalmed = burst && received < 64 && heldBytes <= 16 * 1024 * 1024
        guard heldFell || burstCalmed else { return }
        if let lastTrim, now - lastTrim < .seconds(1) { return }
        malloc_trim(0)
        lastTrim = now
        peak = heldBytes
        receivedSinceTrim = 0
        trimmedInBurst = burstCalmed
    }
}

extension [UInt8] {
    /// Lower-case hexadecimal, for logging identities.
    var hex: String { lowercaseHex }
}
