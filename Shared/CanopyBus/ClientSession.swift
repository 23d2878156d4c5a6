import CanopyMessages
import CanopyWire
import Collections

/// The client's side of the protocol as a pure state machine: calls in flight by
/// correlation id, their deadlines, cancels, what a lost connection means for each call
/// (idempotent ones go out again once the broker is back, the others fail `workerLost`), and
/// a refused CURVE key. Events go in with the time as an argument; directives come out.
/// ``BusClient`` is the IO shell: it owns the socket and the callers' continuations.
public struct ClientSession: Sendable {
    /// How a call ended.
    public enum Outcome: Equatable, Sendable {
        case reply(RawReply)
        case failure(CanopyError)
        /// The caller cancelled it.
        case cancelled
    }

    /// What the shell must do.
    public enum Directive: Equatable, Sendable {
        /// Send these frames to the broker.
        case send([[UInt8]])
        /// End call `id` with this outcome.
        case resolve(id: UInt64, Outcome)
        /// Write a log line about the connection.
        case log(Event)
    }

    /// Connection news worth a log line.
    public enum Event: Equatable, Sendable {
        case disconnected(calls: Int)
        case keyRefused
    }

    private struct Call: Sendable {
        let frames: [[UInt8]]
        let idempotent: Bool
        let deadline: ContinuousClock.Instant
        var connection: Int
    }

    private struct Deadline: Comparable, Sendable {
        let at: ContinuousClock.Instant
        let id: UInt64
        static func < (lhs: Self, rhs: Self) -> Bool { lhs.at < rhs.at }
    }

    /// How long after its deadline a call fails locally when the broker has not answered
    /// (the broker answers `timeout` itself at the deadline).
    public static let grace: Duration = .milliseconds(250)

    private var calls: [UInt64: Call] = [:]
    private var deadlines = Heap<Deadline>()
    private var cancelledEarly: Set<UInt64> = []
    private var connection = 0
    private var connected = false
    /// Set when the broker refused this client's CURVE key; cleared by a good handshake.
    public private(set) var refused = false

    /// A session with nothing in flight.
    public init() {}

    /// Calls in flight.
    public var pendingCount: Int { calls.count }

    /// When ``tick(now:)`` next has work, or `nil` when nothing waits.
    public mutating func nextWakeup() -> ContinuousClock.Instant? {
        while let first = deadlines.min, calls[first.id]?.deadline != first.at { deadlines.removeMin() }
        return deadlines.min.map { $0.at + Self.grace }
    }

    // MARK: - Events

    /// A caller makes call `id` (its REQUEST frames).
    public mutating func call(id: UInt64, frames: [[UInt8]], idempotent: Bool, deadline: ContinuousClock.Instant) -> [Directive] {
        if cancelledEarly.remove(id) != nil { return [.resolve(id: id, .cancelled)] }
        if refused { return [.resolve(id: id, .failure(ClientSession.keyRefused))] }
        calls[id] = Call(frames: frames, idempotent: idempotent, deadline: deadline, connection: connection)
        deadlines.insert(Deadline(at: deadline, id: id))
        return [.send(frames)]
    }

    /// The socket would not take call `id` (its queue is full, or no connection can take it).
    public mutating func sendFailed(id: UInt64) -> [Directive] {
        guard calls.removeValue(forKey: id) != nil else { return [] }
        return [.resolve(id: id, .failure(refused ? ClientSession.keyRefused : CanopyError(.busy, "the client's send queue is full; retry later")))]
    }

    /// The caller of `id` gave up.
    public mutating func cancel(id: UInt64) -> [Directive] {
        guard calls.removeValue(forKey: id) != nil else {
            cancelledEarly.insert(id) // the call itself is still on its way to the shell
            return []
        }
        return [.send(WireMessage.cancel(correlation: Wire.frame(id)).encoded), .resolve(id: id, .cancelled)]
    }

    /// A message from the broker: the answer to a call, or something to drop.
    public mutating func receive(_ frames: [[UInt8]]) -> [Directive] {
        // Late or unknown ids are dropped: the call was answered, cancelled or timed out already.
        do {
            let message = try WireMessage(frames: frames)
            switch message {
            case .reply(let correlation, _, _, _), .error(let correlation, _):
                guard let id = take(correlation), let outcome = Self.outcome(of: message) else { return [] }
                return [.resolve(id: id, outcome)]
            default:
                return []
            }
        } catch {
            // A malformed answer to a call still ends that call, at once.
            guard let id = take(error.correlation) else { return [] }
            return [.resolve(id: id, .failure(CanopyError(.internal, "the broker sent a malformed reply: \(error.description)")))]
        }
    }

