import CanopyBroker
import CanopyBus
import CanopyMessages

/// A broker state plus a clock the test moves, and readers for what it sends.
struct BrokerHarness {
    var state: BrokerState
    var now = ContinuousClock.now

    /// - Parameter fresh: stay inside the start-up grace (by default the broker has been
    ///   up long enough for workers to have registered).
    init(fresh: Bool = false, _ configure: (inout BrokerConfiguration) -> Void = { _ in }) {
        var configuration = BrokerConfiguration()
        configure(&configuration)
        state = BrokerState(configuration: configuration, now: now)
        if !fresh { _ = advance(configuration.workerExpiry) }
    }

    mutating func receive(_ frames: [[UInt8]], from peer: String, key: String? = nil) -> [BrokerState.Directive] {
        var out: [BrokerState.Directive] = []
        state.receive(frames, from: Array(peer.utf8), key: key, now: now, into: &out)
        return out
    }

    mutating func advance(_ duration: Duration) -> [BrokerState.Directive] {
        now += duration
        var out: [BrokerState.Directive] = []
        state.tick(now: now, into: &out)
        return out
    }

    @discardableResult
    mutating func ready(
        _ worker: String, service: String = "plants", operations: [OperationDescriptor] = BrokerHarness.defaultOperations, credit: UInt32 = 4,
        key: String? = nil
    ) -> [BrokerState.Directive] {
        receive(WireMessage.ready(service: service, operations: operations, credit: credit).encoded, from: worker, key: key)
    }

    mutating func request(
        _ client: String, _ correlation: UInt64, service: String = "plants", operation: String = "get", timeoutMs: UInt32 = 1_000,
        principal: String = "", body: String = "{}", attachments: [[UInt8]] = [], trace: TraceContext? = nil
    ) -> [BrokerState.Directive] {
        let header = RequestHeader(timeoutMilliseconds: timeoutMs, principal: principal, trace: trace)
        return receive(
            WireMessage.request(
                WireRequest(
                    correlation: Wire.frame(correlation), service: service, operation: operation,
                    header: header, body: Array(body.utf8), attachments: attachments)
            ).encoded, from: client)
    }

    mutating func reply(
        _ worker: String, request id: UInt64, body: String = "{\"ok\":true}", status: UInt8 = Wire.Status.ok, key: String? = nil,
        attachments: [[UInt8]] = []
    ) -> [BrokerState.Directive] {
        receive(
            WireMessage.workerReply(requestID: id, failed: status != Wire.Status.ok, body: Array(body.utf8), attachments: attachments).encoded,
            from: worker, key: key)
    }

    static let defaultOperations = [
        OperationDescriptor(name: "get", idempotent: true, coalescable: false),
        OperationDescriptor(name: "add", idempotent: false, coalescable: false),
    ]
}

/// The sends among `directives`, as (peer, frames).
func sends(_ directives: [BrokerState.Directive]) -> [(peer: String, frames: [[UInt8]])] {
    directives.compactMap { directive in
        switch directive {
        case .send(let peer, let message): (String(decoding: peer, as: UTF8.self), message.encoded)
        case .sendMajordomo(let peer, let message): (String(decoding: peer, as: UTF8.self), message.encoded)
        case .log, .capture, .captureControl: nil
        }
    }
}

/// The canopy/3 messages among `directives`, as (peer, message).
func messages(_ directives: [BrokerState.Directive]) -> [(peer: String, message: WireMessage)] {
    directives.compactMap { directive in
        if case .send(let peer, let message) = directive { return (String(decoding: peer, as: UTF8.self), message) }
        return nil
    }
}

/// Requests dispatched to workers: (worker, request id, operation, header).
func dispatches(_ directives: [BrokerState.Directive]) -> [(worker: String, id: UInt64, operation: String, header: RequestHeader)] {
    messages(directives).compactMap { peer, message in
        guard case .dispatch(let id, let operation, let header, _, _) = message else { return nil }
        return (peer, id, operation, header)
    }
}

/// Errors sent to clients: (client, correlation, error).
func errors(_ directives: [BrokerState.Directive]) -> [(client: String, correlation: [UInt8], error: CanopyError)] {
    messages(directives).compactMap { peer, message in
        guard case .error(let correlation, let error) = message else { return nil }
        return (peer, correlation, try! MessageCodec().decode(CanopyError.self, from: error))
    }
}

/// Replies sent to clients: (client, correlation, body, shared).
func replies(_ directives: [BrokerState.Directive]) -> [(client: String, correlation: [UInt8], body: String, shared: Bool)] {
    messages(directives).compactMap { peer, message in
        guard case .reply(let correlation, let shared, let body, _) = message else { return nil }
        return (peer, correlation, String(decoding: body, as: UTF8.self), shared)
    }
}
