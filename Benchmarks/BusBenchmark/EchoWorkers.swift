import CZeroMQ
import CanopyBus
import CanopyMessages
import Collections
import Foundation
import Synchronization

/// Minimal echo workers on raw sockets, all on one thread, for both setups: behind the
/// broker they speak Canopy's worker protocol (READY, heartbeats, REPLY); behind
/// `zmq_proxy` they echo the envelope back. Both do the same work per request: each worker
/// serves at most `capacity` requests at once (its credit behind the broker; a local
/// backlog behind the proxy, which knows no credit), each taking `serviceTime`.
final class EchoWorkers: @unchecked Sendable {
    enum Kind { case canopy, proxy }

    /// Requests that reached a worker.
    let calls = Atomic<Int>(0)
    private let stopFlag = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)

    /// Starts `count` workers connected to `endpoint`.
    init(endpoint: String, count: Int, kind: Kind, capacity: Int = 64, serviceTime: Duration = .zero) {
        let thread = Thread { [self] in
            canopy_name_thread("bench-workers")
            do {
                try loop(endpoint: endpoint, count: count, kind: kind, capacity: capacity, serviceTime: serviceTime)
            } catch {
                print("workers failed: \(error)")
            }
            finished.signal()
        }
        thread.start()
    }

    func stop() {
        stopFlag.store(true, ordering: .relaxed)
        finished.wait()
    }

    private struct Due {
        let at: ContinuousClock.Instant
        let worker: Int
        let reply: [[UInt8]]
    }

    private func loop(endpoint: String, count: Int, kind: Kind, capacity: Int, serviceTime: Duration) throws {
        let context = ZMQContext()
        let sockets = try dealers(count, connectedTo: endpoint, in: context)
        defer { sockets.forEach { $0.close() } }
        if kind == .canopy {
            let ready = WireMessage.ready(
                service: "bench",
                operations: [
                    OperationDescriptor(name: "echo", idempotent: true, coalescable: false),
                    OperationDescriptor(name: "lookup", idempotent: true, coalescable: true),
                ], credit: UInt32(capacity))
            for socket in sockets {
                try socket.send(ready.encoded, dontWait: false)
            }
        }
        var inService = [Int](repeating: 0, count: count)
        var backlog = [Deque<[[UInt8]]>](repeating: [], count: count)
        var timers = Deque<Due>() // one service time for all: due in arrival order

        /// The messages answering one received message, and how many requests it held. A
        /// Canopy worker answers a batch of requests that all finish at once with one batch of
        /// replies, as ServiceRunner does.
        func replies(to frames: [[UInt8]]) -> (messages: [[[UInt8]]], requests: Int) {
            switch kind {
            case .canopy:
                switch try? WireMessage(frames: frames) {
                case .dispatch(let id, _, _, let body, let attachments)?:
                    return ([WireMessage.workerReply(requestID: id, failed: false, body: body, attachments: attachments).encoded], 1)
                case .dispatchBatch(let requests)?:
                    let replies = requests.map { WireMessage.BatchedReply(requestID: $0.requestID, failed: false, body: $0.body) }
                    if serviceTime == .zero { return ([WireMessage.workerReplyBatch(replies).encoded], replies.count) }
                    return (replies.map { WireMessage.workerReply(requestID: $0.requestID, failed: false, body: $0.body).encoded }, replies.count)
                default:
                    return ([], 0)
                }
            case .proxy:
                // [client, version, request, correlation, service, operation, header, body]
                //   -> [client, version, reply, correlation, flags, body]
                guard frames.count == 8 else { return ([], 0) }
                return ([[frames[0], Wire.version, Wire.Command.reply.frame, frames[3], [0], frames[7]]], 1)
            }
        }
        func start(_ frames: [[UInt8]], on worker: Int) throws {
            let (answers, requests) = replies(to: frames)
            calls.add(requests, ordering: .relaxed)
            for answer in answers {
                if serviceTime == .zero {
                    try sockets[worker].send(answer)
                } else {
                    inService[worker] += 1
                    timers.append(Due(at: .now + serviceTime, worker: worker, reply: answer))
                }
            }
        }

        var poller = Poller()
        sockets.forEach { poller.add($0) }
        var nextHeartbeat = ContinuousClock.now + .milliseconds(500)
        while !stopFlag.load(ordering: .relaxed) {
            let wait = timers.first.map { max(.zero, $0.at - .now) } ?? .milliseconds(100)
            try poller.poll(timeout: min(wait, .milliseconds(100)))
            for index in sockets.indices where poller.isReadable(index) {
                while let frames = try sockets[index].receive() {
                    if inService[index] < capacity { try start(frames, on: index) } else { backlog[index].append(frames) }
                }
            }
            let now = ContinuousClock.now
            while let first = timers.first, first.at <= now {
                timers.removeFirst()
                try sockets[first.worker].send(first.reply)
                inService[first.worker] -= 1
                if let next = backlog[first.worker].popFirst() { try start(next, on: first.worker) }
            }
            if kind == .canopy, now >= nextHeartbeat {
                for socket in sockets { try socket.send(WireMessage.workerHeartbeat.encoded) }
                nextHeartbeat = now + .milliseconds(500)
            }
        }
        if kind == .canopy {
            for socket in sockets { try socket.send(WireMessage.workerDisconnect.encoded) }
        }
    }
}

/// libzmq's own `zmq_proxy` (ROUTER frontend to DEALER backend) on a thread of its own,
/// stopped through its control socket.
final class ZMQProxy: @unchecked Sendable {
    let frontend: String
    let backend: String
    private let context = ZMQContext()
    private let control: ZMQSocket
    private let finished = DispatchSemaphore(value: 0)

    init() throws {
        let front = try ZMQSocket(context, type: .router)
        let back = try ZMQSocket(context, type: .dealer)
        try front.setHighWaterMarks(100_000)
        try back.setHighWaterMarks(100_000)
        try front.bind("tcp://127.0.0.1:*")
        try back.bind("tcp://127.0.0.1:*")
        frontend = front.lastEndpoint
        backend = back.lastEndpoint
        let controlEndpoint = "inproc://bench-proxy-control"
        let controlPeer = try ZMQSocket(context, type: .pair)
        try controlPeer.bind(controlEndpoint)
        control = try ZMQSocket(context, type: .pair)
        try control.connect(controlEndpoint)
        let sockets = UncheckedBox((front, back, controlPeer))
        let thread = Thread { [finished] in
            canopy_name_thread("zmq-proxy")
            let (front, back, controlPeer) = sockets.value
            zmq_proxy_steerable(front.handle, back.handle, nil, controlPeer.handle)
            front.close()
            back.close()
            controlPeer.close()
            finished.signal()
        }
        thread.start()
    }

    func stop() throws {
        try control.send([Array("TERMINATE".utf8)], dontWait: false)
        finished.wait()
        control.close()
    }
}

struct UncheckedBox<T>: @unchecked Sendable {
    let value: T
    init(_ value: T) { self.value = value }
}
