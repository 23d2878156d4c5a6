import CZeroMQ
import CanopyBus
import CanopyMessages
import Foundation
import Synchronization

/// Minimal echo workers on raw sockets, all on one thread, for both setups: behind the
/// broker they speak Canopy's worker protocol (READY, heartbeats, REPLY); behind
/// `zmq_proxy` they echo the envelope back. Both do the same work per request.
final class EchoWorkers: @unchecked Sendable {
    enum Kind { case canopy, proxy }

    private let stopFlag = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)

    /// Starts `count` workers connected to `endpoint`.
    init(endpoint: String, count: Int, kind: Kind) {
        let thread = Thread { [self] in
            canopy_name_thread("bench-workers")
            do { try loop(endpoint: endpoint, count: count, kind: kind) } catch { print("workers failed: \(error)") }
            finished.signal()
        }
        thread.start()
    }

    func stop() {
        stopFlag.store(true, ordering: .relaxed)
        finished.wait()
    }

    private func loop(endpoint: String, count: Int, kind: Kind) throws {
        let context = ZMQContext()
        let sockets = try (0..<count).map { _ in
            let socket = try ZMQSocket(context, type: .dealer)
            try socket.setHighWaterMarks(100_000)
            try socket.connect(endpoint)
            return socket
        }
        defer { sockets.forEach { $0.close() } }
        if kind == .canopy {
            let operations = try MessageCodec().encode([OperationDescriptor(name: "echo", idempotent: true, coalescable: false)])
            for socket in sockets {
                try socket.send([Wire.version, Wire.Command.ready.frame, Array("bench".utf8), operations, Wire.frame(UInt32(64))], dontWait: false)
            }
        }
        var poller = Poller()
        sockets.forEach { poller.add($0) }
        var nextHeartbeat = ContinuousClock.now + .milliseconds(500)
        while !stopFlag.load(ordering: .relaxed) {
            try poller.poll(timeout: .milliseconds(100))
            for (index, socket) in sockets.enumerated() where poller.isReadable(index) {
                while let frames = try socket.receive() {
                    switch kind {
                    case .canopy:
                        // [version, dispatch, id, operation, header, body] -> [version, reply, id, ok, body]
                        guard frames.count == 6, frames[1] == Wire.Command.dispatch.frame else { continue }
                        try socket.send([Wire.version, Wire.Command.workerReply.frame, frames[2], [Wire.Status.ok], frames[5]])
                    case .proxy:
                        // [client, version, request, correlation, service, operation, header, body]
                        //   -> [client, version, reply, correlation, flags, body]
                        guard frames.count == 8 else { continue }
                        try socket.send([frames[0], Wire.version, Wire.Command.reply.frame, frames[3], [0], frames[7]])
                    }
                }
            }
            if kind == .canopy, ContinuousClock.now >= nextHeartbeat {
                for socket in sockets { try socket.send([Wire.version, Wire.Command.workerHeartbeat.frame]) }
                nextHeartbeat = .now + .milliseconds(500)
            }
        }
        if kind == .canopy {
            for socket in sockets { try socket.send([Wire.version, Wire.Command.workerDisconnect.frame]) }
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
