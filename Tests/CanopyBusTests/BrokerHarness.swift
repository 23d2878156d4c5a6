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
    mutating func ready(_ worker: String, service: String = "plants", operations: [OperationDescriptor] = BrokerHarness.defaultOperations, credit: UInt32 = 4,
                        key: String? = nil) -> [BrokerState.Directive] {
        let json = try! MessageCodec().encode(operations)
        return receive([Wire.version, Wire.Command.ready.frame, Array(service.utf8), json, Wire.frame(credit)], from: worker, key: key)
    }

    mutating func request(_ client: String, _ correlation: UInt64, service: String = "plants", operation: String = "get", timeoutMs: UInt32 = 1_000, principal: String = "", body: String = "{}") -> [BrokerState.Directive] {
        receive([Wire.version, Wire.Command.request.frame, Wire.frame(correlation), Array(service.utf8), Array(operation.utf8),
                 RequestHeader(timeoutMilliseconds: timeoutMs, principal: principal).frame, Array(body.utf8)], from: client)
    }

    mutating func reply(_ worker: String, request id: UInt64, body: String = "{\"ok\":true}", status: UInt8 = Wire.Status.ok, key: String? = nil) -> [BrokerState.Directive] {
        receive([Wire.version, Wire.Command.workerReply.frame, Wire.frame(id), [status], Array(body.utf8)], from: worker, key: key)
    }

    static let defaultOperations = [
        OperationDescriptor(name: "get", idempotent: true, coalescable: false),
        OperationDescriptor(name: "add", idempotent: false, coalescable: false),
    ]
}

/// The sends among `directives`, as (peer, frames).
func sends(_ directives: [BrokerState.Directive]) -> [(peer: String, frames: [[UInt8]])] {
    directives.compactMap { directive in
        if case .send(let peer, let frames) = directive { return (String(decoding: peer, as: UTF8.self), frames) }
        return nil
    }
}

/// Requests dispatched to workers: (worker, request id, operation, header).
func dispatches(_ directives: [BrokerState.Directive]) -> [(worker: String, id: UInt64, operation: String, header: RequestHeader)] {
    sends(directives).compactMap { send in
        guard send.frames[1] == Wire.Command.dispatch.frame else { return nil }
        return (send.peer, Wire.uint64(send.frames[2])!, String(decoding: send.frames[3], as: UTF8.self), RequestHeader(frame: send.frames[4])!)
    }
}

/// Errors sent to clients: (client, correlation, error).
func errors(_ directives: [BrokerState.Directive]) -> [(client: String, correlation: [UInt8], error: CanopyError)] {
    sends(directives).compactMap { send in
        guard send.frames[1] == Wire.Command.error.frame else { return nil }
        return (send.peer, send.frames[2], try! MessageCodec().decode(CanopyError.self, from: send.frames[3]))
    }
}

/// Replies sent to clients: (client, correlation, body, shared).
func replies(_ directives: [BrokerState.Directive]) -> [(client: String, correlation: [UInt8], body: String, shared: Bool)] {
    sends(directives).compactMap { send in
        guard send.frames[1] == Wire.Command.reply.frame else { return nil }
        return (send.peer, send.frames[2], String(decoding: send.frames[4], as: UTF8.self), send.frames[3] == [Wire.ReplyFlag.shared])
    }
}
