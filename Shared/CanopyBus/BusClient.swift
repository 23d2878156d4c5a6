import CZeroMQ
import CanopyIO
import CanopyMessages
import CanopyWire
import Collections
import Foundation
import Logging
import ServiceLifecycle
import Synchronization
import Tracing

/// A reply as it came off the bus.
public struct RawReply: Sendable, Equatable {
    /// The reply body (JSON).
    public var body: [UInt8]
    /// The reply's attachment frames, in order.
    public var attachments: [[UInt8]]
    /// Whether the broker shared this reply among coalesced identical requests.
    public var shared: Bool

    /// - Parameters:
    ///   - body: the reply body.
    ///   - attachments: the reply's attachment frames.
    ///   - shared: whether the reply was shared among coalesced requests.
    public init(body: [UInt8], attachments: [[UInt8]] = [], shared: Bool) {
        self.body = body
        self.attachments = attachments
        self.shared = shared
    }

    /// The body and attachments together.
    public var payload: Payload { Payload(body: body, attachments: attachments) }
}

/// Calls operations on the bus over ZeroMQ: `try await bus.call(SomeOperation.self, request)`
/// (the typed call is ``BusCalling``'s).
///
/// Many concurrent calls share one DEALER connection per broker, told apart by correlation
/// id. Every call has a deadline; cancelling the calling task sends a cancel to the broker.
/// With several brokers (all live) calls go to one, the client's preferred one while it is
/// up (chosen at random, so clients spread). When a broker's connection is lost (it died, or
/// restarts), idempotent calls in flight on it go to another broker that is up at once, or
/// to it again once it is back; other calls fail with `brokerLost`, because they may have run.
///
/// Thread-safe: the sockets are owned by the client's loop thread, and calls reach it
/// through a ``Mailbox``. Call ``close()`` when done.
public final class BusClient: BusCalling {
    /// How the client behaves.
    public struct Configuration: Sendable {
        /// The brokers' endpoints: one, or several live brokers of one deployment.
        public var endpoints: [String]
        /// The first broker's endpoint; setting it names that broker alone (a list in one
        /// string, `A,B`, names each).
        public var endpoint: String {
            get { endpoints[0] }
            set { endpoints = Self.split(newValue) }
        }
        /// The broker this client sends to while it is up (an index into ``endpoints``);
        /// `nil` picks one at random, so that many clients spread over the brokers.
        public var preferred: Int?
        /// The deadline of calls that give none.
        public var defaultTimeout: Duration = .seconds(30)
        /// CurveZMQ settings when the broker runs with CURVE; `nil` connects without.
        public var curve: CurveClientSettings?
        /// Whether this client belongs to a service: its requests are caused by other requests
        /// or by the service's own schedule, and say so (``RequestHeader/Flag/derived``), so a
        /// replay leaves them to the services instead of sending them twice.
        public var derived = false
        /// The stack this client belongs to, announced to the broker, which refuses the calls
        /// of another stack's clients (see `BrokerConfiguration.stack`); `nil` announces none.
        public var stack: String?
        /// The tracer of the calls' spans; `nil` takes the process's (`InstrumentationSystem`).
        public var tracer: (any Tracer)?

        /// - Parameter endpoint: the broker's endpoint, for example `tcp://127.0.0.1:5555`, or
        ///   several separated by commas (`CANOPY_ENDPOINT=tcp://a:5555,tcp://b:5555`).
        public init(endpoint: String) {
            endpoints = Self.split(endpoint)
        }

        /// - Parameter endpoints: the brokers' endpoints (at least one).
        public init(endpoints: [String]) {
            self.endpoints = endpoints.flatMap(Self.split)
        }

        /// `A,B` as `[A, B]` (blanks dropped; an empty string stays one, for a clear error).
        static func split(_ endpoints: String) -> [String] {
            let parts = endpoints.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
            return parts.isEmpty ? [endpoints] : parts
        }
    }

    fileprivate enum Control: Sendable {
        case call(id: UInt64, frames: [[UInt8]], idempotent: Bool, deadline: ContinuousClock.Instant, continuation: CheckedContinuation<RawReply, Error>)
        case cancel(id: UInt64)
        case close
    }

    private let configuration: Configuration
    private let mailbox = Mailbox<Control>()
    private let nextID = Counter()
    private let resent = SentAgain()

    /// Calls this client sent a second time: idempotent ones whose broker was lost, and those
    /// a broker refused without running them (shutting down, no workers there).
    public var callsSentAgain: Int { resent.count.load(ordering: .relaxed) }

    /// Connects to the broker and starts the client's loop thread.
    ///
    /// - Parameters:
    ///   - configuration: endpoint and default deadline.
    ///   - context: the ZeroMQ context.
    ///   - logger: where the client logs connection changes.
    public init(configuration: Configuration, context: ZMQContext, logger: Logger) throws {
        self.configuration = configuration
        let loop = try ClientLoop(configuration: configuration, context: context, mailbox: mailbox, logger: logger, resent: resent)
        LoopThread.start(name: "canopy-bus-client") { loop.run() }
    }

