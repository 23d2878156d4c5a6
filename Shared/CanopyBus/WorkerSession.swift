import CanopyMessages
import CanopyWire

/// The worker's side of the protocol as a pure state machine, like ``BrokerState`` for the
/// broker: registration, heartbeats both ways, liveness, refusals and their backoff, the
/// broker's frame limit, and the graceful drain. Events go in with the time as an argument;
/// directives come out. It owns no socket and starts no task: ``ServiceRunner`` is the IO
/// shell that carries the directives out, and tests drive it without sockets or sleeps.
public struct WorkerSession: Sendable {
    /// What the worker announces and how it keeps time.
    public struct Settings: Sendable, Equatable {
        /// The service's name.
        public var service: String
        /// The operations it serves.
        public var operations: [OperationDescriptor]
        /// Requests held at once.
        public var credit: Int
        /// Heartbeat interval, both ways.
        public var heartbeatInterval: Duration
        /// Missed broker heartbeats before reconnecting.
        public var liveness: Int
        /// How long a graceful shutdown waits for running handlers.
        public var drainTimeout: Duration

        /// - Parameters:
        ///   - service: the service's name.
        ///   - operations: the operations it serves.
        ///   - credit: requests held at once.
        ///   - heartbeatInterval: heartbeat interval, both ways.
        ///   - liveness: missed broker heartbeats before reconnecting.
        ///   - drainTimeout: how long a graceful shutdown waits for running handlers.
        public init(
            service: String, operations: [OperationDescriptor], credit: Int, heartbeatInterval: Duration = BusDefaults.heartbeatInterval,
            liveness: Int = BusDefaults.liveness, drainTimeout: Duration = BusDefaults.drainTimeout
        ) {
            self.service = service
            self.operations = operations
            self.credit = credit
            self.heartbeatInterval = heartbeatInterval
            self.liveness = liveness
            self.drainTimeout = drainTimeout
        }
    }

    /// Something worth a log line; the shell writes it (warnings rate-limited).
    public enum Event: Equatable, Sendable {
        case registering
        case draining(running: Int)
        case stopped(abandoned: Int)
        case brokerSilent
        case disconnected(reason: String)
        case replyTooLarge(operation: String, bytes: Int)
        case dropped(reason: String)
    }

    /// What the shell must do.
    public enum Directive: Equatable, Sendable {
        /// Send this message on the current connection.
        case send(WireMessage)
        /// Run the handler of `operation` for request `id` of the current connection.
        case start(id: UInt64, operation: String, header: RequestHeader, payload: Payload)
        /// Cancel the handler of request `id`.
        case cancel(id: UInt64)
        /// Close the connection, wait `backoff`, connect again and call ``connected(now:)``.
        case reconnect(backoff: Duration)
        /// The worker has finished: close the connection and return.
        case stop
        /// Write a log line.
        case log(Event)
    }

    /// The settings in force.
    public let settings: Settings
    /// Which connection this is: 0 for the first, one more after each reconnect. Results of
    /// handlers started on an earlier connection are not sent (that broker answers for them).
    public private(set) var connection = 0
    /// Whether the broker took the READY and its heartbeats are flowing.
    public private(set) var isRegistered = false
    /// The requests whose handlers are running, by id, with their operation.
    public private(set) var running: [UInt64: String] = [:]
    /// The broker's frame limit, from its heartbeats: no reply may be larger.
    public private(set) var maximumReplyBytes = RequestContext.defaultMaximumReplyBytes
    /// When the broker last said anything.
    private var lastHeard: ContinuousClock.Instant
    private var nextHeartbeat: ContinuousClock.Instant
    private var drainDeadline: ContinuousClock.Instant?
    /// READYs refused in a row, for the backoff.
    private var refusals = 0
    /// The broker told this worker to go (or register again): the rest of what the old
    /// connection holds is not read; the next ``tick(now:)`` reconnects or stops.
    public private(set) var disconnected = false
    private let codec = MessageCodec()

    /// - Parameters:
    ///   - settings: what the worker announces and how it keeps time.
    ///   - now: the time.
    public init(settings: Settings, now: ContinuousClock.Instant) {
        self.settings = settings
        lastHeard = now
        nextHeartbeat = now + settings.heartbeatInterval
    }

    /// How long the broker may stay silent before the worker reconnects.
    public var expiry: Duration { settings.heartbeatInterval * settings.liveness }

    /// When ``tick(now:)`` next has work.
    public var nextWakeup: ContinuousClock.Instant {
        var wakeup = min(nextHeartbeat, lastHeard + expiry)
        if let drainDeadline { wakeup = min(wakeup, drainDeadline) }
        return wakeup
    }

    // MARK: - Events

    /// A connection is up (the first, or one after ``Directive/reconnect(backoff:)``): announce
    /// READY, with `credit` (a worker of several brokers grants each a share of its own,
    /// ``CreditShare``) or the settings' credit.
    public mutating func connected(now: ContinuousClock.Instant, credit: Int? = nil) -> [Directive] {
        lastHeard = now
        nextHeartbeat = now + settings.heartbeatInterval
        disconnected = false
        return [.send(.ready(service: settings.service, operations: settings.operations, credit: UInt32(credit ?? settings.credit))), .log(.registering)]
    }

