import CanopyMessages
import CanopyWire
import Collections

/// The client's side of the protocol as a pure state machine: calls in flight by
/// correlation id, their deadlines, cancels, one or several brokers and what losing one
/// means for each call (idempotent ones go out again to a broker that is up, the others fail
/// `brokerLost`), and a refused CURVE key. Events go in with the time as an argument;
/// directives come out. ``BusClient`` is the IO shell: it owns a socket per broker and the
/// callers' continuations.
///
/// With several brokers (all live, each a full broker; docs/PROTOCOL.md "Several brokers"),
/// new calls go to one of them: the client's *preferred* broker when it is connected (clients
/// pick theirs at random, so they spread), else the one it is on, else the next connected
/// one. A call is sent only over a connection known to be up; with none up, calls wait (for
/// their deadline) for the first.
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
        /// Send these frames to broker `broker` (an index into the client's brokers).
        case send([[UInt8]], broker: Int)
        /// End call `id` with this outcome.
        case resolve(id: UInt64, Outcome)
        /// Write a log line about the connections.
        case log(Event)
    }

    /// Connection news worth a log line.
    public enum Event: Equatable, Sendable {
        /// Broker `broker`'s connection was lost with `calls` of this client's calls on it.
        case disconnected(broker: Int, calls: Int)
        /// New calls now go to broker `to` (`from` was lost, or `to` is the preferred one back).
        case switched(from: Int, to: Int)
        case keyRefused
    }

    private struct Call: Sendable {
        let frames: [[UInt8]]
        let idempotent: Bool
        let deadline: ContinuousClock.Instant
        /// The broker it was sent to and that broker's connection then; nil while it waits
        /// for a connection.
        var sent: (broker: Int, connection: Int)?
        /// Brokers that answered it `noWorkers` (bit per broker): it goes to another first.
        var noWorkersAt: UInt64 = 0
        /// Whether it was sent before (a send now is a second one).
        var sentBefore = false
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
    /// Per broker: its connection's number (one more after each loss) and whether it is up.
    private var connections: [Int]
    private var connected: [Bool]
    /// The broker new calls go to first, and the one they go to now.
    public let preferred: Int
    public private(set) var active: Int
    /// Set when a broker refused this client's CURVE key; cleared by a good handshake.
    public private(set) var refused = false
    /// Calls sent a second time (or more): idempotent calls whose broker was lost, calls a
    /// broker refused as it shut down or answered `noWorkers`.
    public private(set) var sentAgain = 0

    /// A session with nothing in flight.
    ///
    /// - Parameters:
    ///   - brokers: how many brokers the client knows (each its own socket in the shell).
    ///   - preferred: the one it sends to while it is up.
    public init(brokers: Int = 1, preferred: Int = 0) {
        precondition(brokers >= 1 && (0..<brokers).contains(preferred), "a client of \(brokers) broker(s) preferring \(preferred)")
        connections = Array(repeating: 0, count: brokers)
        connected = Array(repeating: false, count: brokers)
        self.preferred = preferred
        active = preferred
    }

    /// Calls in flight.
    public var pendingCount: Int { calls.count }

    /// How many brokers the client knows.
    public var brokerCount: Int { connected.count }

    /// Whether broker `broker`'s connection is up.
    public func isConnected(_ broker: Int) -> Bool { connected[broker] }

    /// When ``tick(now:)`` next has work, or `nil` when nothing waits.
    public mutating func nextWakeup() -> ContinuousClock.Instant? {
        while let first = deadlines.min, calls[first.id]?.deadline != first.at { deadlines.removeMin() }
        return deadlines.min.map { $0.at + Self.grace }
    }

    // MARK: - Events

    /// A caller makes call `id` (its REQUEST frames).
    public mutating func call(id: UInt64, frames: [[UInt8]], idempotent: Bool, deadline: ContinuousClock.Instant) -> [Directive] {
        if cancelledEarly.remove(id) != nil { return [.resolve(id: id, .cancelled)] }
        if refused && !connected.contains(true) { return [.resolve(id: id, .failure(ClientSession.keyRefused))] }
        calls[id] = Call(frames: frames, idempotent: idempotent, deadline: deadline, sent: nil)
        deadlines.insert(Deadline(at: deadline, id: id))
        guard connected[active] else { return [] } // waits for a connection
        return [send(id, to: active)]
    }

    /// Broker `broker`'s socket would not take call `id`: its queue is full (a connection
    /// lost meanwhile was told to ``disconnected(broker:)`` first, which sent the call
    /// elsewhere or failed it).
    public mutating func sendFailed(id: UInt64, broker: Int = 0) -> [Directive] {
        guard let call = calls[id], call.sent?.broker == broker, call.sent?.connection == connections[broker] else { return [] }
        if !connected[broker] {
            calls[id]!.sent = nil // waits for a connection
            return sendWaiting()
        }
        calls[id] = nil
        return [.resolve(id: id, .failure(refused ? ClientSession.keyRefused : CanopyError(.busy, "the client's send queue is full; retry later")))]
    }

    /// The caller of `id` gave up.
    public mutating func cancel(id: UInt64) -> [Directive] {
        guard let call = calls.removeValue(forKey: id) else {
            cancelledEarly.insert(id) // the call itself is still on its way to the shell
            return []
        }
        guard let sent = call.sent, connected[sent.broker], connections[sent.broker] == sent.connection else { return [.resolve(id: id, .cancelled)] }
        return [.send(WireMessage.cancel(correlation: Wire.frame(id)).encoded, broker: sent.broker), .resolve(id: id, .cancelled)]
    }

    /// A message from broker `broker`: the answer to a call, or something to drop.
    public mutating func receive(_ frames: [[UInt8]], from broker: Int = 0) -> [Directive] {
        // Late or unknown ids are dropped: the call was answered, cancelled or timed out already.
        do {
            let message = try WireMessage(frames: frames)
            switch message {
            case .reply(let correlation, _, _, _), .error(let correlation, _):
                guard let id = Wire.uint64(correlation), calls[id] != nil, let outcome = Self.outcome(of: message) else { return [] }
                if case .failure(let error) = outcome, error.code == .shuttingDown || error.code == .noWorkers,
                    calls[id]!.sent?.broker != broker
                {
                    return [] // a refusal from a broker the call has left already (it went elsewhere)
                }
                if case .failure(let error) = outcome, error.code == .shuttingDown {
                    return leaving(broker, refused: id, error)
                }
                if case .failure(let error) = outcome, error.code == .noWorkers, let other = untried(id, after: broker) {
                    // Not run: the service may have workers at another broker (a Majordomo
                    // worker knows one; a worker registering again after a restart).
                    return [send(id, to: other)]
                }
                calls[id] = nil
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

    /// A connected broker that has not answered call `id` `noWorkers`, after `broker` (which
    /// just did), or nil.
    private mutating func untried(_ id: UInt64, after broker: Int) -> Int? {
        calls[id]!.noWorkersAt |= 1 << UInt64(min(broker, 63))
        let tried = calls[id]!.noWorkersAt
        return (1..<connected.count).map { (broker + $0) % connected.count }.first { connected[$0] && tried & (1 << UInt64(min($0, 63))) == 0 }
    }

    /// Broker `broker` is shutting down (a planned restart) and refused call `id` without
    /// running it: new calls go to another broker until its connection is back (a new broker
    /// on its endpoint), and this one goes there too, idempotent or not; with no other broker
    /// up, it ends with the broker's answer. Calls it holds are still answered as it drains.
    private mutating func leaving(_ broker: Int, refused id: UInt64, _ error: CanopyError) -> [Directive] {
        connected[broker] = false
        var out = choose()
        guard connected[active] else {
            calls[id] = nil
            return out + [.resolve(id: id, .failure(error))]
        }
        out.append(send(id, to: active))
        return out
    }

    /// Broker `broker`'s connection was lost: its calls that may have run and cannot be sent
    /// again fail now (`brokerLost`); idempotent ones go to another broker that is up at once,
    /// or wait for the next connection; new calls go elsewhere.
    public mutating func disconnected(broker: Int = 0) -> [Directive] {
        let wasUp = connected[broker]
        connected[broker] = false
        connections[broker] += 1
        let lost = calls.keys.sorted().filter { calls[$0]!.sent?.broker == broker && calls[$0]!.sent!.connection < connections[broker] }
        var out: [Directive] = wasUp || !lost.isEmpty ? [.log(.disconnected(broker: broker, calls: lost.count))] : []
        for id in lost {
            if calls[id]!.idempotent {
                calls[id]!.sent = nil
            } else {
                calls[id] = nil
                out.append(
                    .resolve(
                        id: id,
                        .failure(
                            CanopyError(
                                .brokerLost,
                                "the connection to the broker was lost while this call was in flight; it may or may not have run, and it is not idempotent, so it was not sent again"
                            ))))
            }
        }
        return out + choose() + sendWaiting()
    }

    /// Broker `broker`'s connection is up: calls waiting for one go out.
    public mutating func handshakeSucceeded(broker: Int = 0) -> [Directive] {
        refused = false
        connected[broker] = true
        return choose() + sendWaiting()
    }

    /// A broker refused this client's CURVE key: while no broker takes it, every call fails
    /// now, saying what to do, instead of timing out (libzmq keeps retrying the handshake).
    public mutating func handshakeRefused(broker: Int = 0) -> [Directive] {
        let first = !refused
        refused = true
        guard !connected.contains(true) else { return first ? [.log(.keyRefused)] : [] }
        return (first ? [.log(.keyRefused)] : []) + failAll(ClientSession.keyRefused)
    }

    /// Calls whose deadline (and grace) passed without an answer fail `timeout`.
    public mutating func tick(now: ContinuousClock.Instant) -> [Directive] {
        var out: [Directive] = []
        while let first = deadlines.min, first.at + Self.grace <= now {
            deadlines.removeMin()
            guard let call = calls[first.id], call.deadline == first.at else { continue }
            calls[first.id] = nil
            out.append(
                .resolve(
                    id: first.id,
                    .failure(
                        CanopyError(
                            .timeout,
                            connected.contains(true)
                                ? "no reply within the call's deadline"
                                : "no reply within the call's deadline; no broker can be reached"))))
        }
        return out
    }

    /// Every call in flight fails with `error` (the client closes, or its loop failed).
    public mutating func failAll(_ error: CanopyError) -> [Directive] {
        defer { calls.removeAll() }
        return calls.keys.sorted().map { .resolve(id: $0, .failure(error)) }
    }

    /// Points new calls at the preferred broker when it is up, else keeps the one they go to
    /// when it is up, else the next that is.
    private mutating func choose() -> [Directive] {
        let before = active
        if connected[preferred] {
            active = preferred
        } else if !connected[active], let next = (1..<connected.count).map({ (active + $0) % connected.count }).first(where: { connected[$0] }) {
            active = next
        }
        return active == before ? [] : [.log(.switched(from: before, to: active))]
    }

    /// Sends the calls that wait for a connection to the active broker, when it is up.
    private mutating func sendWaiting() -> [Directive] {
        guard connected[active] else { return [] }
        var out: [Directive] = []
        for id in calls.keys.sorted() where calls[id]!.sent == nil {
            out.append(send(id, to: active))
        }
        return out
    }

    /// Call `id` goes to `broker` (counted in ``sentAgain`` when it went somewhere before).
    private mutating func send(_ id: UInt64, to broker: Int) -> Directive {
        if calls[id]!.sentBefore { sentAgain += 1 }
        calls[id]!.sentBefore = true
        calls[id]!.sent = (broker, connections[broker])
        return .send(calls[id]!.frames, broker: broker)
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
    ///   - trace: the calling span, when it is sampled.
    public static func requestFrames(
        correlation: [UInt8], service: String, operation: String, body: [UInt8], attachments: [[UInt8]],
        principal: String?, timeout: Duration, idempotent: Bool, derived: Bool, trace: TraceContext? = nil
    ) -> [[UInt8]] {
        let header = RequestHeader(
            timeoutMilliseconds: UInt32(clamping: max(1, timeout.wholeMilliseconds)),
            flags: (idempotent ? RequestHeader.Flag.idempotent : 0) | (derived ? RequestHeader.Flag.derived : 0),
            principal: principal ?? "", trace: trace)
        return WireMessage.request(
            WireRequest(
                correlation: correlation, service: service, operation: operation, header: header,
                body: body, attachments: attachments)
        ).encoded
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
    public static let keyRefused = CanopyError(
        .unauthorized,
        "the broker refused this client's CURVE key; the operator adds its public key to the broker's allow-list (--curve-allow), or check --curve-server-key")
}