    deinit { mailbox.post(.close) }

    /// Fails every call in flight and stops the loop thread.
    public func close() {
        mailbox.post(.close)
    }

    public func call(
        service: String, operation: String, payload: Payload, principal: String?, timeout: Duration?, idempotent: Bool
    ) async throws -> RawReply {
        // Within a sampled request (a handler's or the edge's span), the call is a span of its
        // own, and its context goes in the header. Outside one, or in one that is not
        // recorded, nothing: not even a span that records nothing.
        let tracer = configuration.tracer ?? InstrumentationSystem.tracer
        guard let context = ServiceContext.current, BusTracing.trace(of: context, tracer: tracer) != nil else {
            return try await send(
                service: service, operation: operation, payload: payload, principal: principal, timeout: timeout,
                idempotent: idempotent, trace: nil)
        }
        return try await tracer.withSpan(BusTracing.spanName(service: service, operation: operation), context: context, ofKind: .client) { span in
            BusTracing.describe(span, service: service, operation: operation)
            do {
                return try await send(
                    service: service, operation: operation, payload: payload, principal: principal, timeout: timeout,
                    idempotent: idempotent, trace: BusTracing.trace(of: span.context, tracer: tracer))
            } catch let error as CanopyError {
                BusTracing.fail(span, error)
                throw error
            }
        }
    }

    private func send(
        service: String, operation: String, payload: Payload, principal: String?, timeout: Duration?, idempotent: Bool, trace: TraceContext?
    ) async throws -> RawReply {
        let id = nextID.next()
        let timeout = timeout ?? configuration.defaultTimeout
        let frames = ClientSession.requestFrames(
            correlation: Wire.frame(id), service: service, operation: operation, body: payload.body, attachments: payload.attachments,
            principal: principal, timeout: timeout, idempotent: idempotent, derived: configuration.derived, trace: trace)
        let deadline = ContinuousClock.now + timeout
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                if !mailbox.post(.call(id: id, frames: frames, idempotent: idempotent, deadline: deadline, continuation: continuation)) {
                    continuation.resume(throwing: clientClosed)
                }
            }
        } onCancel: {
            mailbox.post(.cancel(id: id))
        }
    }
}

/// What calls on a closed client fail with.
private let clientClosed = CanopyError(.internal, "the bus client was closed; make a new one")

/// ``BusClient/callsSentAgain``, written by the client's loop thread.
final class SentAgain: Sendable {
    let count = Atomic<Int>(0)
}

/// A thread-safe increasing counter of correlation ids.
private final class Counter: Sendable {
    private let value = Mutex<UInt64>(0)
    func next() -> UInt64 {
        value.withLock { value in
            value += 1
            return value
        }
    }
}

/// The client's sockets and everything only its thread touches: the IO shell around
/// ``ClientSession``, which decides what every event means for the calls in flight.
private final class ClientLoop: @unchecked Sendable {
    private let context: ZMQContext // outlives the sockets
    /// Per broker: its DEALER socket and that socket's monitor.
    private let sockets: [ZMQSocket]
    private let monitors: [ZMQSocket]
    private let endpoints: [String]
    private let mailbox: Mailbox<BusClient.Control>
    private let logger: Logger
    private var session: ClientSession
    /// ``BusClient/callsSentAgain``, kept up to date after each round of events.
    private let resent: SentAgain
    /// The callers waiting, by call id.
    private var continuations: [UInt64: CheckedContinuation<RawReply, Error>] = [:]