    /// A message from the broker.
    public mutating func receive(_ frames: [[UInt8]], now: ContinuousClock.Instant) -> [Directive] {
        lastHeard = now
        let message: WireMessage
        do {
            message = try WireMessage(frames: frames)
        } catch {
            return [.log(.dropped(reason: "malformed message from the broker: \(error.reason.rawValue)"))]
        }
        switch message {
        case .dispatch(let id, let operation, let header, let body, let attachments):
            refusals = 0
            running[id] = operation
            return [.start(id: id, operation: operation, header: header, payload: Payload(body: body, attachments: attachments))]
        case .dispatchBatch(let requests):
            refusals = 0
            return requests.map { request in
                running[request.requestID] = request.operation
                return .start(id: request.requestID, operation: request.operation, header: request.header, payload: Payload(body: request.body))
            }
        case .cancelDispatch(let id):
            return running[id] == nil ? [] : [.cancel(id: id)]
        case .brokerHeartbeat(let limit):
            refusals = 0
            isRegistered = true
            if limit >= 1024 { maximumReplyBytes = Int(clamping: limit) }
            return []
        case .brokerDisconnect(let reason):
            refusals += 1
            disconnected = true
            return [.log(.disconnected(reason: reason))]
        default:
            return [.log(.dropped(reason: "command not sent to workers"))]
        }
    }

    /// A handler of the current connection finished: its reply goes to the broker (a reply
    /// larger than the broker's frame limit is answered `tooLarge` instead).
    public mutating func finished(id: UInt64, connection: Int, _ result: Result<Payload, CanopyError>) -> [Directive] {
        guard connection == self.connection, let operation = running.removeValue(forKey: id) else { return [] }
        let checked = Self.checked(result, service: settings.service, operation: operation, maximumReplyBytes: maximumReplyBytes)
        if case .success(let payload) = result, case .failure(let error) = checked { // a reply over the limit
            return [
                .log(.replyTooLarge(operation: operation, bytes: payload.largestFrame)), .send(.workerReply(requestID: id, failed: true, body: encoded(error))),
            ]
        }
        switch checked {
        case .success(let payload):
            return [.send(.workerReply(requestID: id, failed: false, body: payload.body, attachments: payload.attachments))]
        case .failure(let error):
            return [.send(.workerReply(requestID: id, failed: true, body: encoded(error)))]
        }
    }

    /// A handler's result as it may go to the broker: a reply with a frame larger than the
    /// broker takes becomes `tooLarge` (the broker would refuse it).
    public static func checked(
        _ result: Result<Payload, CanopyError>, service: String, operation: String,
        maximumReplyBytes: Int
    ) -> Result<Payload, CanopyError> {
        guard case .success(let payload) = result, payload.largestFrame > maximumReplyBytes else { return result }
        return .failure(
            CanopyError(
                .tooLarge,
                "a frame of the reply of \(service).\(operation) is \(payload.largestFrame) bytes, over the broker's limit of \(maximumReplyBytes) bytes; ask for less (a smaller page, or the data in pieces)"
            ))
    }

    /// A graceful shutdown begins: take no new requests, let the running ones finish.
    public mutating func shutdown(now: ContinuousClock.Instant) -> [Directive] {
        guard drainDeadline == nil else { return [] }
        drainDeadline = now + settings.drainTimeout
        return [.send(.drain), .log(.draining(running: running.count))]
    }

    /// The time passes: ends the drain, reconnects to a silent or refusing broker, sends heartbeats.
    public mutating func tick(now: ContinuousClock.Instant) -> [Directive] {
        if let drainDeadline, running.isEmpty || now >= drainDeadline || disconnected {
            var out: [Directive] = [.send(.workerDisconnect), .log(.stopped(abandoned: running.count))]
            out += running.keys.sorted().map { .cancel(id: $0) }
            running.removeAll()
            isRegistered = false
            return out + [.stop]
        }
        if disconnected || now - lastHeard > expiry {
            // What the old broker held is its to answer (or to send to another worker).
            var out: [Directive] = disconnected ? [] : [.log(.brokerSilent)]
            out += running.keys.sorted().map { .cancel(id: $0) }
            running.removeAll()
            isRegistered = false
            connection += 1
            // Refused again and again (a key not on the allow-list, a reserved name): back off, up to 5 s.
            let backoff: Duration = refusals > 1 ? .milliseconds(min(5_000, 100 << min(refusals - 2, 6))) : .zero
            return out + [.reconnect(backoff: backoff)]
        }
        guard now >= nextHeartbeat else { return [] }
        nextHeartbeat = now + settings.heartbeatInterval
        return [.send(.workerHeartbeat)]
    }

    private func encoded(_ error: CanopyError) -> [UInt8] {
        (try? codec.encode(error)) ?? Array(#"{"code":"internal","message":"unencodable error"}"#.utf8)
    }
}
