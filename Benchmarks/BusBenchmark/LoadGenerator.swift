import CZeroMQ
import CanopyBus
import Histogram

/// A closed-loop load generator: `clients` DEALER sockets, each with one request
/// outstanding, all owned by the calling thread. The same generator drives the broker and
/// the `zmq_proxy` baseline, so the two see the same load.
struct LoadGenerator {
    typealias Result = LoadResult

    /// Which bodies the clients send.
    enum Bodies {
        /// The request's own body, every time.
        case fixed
        /// A different body every time (no two requests are identical).
        case unique
        /// `repeatShare` of the requests repeat one of `popular` bodies, the rest are unique.
        case mixed(popular: [[UInt8]], repeatShare: Double)
    }

    let endpoint: String
    let clients: Int
    /// The request each client sends; frame 2 is replaced by the client's correlation id.
    let request: [[UInt8]]
    var bodies: Bodies = .fixed

    /// Runs for `warmUp` (not counted), then for `duration`, and returns what it measured.
    func run(warmUp: Duration, duration: Duration) throws -> Result {
        let context = ZMQContext()
        let sockets = try dealers(clients, connectedTo: endpoint, in: context)
        defer { sockets.forEach { $0.close() } }
        var poller = Poller()
        sockets.forEach { poller.add($0) }
        var sentAt = [ContinuousClock.Instant](repeating: .now, count: clients)
        var correlations = (0..<clients).map { UInt64($0) << 32 }

        var random = SystemRandomNumberGenerator()
        func send(_ index: Int) throws {
            correlations[index] += 1
            var frames = request
            frames[2] = Wire.frame(correlations[index])
            switch bodies {
            case .fixed: break
            case .unique: frames[6] = Array("{\"n\":\(correlations[index])}".utf8)
            case .mixed(let popular, let share):
                frames[6] =
                    Double.random(in: 0..<1, using: &random) < share
                    ? popular[Int.random(in: 0..<popular.count, using: &random)]
                    : Array("{\"n\":\(correlations[index])}".utf8)
            }
            sentAt[index] = .now
            try sockets[index].send(frames, dontWait: false)
        }

        for index in 0..<clients { try send(index) }
        var result = Result()
        let start = ContinuousClock.now
        let measureFrom = start + warmUp
        let end = measureFrom + duration
        var measuring = false
        while true {
            let now = ContinuousClock.now
            if now >= end { break }
            if !measuring && now >= measureFrom {
                measuring = true
                result = Result()
            }
            try poller.poll(timeout: .milliseconds(100))
            for index in 0..<clients where poller.isReadable(index) {
                while let reply = try sockets[index].receive() {
                    guard reply.count >= 3, Wire.uint64(reply[2]) == correlations[index] else { continue }
                    if measuring {
                        result.requests += 1
                        if reply[1] != Wire.Command.reply.frame { result.errors += 1 }
                        _ = result.latencyMicros.record(UInt64(max(0, (ContinuousClock.now - sentAt[index]).microseconds)))
                    }
                    try send(index)
                }
            }
        }
        let elapsed = ContinuousClock.now - measureFrom
        result.seconds = elapsed.seconds
        return result
    }
}

/// An open burst: every client sends `perClient` identical requests at once, then waits
/// for all the answers. Returns the wall time and how many answers were replies.
func burst(endpoint: String, clients: Int, perClient: Int, request: [[UInt8]], limit: Duration = .seconds(60)) throws -> (
    seconds: Double, replies: Int, errors: Int
) {
    let context = ZMQContext()
    let sockets = try dealers(clients, connectedTo: endpoint, in: context)
    defer { sockets.forEach { $0.close() } }
    var poller = Poller()
    sockets.forEach { poller.add($0) }
    let start = ContinuousClock.now
    for socket in sockets {
        for sequence in 0..<perClient {
            var frames = request
            frames[2] = Wire.frame(UInt64(sequence + 1))
            try socket.send(frames, dontWait: false)
        }
    }
    var replies = 0, errors = 0
    while replies + errors < clients * perClient, ContinuousClock.now - start < limit {
        try poller.poll(timeout: .milliseconds(100))
        for index in sockets.indices where poller.isReadable(index) {
            while let frames = try sockets[index].receive() {
                if frames.count >= 2, frames[1] == Wire.Command.reply.frame { replies += 1 } else { errors += 1 }
            }
        }
    }
    let elapsed = ContinuousClock.now - start
    return (elapsed.seconds, replies, errors)
}

/// `count` DEALER sockets connected to `endpoint`, with high-water marks that hold a burst.
func dealers(_ count: Int, connectedTo endpoint: String, in context: ZMQContext) throws -> [ZMQSocket] {
    try (0..<count).map { _ in
        let socket = try ZMQSocket(context, type: .dealer)
        try socket.setHighWaterMarks(100_000)
        try socket.connect(endpoint)
        return socket
    }
}