    init(configuration: BusClient.Configuration, context: ZMQContext, mailbox: Mailbox<BusClient.Control>, logger: Logger, resent: SentAgain) throws {
        self.resent = resent
        self.context = context
        self.mailbox = mailbox
        self.logger = logger
        let endpoints = configuration.endpoints
        self.endpoints = endpoints
        let preferred = configuration.preferred.map { min(max(0, $0), endpoints.count - 1) } ?? Int.random(in: 0..<endpoints.count)
        session = ClientSession(brokers: endpoints.count, preferred: preferred)
        var sockets: [ZMQSocket] = [], monitors: [ZMQSocket] = []
        // A broker's endpoint that is refused (a typo) closes every socket made before it.
        var complete = false
        defer { if !complete { (sockets + monitors).forEach { $0.close() } } }
        for (broker, endpoint) in endpoints.enumerated() {
            let socket = try ZMQSocket(context, type: .dealer)
            sockets.append(socket)
            try socket.pin(toIOThread: broker) // a broker whose name hangs in the resolver stalls only its own connection
            if let curve = configuration.curve { try socket.becomeCurveClient(curve, broker: broker) }
            if let stack = configuration.stack { try socket.announceStack(stack) }
            try socket.setHighWaterMarks(100_000)
            // Only over a connection that is up: a call never waits in a dead connection's
            // queue to be delivered late (the session holds it, or sends it elsewhere).
            try socket.set(ZMQ_IMMEDIATE, 1)
            try socket.set(ZMQ_RECONNECT_IVL, 100)
            try socket.set(ZMQ_RECONNECT_IVL_MAX, 2_000)
            try socket.setHeartbeats(interval: .seconds(1), timeout: .seconds(3))
            let monitorEndpoint = "inproc://canopy-client-monitor-\(UUID().uuidString)"
            try socket.monitor(monitorEndpoint, events: ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
            let monitor = try ZMQSocket(context, type: .pair)
            monitors.append(monitor)
            try monitor.connect(monitorEndpoint)
            try socket.connect(endpoint)
        }
        self.sockets = sockets
        self.monitors = monitors
        complete = true
    }

    func run() {
        defer {
            // Calls posted after the loop stopped are failed, not left waiting.
            for case .call(_, _, _, _, let continuation) in mailbox.close() {
                continuation.resume(throwing: clientClosed)
            }
            sockets.forEach { $0.close() }
            monitors.forEach { $0.close() }
        }
        var poller = Poller()
        let socketItems = sockets.map { poller.add($0) }
        let monitorItems = monitors.map { poller.add($0) }
        let mailboxItem = poller.add(fileDescriptor: mailbox.fileDescriptor)
        do {
            while true {
                try poller.poll(timeout: session.nextWakeup().map { max(.zero, $0 - .now) })
                // Connection news first: a call must not go out on a connection known to be lost or refused.
                for (broker, item) in monitorItems.enumerated() where poller.isReadable(item) { try connectionEvents(broker) }
                if poller.isReadable(mailboxItem) {
                    let controls = mailbox.drain()
                    for (index, control) in controls.enumerated() {
                        switch control {
                        case .call(let id, let frames, let idempotent, let deadline, let continuation):
                            continuations[id] = continuation
                            try carryOut(session.call(id: id, frames: frames, idempotent: idempotent, deadline: deadline), sending: id)
                        case .cancel(let id):
                            try carryOut(session.cancel(id: id))
                        case .close:
                            try carryOut(session.failAll(clientClosed))
                            // Calls posted after the close, in the same batch: failed too, not left waiting.
                            for case .call(_, _, _, _, let continuation) in controls[(index + 1)...] {
                                continuation.resume(throwing: clientClosed)
                            }
                            return
                        }
                    }
                }
                for (broker, item) in socketItems.enumerated() where poller.isReadable(item) {
                    while let frames = try sockets[broker].receive() { try carryOut(session.receive(frames, from: broker)) }
                }
                try carryOut(session.tick(now: .now))
                resent.count.store(session.sentAgain, ordering: .relaxed)
            }
        } catch {
            logger.error("bus.client.failed", metadata: ["error": "\(error)"])
            try? carryOut(session.failAll(CanopyError(.internal, "the bus client stopped: \(error)")))
        }
    }

    /// Carries out the session's directives. `sending` names the call whose REQUEST a
    /// `.send` carries, so a full queue fails that call.
    private func carryOut(_ directives: [ClientSession.Directive], sending call: UInt64? = nil) throws {
        for directive in directives {
            switch directive {
            case .send(let frames, let broker):
                if try !sockets[broker].send(frames), let call {
                    // A connection lost a moment ago: the session sends it elsewhere or fails it.
                    try connectionEvents(broker)
                    try carryOut(session.sendFailed(id: call, broker: broker))
                }
            case .resolve(let id, let outcome):
                guard let continuation = continuations.removeValue(forKey: id) else { continue }
                switch outcome {
                case .reply(let reply): continuation.resume(returning: reply)
                case .failure(let error): continuation.resume(throwing: error)
                case .cancelled: continuation.resume(throwing: CancellationError())
                }
            case .log(.disconnected(let broker, let calls)):
                logger.notice("bus.client.disconnected", metadata: ["bus.broker": "\(endpoints[broker])", "bus.calls": "\(calls)"])
            case .log(.switched(let from, let to)):
                logger.notice("bus.client.switched", metadata: ["bus.from": "\(endpoints[from])", "bus.to": "\(endpoints[to])"])
            case .log(.keyRefused):
                logger.error("bus.client.refused", metadata: ["bus.reason": "a broker refused this client's CURVE key"])
            }
        }
    }

    /// Reads broker `broker`'s socket monitor and tells the session what happened to its connection.
    private func connectionEvents(_ broker: Int) throws {
        while let frames = try monitors[broker].receive() {
            guard let first = frames.first, first.count >= 2 else { continue }
            switch Int32(UInt16(first[0]) | UInt16(first[1]) << 8) {
            case ZMQ_EVENT_DISCONNECTED: try carryOut(session.disconnected(broker: broker))
            case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH: try carryOut(session.handshakeRefused(broker: broker))
            case ZMQ_EVENT_HANDSHAKE_SUCCEEDED: try carryOut(session.handshakeSucceeded(broker: broker))
            default: break
            }
        }
    }
}

extension BusClient: Service {
    /// Keeps the client open until graceful shutdown, then closes it, so a `ServiceGroup`
    /// owns its lifetime: list it before the services that call through it, and it closes
    /// after they have stopped.
    public func run() async throws {
        try? await gracefulShutdown()
        close()
    }
}
