import ArgumentParser
import CanopyBroker
import CanopyMessages
import CanopyWire
import Foundation
import Glibc
import MallocInterposerSwift

/// The broker's routing state alone, without sockets: what its bookkeeping costs a request,
/// steadily and without the noise of a loaded machine's threads.
///
/// Drives ``BrokerState`` with the messages the loop thread hands it (a client's request in, a
/// dispatch out, the worker's reply in, the client's reply out; timers looked at once a pass),
/// with clients that keep a window of requests in flight, on one thread, measured in that
/// thread's CPU time after a warm-up. The baseline in the same run is a router with no
/// bookkeeping beyond one dictionary (`MinimalRouter`): it decodes the same frames and makes
/// the same messages, so the difference between the two is what the broker's bookkeeping adds
/// (the load's own work is in both, so the ratio understates it).
///
/// The frames come as arrays, which the decoder keeps as they are; the loop thread's frames are
/// libzmq's messages, from which it copies a request's correlation id and body and a reply's
/// body. Those copies are not measured here.
struct BrokerCore: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "broker-core",
        abstract: "CPU and heap allocations a request costs the broker's routing state alone (no sockets), against a one-dictionary router, same run.",
        discussion: "Example: canopy-bench broker-core --requests 1000000 --clients 64 --window 16 --workers 4 --credit 64")

    @Option(help: "Requests measured per round.") var requests = 1_000_000
    @Option(help: "Clients, each keeping --window requests in flight.") var clients = 64
    @Option(help: "Requests each client keeps in flight.") var window = 16
    @Option(help: "Workers, each answering at once.") var workers = 4
    @Option(help: "Requests each worker takes at once.") var credit = 64
    @Option(help: "Request body size in bytes.") var bodyBytes = 64
    @Option(help: "Rounds; the best round counts (the machine is shared and noisy).") var rounds = 3

    func validate() throws {
        guard requests >= 10_000, clients > 0, window > 0, workers > 0, credit > 0, rounds > 0, bodyBytes >= 0 else {
            throw ValidationError("--requests is at least 10000; --clients, --window, --workers, --credit and --rounds are positive")
        }
    }

    func run() throws {
        var best: (core: Round, minimal: Round)?
        for round in 1...rounds {
            progress("  round \(round)/\(rounds): broker state…")
            let core = try measure { try CoreLoad(self).run(router: BrokerStateRouter(), measured: $0) }
            progress(" one-dictionary router…")
            let minimal = try measure { try CoreLoad(self).run(router: MinimalRouter(), measured: $0) }
            progress(" done\n")
            if best == nil || core.nanosecondsPerRequest < best!.core.nanosecondsPerRequest { best = (core, minimal) }
        }
        guard let (core, minimal) = best else { return }
        print(
            "canopy-bench broker-core: \(clients) clients x \(window) in flight, \(workers) workers (credit \(credit)), \(bodyBytes)-byte bodies, \(requests) requests a round, best of \(rounds); one thread's CPU time"
        )
        printTable([
            ["router", "ns/req", "allocs/req", "ratio"],
            [
                "BrokerState", String(format: "%.0f", core.nanosecondsPerRequest), core.allocationsText,
                String(format: "%.2f", core.nanosecondsPerRequest / minimal.nanosecondsPerRequest),
            ],
            ["one dictionary", String(format: "%.0f", minimal.nanosecondsPerRequest), minimal.allocationsText, "1.00"],
        ])
        print("ratio: the router's CPU a request over the one-dictionary router's (the decoding and encoding both do, and a map of requests)")
    }

    struct Round {
        var nanosecondsPerRequest: Double
        var allocationsPerRequest: Double?
        var allocationsText: String { allocationsPerRequest.map { String(format: "%.2f", $0) } ?? "n/a" }
    }

    /// Runs the load twice: once timed in this thread's CPU time, once counting the process's
    /// allocations (this thread is the only busy one). `body` calls the function it is given when
    /// its warm-up is over, and returns the requests answered since.
    private func measure(_ body: (_ measured: () -> Void) throws -> Int) throws -> Round {
        var started = 0.0
        let answered = try body { started = currentThreadCPUSeconds() }
        let used = (currentThreadCPUSeconds() - started) * 1e9
        var allocations: Double?
        if ThreadAllocations.isAvailable {
            MallocInterposerSwift.reset()
            let counted = try body {
                MallocInterposerSwift.reset()
                MallocInterposerSwift.hook()
            }
            MallocInterposerSwift.unhook()
            allocations = Double(MallocInterposerSwift.getStatistics().mallocCount) / Double(counted)
            MallocInterposerSwift.reset()
        }
        return Round(nanosecondsPerRequest: Double(used) / Double(answered), allocationsPerRequest: allocations)
    }

}