    /// The connection to the broker was lost: calls that may have run and cannot be sent
    /// again fail now; idempotent ones wait for the next connection.
    public mutating func disconnected() -> [Directive] {
        connected = false
        connection += 1
        var out: [Directive] = [.log(.disconnected(calls: calls.count))]
        for id in calls.keys.sorted() where calls[id]!.connection < connection && !calls[id]!.idempotent {
            calls[id] = nil
            out.append(.resolve(id: id, .failure(CanopyError(.workerLost, "the connection to the broker was lost while this call was in flight; it may or may not have run, and it is not idempotent, so it was not sent again"))))
        }
        return out
    }

    /// A connection is up: idempotent calls of a lost connection go out again.
    public mutating func handshakeSucceeded() -> [Directive] {
        refused = false
        connected = true
        var out: [Directive] = []
        for id in calls.keys.sorted() where calls[id]!.connection < connection {
            calls[id]!.connection = connection
            out.append(.send(calls[id]!.frames))
        }
        return out
    }

    /// The broker refused this client's CURVE key: every call fails now, saying what to do,
    /// instead of timing out (libzmq keeps retrying the handshake).
    public mutating func handshakeRefused() -> [Directive] {
        let first = !refused
        refused = true
        return (first ? [.log(.keyRefused)] : []) + failAll(ClientSession.keyRefused)
    }

    /// Calls whose deadline (and grace) passed without an answer fail `timeout`.
    public mutating func tick(now: ContinuousClock.Instant) -> [Directive] {
        var out: [Directive] = []
        while let first = deadlines.min, first.at + Self.grace <= now {
            deadlines.removeMin()
            guard let call = calls[first.id], call.deadline == first.at else { continue }
            calls[first.id] = nil
            out.append(.resolve(id: first.id, .failure(CanopyError(.timeout, connected
                ? "no reply within the call's deadline"
                : "no reply within the call's deadline; the broker cannot be reached"))))
        }
        return out
    }

    /// Every call in flight fails with `error` (the client closes, or its loop failed).
    public mutating func failAll(_ error: CanopyError) -> [Directive] {
        defer { calls.removeAll() }
        return calls.keys.sorted().map { .resolve(id: $0, .failure(error)) }
    }

    /// The call a correlation id names, taken out of the table.
    private mutating func take(_ correlation: [UInt8]) -> UInt64? {
        guard let id = Wire.uint64(correlation), calls.removeValue(forKey: id) != nil else { return nil }
        return id
    }

    /// The frames of a request, as every caller sends it: the header carries the deadline
    /// (at least 1 ms), the flags and the principal.
    ///
    /// - Parameters:
    ///   - correlation: the call's correlation id.
    ///   - derived: the caller is a service acting on its own (``RequestHeader/Flag/derived``).
    public static func requestFrames(correlation: [UInt8], service: String, operation: String, body: [UInt8], attachments: [[UInt8]],
                                     principal: String?, timeout: Duration, idempotent: Bool, derived: Bool) -> [[UInt8]] {
        let header = RequestHeader(
            timeoutMilliseconds: UInt32(clamping: max(1, timeout.wholeMilliseconds)),
            flags: (idempotent ? RequestHeader.Flag.idempotent : 0) | (derived ? RequestHeader.Flag.derived : 0),
            principal: principal ?? "")
        return WireMessage.request(WireRequest(correlation: correlation, service: service, operation: operation, header: header,
                                               body: body, attachments: attachments)).encoded
    }

    /// How a reply or error message ends its call (`nil` for other messages): the error's JSON
    /// decoded as the service wrote it, field included.
    public static func outcome(of message: WireMessage) -> Outcome? {
        switch message {
        case .reply(_, let shared, let body, let attachments):
            .reply(RawReply(body: body, attachments: attachments, shared: shared))
        case .error(_, let error):
            .failure((try? MessageCodec.shared.decode(CanopyError.self, from: error)) ?? CanopyError(.internal, "the broker sent an unreadable error"))
        default:
            nil
        }
    }

    /// What calls fail with while the broker refuses the client's CURVE key.
    public static let keyRefused = CanopyError(.unauthorized, "the broker refused this client's CURVE key; the operator adds its public key to the broker's allow-list (--curve-allow), or check --curve-server-key")
}
