import CanopyWire
import CanopyIO
import CZeroMQ
import CanopyMessages
import Collections
import Foundation
import Logging

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

/// Calls operations on the bus: `try await bus.call(SomeOperation.self, request)`.
///
/// Many concurrent calls share one DEALER connection, told apart by correlation id. Every
/// call has a deadline; cancelling the calling task sends a cancel to the broker. When the
/// connection to the broker is lost (a broker restart), idempotent calls in flight are sent
/// again once it is back; other calls fail with `workerLost`, because they may have run.
///
/// Thread-safe: the socket is owned by the client's loop thread, and calls reach it through
/// a ``Mailbox``. Call ``close()`` when done.
public final class BusClient: Sendable {
    /// How the client behaves.
    public struct Configuration: Sendable {
        /// The broker's endpoint.
        public var endpoint: String
        /// The deadline of calls that give none.
        public var defaultTimeout: Duration = .seconds(30)
        /// CurveZMQ settings when the broker runs with CURVE; `nil` connects without.
        public var curve: CurveClientSettings?

        /// - Parameter endpoint: the broker's endpoint, for example `tcp://127.0.0.1:5555`.
        public init(endpoint: String) {
            self.endpoint = endpoint
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
    private let codec = MessageCodec()

    /// Connects to the broker and starts the client's loop thread.
    ///
    /// - Parameters:
    ///   - configuration: endpoint and default deadline.
    ///   - context: the ZeroMQ context.
    ///   - logger: where the client logs connection changes.
    public init(configuration: Configuration, context: ZMQContext, logger: Logger) throws {
        self.configuration = configuration
        let loop = try ClientLoop(endpoint: configuration.endpoint, curve: configuration.curve, context: context, mailbox: mailbox, logger: logger)
        LoopThread.start(name: "canopy-bus-client") { loop.run() }
    }

    deinit { mailbox.post(.close) }

    /// Fails every call in flight and stops the loop thread.
    public func close() {
        mailbox.post(.close)
    }

    /// Calls a typed operation and decodes its reply.
    ///
    /// - Parameters:
    ///   - operation: the operation type.
    ///   - request: the request body.
    ///   - principal: the user the call acts for, when it touches a person's data.
    ///   - timeout: how long to wait; the configuration's default when `nil`.
    /// - Throws: ``CanopyError`` for every failure the bus or the service reports, or
    ///   `CancellationError` when the calling task is cancelled.
    public func call<Operation: BusOperation>(
        _ operation: Operation.Type, _ request: Operation.Request, principal: String? = nil, timeout: Duration? = nil
    ) async throws -> Operation.Reply {
        let payload = try codec.encodePayload(request)
        let reply = try await call(service: Operation.service, operation: Operation.name, body: payload.body, attachments: payload.attachments,
                                   principal: principal, timeout: timeout, idempotent: Operation.idempotent)
        do {
            return try codec.decodePayload(Operation.Reply.self, from: reply.payload)
        } catch {
            throw CanopyError(.internal, "the reply of \(Operation.service).\(Operation.name) did not decode: \(error.message)")
        }
    }

    /// Calls an operation with a raw JSON body (what `canopy send` does).
    ///
    /// - Parameters:
    ///   - service: the service name.
    ///   - operation: the operation name.
    ///   - body: the request body, JSON.
    ///   - attachments: frames of their own beside the body (photo bytes).
    ///   - principal: the user the call acts for, if any.
    ///   - timeout: how long to wait; the configuration's default when `nil`.
    ///   - idempotent: whether the call may be sent again after losing the broker.
    public func call(
        service: String, operation: String, body: [UInt8], attachments: [[UInt8]] = [], principal: String? = nil, timeout: Duration? = nil,
        idempotent: Bool = false
    ) async throws -> RawReply {
        let id = nextID.next()
        let timeout = timeout ?? configuration.defaultTimeout
        let header = RequestHeader(
            timeoutMilliseconds: UInt32(clamping: max(1, timeout.wholeMilliseconds)),
            flags: idempotent ? RequestHeader.Flag.idempotent : 0,
            principal: principal ?? "")
        let frames = WireMessage.request(WireRequest(correlation: Wire.frame(id), service: service, operation: operation, header: header,
                                                     body: body, attachments: attachments)).encoded
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

/// What calls fail with while the broker refuses the client's CURVE key.
private let keyRefused = CanopyError(.unauthorized, "the broker refused this client's CURVE key; the operator adds its public key to the broker's allow-list (--curve-allow), or check --curve-server-key")

/// What calls on a closed client fail with.
private let clientClosed = CanopyError(.internal, "the bus client was closed; make a new one")

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

import Synchronization

/// The client's socket and everything only its thread touches.
private final class ClientLoop: @unchecked Sendable {
    private struct Call {
        let frames: [[UInt8]]
        let idempotent: Bool
        let deadline: ContinuousClock.Instant
        let continuation: CheckedContinuation<RawReply, Error>
        var connection: Int
    }

    private struct Deadline: Comparable {
        let at: ContinuousClock.Instant
        let id: UInt64
        static func < (lhs: Self, rhs: Self) -> Bool { lhs.at < rhs.at }
    }

    /// How long after its deadline a call fails locally when the broker has not answered.
    private static let grace: Duration = .milliseconds(250)

    private let context: ZMQContext // outlives the sockets
    private let socket: ZMQSocket
    private let monitor: ZMQSocket
    private let mailbox: Mailbox<BusClient.Control>
    private let logger: Logger
    private let codec = MessageCodec()
    private var calls: [UInt64: Call] = [:]
    private var deadlines = Heap<Deadline>()
    private var cancelledEarly: Set<UInt64> = []
    private var connection = 0
    private var connected = false
    /// Set when the broker refused this client's CURVE key; cleared by a good handshake.
    private var refused = false

    init(endpoint: String, curve: CurveClientSettings?, context: ZMQContext, mailbox: Mailbox<BusClient.Control>, logger: Logger) throws {
        self.context = context
        self.mailbox = mailbox
        self.logger = logger
        socket = try ZMQSocket(context, type: .dealer)
        if let curve { try socket.becomeCurveClient(curve) }
        try socket.setHighWaterMarks(100_000)
        try socket.set(ZMQ_RECONNECT_IVL, 100)
        try socket.set(ZMQ_RECONNECT_IVL_MAX, 2_000)
        try socket.setHeartbeats(interval: .seconds(1), timeout: .seconds(3))
        let monitorEndpoint = "inproc://canopy-client-monitor-\(UUID().uuidString)"
        try socket.monitor(monitorEndpoint, events: ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
        monitor = try ZMQSocket(context, type: .pair)
        try monitor.connect(monitorEndpoint)
        try socket.connect(endpoint)
    }

    func run() {
        defer {
            // Calls posted after the loop stopped are failed, not left waiting.
            for case .call(_, _, _, _, let continuation) in mailbox.close() {
                continuation.resume(throwing: clientClosed)
            }
            socket.close()
            monitor.close()
        }
        var poller = Poller()
        let socketItem = poller.add(socket)
        let monitorItem = poller.add(monitor)
        let mailboxItem = poller.add(fileDescriptor: mailbox.fileDescriptor)
        do {
            while true {
                try poller.poll(timeout: nextTimeout())
                // Connection news first: a call must not go out on a connection known to be refused.
                if poller.isReadable(monitorItem) { try connectionEvents() }
                if poller.isReadable(mailboxItem) {
                    for control in mailbox.drain() {
                        if case .close = control {
                            failAll(clientClosed)
                            return
                        }
                        try handle(control)
                    }
                }
                if poller.isReadable(socketItem) {
                    while let frames = try socket.receive() { answer(frames) }
                }
                expireCalls()
            }
        } catch {
            logger.error("bus.client.failed", metadata: ["error": "\(error)"])
            failAll(CanopyError(.internal, "the bus client stopped: \(error)"))
        }
    }

    private func nextTimeout() -> Duration? {
        while let first = deadlines.min, calls[first.id]?.deadline != first.at { deadlines.removeMin() }
        guard let first = deadlines.min else { return nil }
        return max(.zero, first.at + Self.grace - .now)
    }

    private func handle(_ control: BusClient.Control) throws {
        switch control {
        case .call(let id, let frames, let idempotent, let deadline, let continuation):
            if cancelledEarly.remove(id) != nil {
                continuation.resume(throwing: CancellationError())
                return
            }
            if refused {
                continuation.resume(throwing: keyRefused)
                return
            }
            calls[id] = Call(frames: frames, idempotent: idempotent, deadline: deadline, continuation: continuation, connection: connection)
            deadlines.insert(Deadline(at: deadline, id: id))
            if try !socket.send(frames) {
                calls[id] = nil
                try connectionEvents() // a refused handshake leaves no connection to queue on
                continuation.resume(throwing: refused ? keyRefused : CanopyError(.busy, "the client's send queue is full; retry later"))
            }
        case .cancel(let id):
            guard let call = calls.removeValue(forKey: id) else {
                cancelledEarly.insert(id) // the call itself is still on its way in the mailbox
                return
            }
            try socket.send(WireMessage.cancel(correlation: Wire.frame(id)).encoded)
            call.continuation.resume(throwing: CancellationError())
        case .close:
            break
        }
    }

    private func answer(_ frames: [[UInt8]]) {
        // Late or unknown ids are dropped: the call was answered, cancelled or timed out already.
        do {
            switch try WireMessage(frames: frames) {
            case .reply(let correlation, let shared, let body, let attachments):
                guard let id = Wire.uint64(correlation), let call = calls.removeValue(forKey: id) else { return }
                call.continuation.resume(returning: RawReply(body: body, attachments: attachments, shared: shared))
            case .error(let correlation, let error):
                guard let id = Wire.uint64(correlation), let call = calls.removeValue(forKey: id) else { return }
                call.continuation.resume(throwing: (try? codec.decode(CanopyError.self, from: error)) ?? CanopyError(.internal, "the broker sent an unreadable error"))
            default:
                logger.debug("bus.client.unexpected", metadata: ["bus.frames": "\(frames.count)"])
            }
        } catch {
            // A malformed answer to a call still ends that call, at once.
            guard let id = Wire.uint64(error.correlation), let call = calls.removeValue(forKey: id) else { return }
            call.continuation.resume(throwing: CanopyError(.internal, "the broker sent a malformed reply: \(error.description)"))
        }
    }

    /// Reads the socket monitor: on a lost connection, calls that cannot be sent again fail;
    /// on a new one, idempotent calls that were on the lost connection go out again.
    private func connectionEvents() throws {
        while let frames = try monitor.receive() {
            guard let first = frames.first, first.count >= 2 else { continue }
            let event = Int32(UInt16(first[0]) | UInt16(first[1]) << 8)
            if event == ZMQ_EVENT_DISCONNECTED {
                connected = false
                connection += 1
                logger.notice("bus.client.disconnected", metadata: ["bus.calls": "\(calls.count)"])
                for (id, call) in calls where call.connection < connection && !call.idempotent {
                    calls[id] = nil
                    call.continuation.resume(throwing: CanopyError(.workerLost, "the connection to the broker was lost while this call was in flight; it may or may not have run, and it is not idempotent, so it was not sent again"))
                }
            } else if event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH {
                // libzmq keeps retrying; calls fail now, with what to do, instead of timing out.
                if !refused { logger.error("bus.client.refused", metadata: ["bus.reason": "the broker refused this client's CURVE key"]) }
                refused = true
                failAll(keyRefused)
            } else if event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED {
                refused = false
                connected = true
                for (id, call) in calls where call.connection < connection {
                    calls[id]!.connection = connection
                    try socket.send(call.frames)
                }
            }
        }
    }

    private func expireCalls() {
        let now = ContinuousClock.now
        while let first = deadlines.min, first.at + Self.grace <= now {
            deadlines.removeMin()
            guard let call = calls[first.id], call.deadline == first.at else { continue }
            calls[first.id] = nil
            call.continuation.resume(throwing: CanopyError(.timeout, connected
                ? "no reply within the call's deadline"
                : "no reply within the call's deadline; the broker cannot be reached"))
        }
    }

    private func failAll(_ error: CanopyError) {
        for call in calls.values { call.continuation.resume(throwing: error) }
        calls.removeAll()
    }
}

import ServiceLifecycle

extension BusClient: Service {
    /// Keeps the client open until graceful shutdown, then closes it, so a `ServiceGroup`
    /// owns its lifetime: list it before the services that call through it, and it closes
    /// after they have stopped.
    public func run() async throws {
        try? await gracefulShutdown()
        close()
    }
}