/// A router under test: frames in, the messages it sends out.
protocol CoreRouter {
    mutating func start(workers: [[UInt8]], credit: Int, now: ContinuousClock.Instant)
    /// Hands one message to the router; calls `send` for each message it sends.
    mutating func receive(_ frames: [[UInt8]], from peer: [UInt8], now: ContinuousClock.Instant, send: (_ peer: [UInt8], _ message: WireMessage) -> Void)
    /// Ends a pass of the loop: what the router does once a pass (timers).
    mutating func endPass(now: ContinuousClock.Instant)
}

/// The broker's own routing state.
struct BrokerStateRouter: CoreRouter {
    private var state: BrokerState?
    private var out: [BrokerState.Directive] = []

    mutating func start(workers: [[UInt8]], credit: Int, now: ContinuousClock.Instant) {
        var configuration = BrokerConfiguration()
        configuration.startupGrace = .zero
        var state = BrokerState(configuration: configuration, now: now - .seconds(1))
        let ready = WireMessage.ready(
            service: "bench", operations: [OperationDescriptor(name: "echo", idempotent: true, coalescable: false)], credit: UInt32(credit))
        for worker in workers { state.receive(ready.encoded, from: worker, now: now, into: &out) }
        state.tick(now: now, into: &out)
        out.removeAll(keepingCapacity: true)
        self.state = state
    }

    mutating func receive(_ frames: [[UInt8]], from peer: [UInt8], now: ContinuousClock.Instant, send: ([UInt8], WireMessage) -> Void) {
        state!.receive(frames, from: peer, now: now, into: &out)
        for directive in out {
            if case .send(let peer, let message) = directive { send(peer, message) }
        }
        out.removeAll(keepingCapacity: true)
    }

    /// As the loop does after each read: the next wake-up (answered deadlines are dropped on
    /// the way), then the timers.
    mutating func endPass(now: ContinuousClock.Instant) {
        _ = state!.nextWakeup()
        state!.tick(now: now, into: &out)
        out.removeAll(keepingCapacity: true)
    }
}

/// A router with no bookkeeping beyond one dictionary of requests in flight and a queue: it
/// decodes what comes and sends what the broker would, round robin over workers with credit.
struct MinimalRouter: CoreRouter {
    private var workers: [[UInt8]] = []
    private var available: [Int] = []
    private var inFlight: [UInt64: (client: [UInt8], correlation: [UInt8], worker: Int)] = [:]
    private var queue: [(client: [UInt8], request: WireRequest)] = []
    private var queueHead = 0
    private var nextID: UInt64 = 1
    private var nextWorker = 0

    mutating func start(workers: [[UInt8]], credit: Int, now: ContinuousClock.Instant) {
        self.workers = workers
        available = Array(repeating: credit, count: workers.count)
    }

    mutating func receive(_ frames: [[UInt8]], from peer: [UInt8], now: ContinuousClock.Instant, send: ([UInt8], WireMessage) -> Void) {
        guard let message = try? WireMessage(frames: frames) else { return }
        switch message {
        case .request(let request):
            queue.append((peer, request))
        case .workerReply(let id, _, let body, let attachments):
            guard let held = inFlight.removeValue(forKey: id) else { return }
            available[held.worker] += 1
            send(held.client, .reply(correlation: held.correlation, shared: false, body: body, attachments: attachments))
        default:
            return
        }
        while queueHead < queue.count, let worker = freeWorker() {
            let (client, request) = queue[queueHead]
            queueHead += 1
            available[worker] -= 1
            let id = nextID
            nextID += 1
            inFlight[id] = (client, request.correlation, worker)
            send(
                workers[worker],
                .dispatch(requestID: id, operation: request.operation, header: request.header, body: request.body, attachments: request.attachments))
        }
        if queueHead > 4_096, queueHead * 2 > queue.count {
            queue.removeFirst(queueHead)
            queueHead = 0
        }
    }

    mutating func endPass(now: ContinuousClock.Instant) {}

    private mutating func freeWorker() -> Int? {
        for offset in 0..<workers.count {
            let worker = (nextWorker + offset) % workers.count
            if available[worker] > 0 {
                nextWorker = (worker + 1) % workers.count
                return worker
            }
        }
        return nil
    }
}

/// The load: clients that resend each request as soon as it is answered, and workers that
/// answer each dispatch at once with the request's body.
private struct CoreLoad {
    let core: BrokerCore

    init(_ core: BrokerCore) { self.core = core }

    /// Runs `core.requests` requests after a warm-up of a tenth as many, calling `measured`
    /// between the two; returns the requests answered after the warm-up.
    func run<Router: CoreRouter>(router: Router, measured: () -> Void) throws -> Int {
        var router = router
        let workers = (0..<core.workers).map { Array("worker-\($0)".utf8) }
        let clients = (0..<core.clients).map { Array("client-\($0)".utf8) }
        var now = ContinuousClock.now
        router.start(workers: workers, credit: core.credit, now: now)
        let body = [UInt8](repeating: UInt8(ascii: "x"), count: core.bodyBytes)
        // Each client's requests, encoded once: a client resends the same frames.
        var requests: [[UInt8]: [[UInt8]: [[UInt8]]]] = [:]
        for client in clients {
            for slot in 0..<core.window {
                let correlation = Wire.frame(UInt64(slot + 1))
                let request = WireRequest(
                    correlation: correlation, service: "bench", operation: "echo", header: RequestHeader(timeoutMilliseconds: 30_000), body: body)
                requests[client, default: [:]][correlation] = WireMessage.request(request).encoded
            }
        }
        // Messages waiting to be handed to the router, in order.
        var pending: [(frames: [[UInt8]], peer: [UInt8])] = []
        pending.reserveCapacity(core.clients * core.window * 2)
        for client in clients {
            for frames in requests[client]!.values { pending.append((frames, client)) }
        }
        let warmUp = core.requests / 10
        var answered = 0
        var failures = 0
        var next: [(frames: [[UInt8]], peer: [UInt8])] = []
        next.reserveCapacity(pending.count)
        var started: Int?
        while answered < warmUp + core.requests {
            guard failures == 0 else {
                throw ValidationError("the router sent \(failures) unexpected messages (errors, refusals or unknown replies) after \(answered) answers")
            }
            guard !pending.isEmpty else { throw ValidationError("the router stopped answering after \(answered) requests") }
            if started == nil, answered >= warmUp {
                started = answered
                measured()
            }
            now += .microseconds(1)
            for (frames, peer) in pending {
                router.receive(frames, from: peer, now: now) { peer, message in
                    switch message {
                    case .dispatch(let id, _, _, let body, let attachments):
                        next.append((WireMessage.workerReply(requestID: id, failed: false, body: body, attachments: attachments).encoded, peer))
                    case .reply(let correlation, _, _, _):
                        answered += 1
                        if let frames = requests[peer]?[correlation] { next.append((frames, peer)) } else { failures += 1 }
                    default:
                        failures += 1
                    }
                }
            }
            router.endPass(now: now)
            swap(&pending, &next)
            next.removeAll(keepingCapacity: true)
        }
        return answered - (started ?? 0)
    }
}
