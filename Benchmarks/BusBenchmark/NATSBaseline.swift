import CZeroMQ
import CanopyTesting
import Foundation
import Glibc
import Histogram
import Synchronization

/// nats-server, the bus a user would pick instead of canopy-broker, carrying the same load as
/// the broker and `zmq_proxy` in the same run: Debian's `nats-server` on an ephemeral loopback
/// port, echo responders in one queue group, and pipelined requesters, one connection each,
/// keeping a window of requests in flight with a reply subject (the send time travels in it, as
/// in the bus generator's correlation ids). The protocol is NATS's text protocol over TCP
/// (`CONNECT`, `SUB`, `PUB`, `MSG`, `PING`/`PONG`), spoken here directly.
struct NATSBaseline {
    /// Where nats-server is, when installed (`apt-get install nats-server`).
    static var server: String? {
        which("nats-server") ?? (FileManager.default.isExecutableFile(atPath: "/usr/sbin/nats-server") ? "/usr/sbin/nats-server" : nil)
    }

    let clients: Int
    let window: Int
    let threads: Int
    let responders: Int
    let body: [UInt8]
    let warmUp: Duration
    let duration: Duration

    /// Runs the load against a fresh nats-server; returns it and the server's CPU seconds a
    /// second while measuring.
    func run() throws -> (LoadResult, serverCPU: Double) {
        guard let path = Self.server else { throw BenchmarkFailure("nats-server is not installed (apt-get install nats-server)") }
        let port = UInt16(FreePorts.any())
        let server = Process()
        server.executableURL = URL(fileURLWithPath: path)
        server.arguments = ["-a", "127.0.0.1", "-p", "\(port)", "--no_advertise"]
        server.standardOutput = FileHandle.nullDevice
        server.standardError = FileHandle.nullDevice
        try server.run()
        defer {
            server.terminate()
            server.waitUntilExit()
        }
        try Self.waitForListener(port: port)
        let stop = StopFlag()
        let ready = DispatchGroup()
        let finished = DispatchGroup()
        for index in 0..<responders {
            ready.enter()
            finished.enter()
            Thread {
                canopy_name_thread("bench-workers")
                defer { finished.leave() }
                try? Self.respond(port: port, name: "r\(index)", ready: ready, stop: stop)
            }.start()
        }
        ready.wait()
        let serverPID = server.processIdentifier
        let measuredFrom = ContinuousClock.now + warmUp
        let cpu = Mutex<(start: Double, end: Double)>((0, 0))
        let sampler = Thread {
            Thread.sleep(forTimeInterval: warmUp.seconds)
            cpu.withLock { $0.start = Self.processCPUSeconds(serverPID) }
            Thread.sleep(forTimeInterval: duration.seconds)
            cpu.withLock { $0.end = Self.processCPUSeconds(serverPID) }
        }
        sampler.start()
        let result = try request(port: port, measureFrom: measuredFrom, end: measuredFrom + duration)
        stop.set()
        finished.wait()
        let (start, end) = cpu.withLock { $0 }
        return (result, max(0, end - start) / result.seconds)
    }

    // MARK: - Requesters

    private func request(port: UInt16, measureFrom: ContinuousClock.Instant, end: ContinuousClock.Instant) throws -> LoadResult {
        var merged = try LoadResult.spread(clients: clients, over: max(1, min(threads, clients))) { [self] mine in
            try drive(mine, port: port, measureFrom: measureFrom, end: end)
        }
        merged.seconds = (end - measureFrom).seconds
        return merged
    }

    /// One thread's requesters: each subscribes to its own inbox and keeps `window` requests
    /// in flight; a reply is answered by the next request at once.
    private func drive(_ indexes: [Int], port: UInt16, measureFrom: ContinuousClock.Instant, end: ContinuousClock.Instant) throws -> LoadResult {
        var connections = try indexes.map { index in
            let connection = try NATSConnection(port: port)
            try connection.write(Array("SUB _INBOX.\(index).* 1\r\n".utf8))
            return connection
        }
        defer { connections.forEach { close($0.socket) } }
        let origin = DispatchTime.now().uptimeNanoseconds
        var outgoing: [UInt8] = []
        func queueRequest(_ client: Int) {
            let sentAt = DispatchTime.now().uptimeNanoseconds - origin
            outgoing += Array("PUB bench.echo _INBOX.\(indexes[client]).\(sentAt) \(body.count)\r\n".utf8)
            outgoing += body
            outgoing += [13, 10]
        }
        for client in connections.indices {
            outgoing.removeAll(keepingCapacity: true)
            for _ in 0..<window { queueRequest(client) }
            try connections[client].write(outgoing)
        }
        var result = LoadResult()
        var measuring = false
        var cpuAtStart = 0.0
        var polls = connections.map { pollfd(fd: $0.socket, events: Int16(POLLIN), revents: 0) }
        while true {
            let now = ContinuousClock.now
            if now >= end { break }
            if !measuring && now >= measureFrom {
                measuring = true
                result = LoadResult()
                cpuAtStart = currentThreadCPUSeconds()
            }
            guard poll(&polls, nfds_t(polls.count), 50) >= 0 || errno == EINTR else { throw BenchmarkFailure("poll: \(errno)") }
            for client in connections.indices where polls[client].revents != 0 {
                try connections[client].fill()
                outgoing.removeAll(keepingCapacity: true)
                while let message = connections[client].next() {
                    switch message {
                    case .message(let subject, _, _):
                        if measuring {
                            result.requests += 1
                            let sentAt = UInt64(subject.split(separator: UInt8(ascii: ".")).last.flatMap(NATSConnection.integer) ?? 0)
                            let received = DispatchTime.now().uptimeNanoseconds - origin
                            _ = result.latencyMicros.record(received > sentAt ? (received - sentAt) / 1_000 : 0)
                        }
                        queueRequest(client)
                    case .ping:
                        outgoing += Array("PONG\r\n".utf8)
                    case .error(let text):
                        throw BenchmarkFailure("nats-server: \(text)")
                    case .other:
                        break
                    }
                }
                if !outgoing.isEmpty { try connections[client].write(outgoing) }
            }
        }
        result.generatorCPUSeconds = currentThreadCPUSeconds() - cpuAtStart
        return result
    }

    // MARK: - Responders

    /// An echo responder in queue group `echo`: each request's body goes back to its reply
    /// subject; what one read brings is answered in one write.
    private static func respond(port: UInt16, name: String, ready: DispatchGroup, stop: StopFlag) throws {
        var isReady = false
        defer { if !isReady { ready.leave() } } // failed or stopped first: the run goes on without it
        var connection = try NATSConnection(port: port)
        defer { close(connection.socket) }
        // PING after SUB: the server's PONG says the subscription is in place.
        try connection.write(Array("SUB bench.echo echo 1\r\nPING\r\n".utf8))
        var outgoing: [UInt8] = []
        var item = pollfd(fd: connection.socket, events: Int16(POLLIN), revents: 0)
        while !stop.isSet {
            guard poll(&item, 1, 50) > 0 else { continue }
            try connection.fill()
            outgoing.removeAll(keepingCapacity: true)
            while let message = connection.next() {
                switch message {
                case .message(_, let reply, let payload):
                    guard let reply else { continue }
                    outgoing += Array("PUB ".utf8) + reply + Array(" \(payload.count)\r\n".utf8)
                    outgoing += payload
                    outgoing += [13, 10]
                case .ping:
                    outgoing += Array("PONG\r\n".utf8)
                case .other(let line) where !isReady && line.starts(with: Array("PONG".utf8)):
                    isReady = true
                    ready.leave()
                case .error(let text):
                    throw BenchmarkFailure("nats-server: \(text)")
                case .other:
                    break
                }
            }
            if !outgoing.isEmpty { try connection.write(outgoing) }
        }
    }

    // MARK: - The server process

    private static func waitForListener(port: UInt16) throws {
        for _ in 0..<200 {
            if let connection = try? NATSConnection(port: port) {
                close(connection.socket)
                return
            }
            Thread.sleep(forTimeInterval: 0.025)
        }
        throw BenchmarkFailure("nats-server did not listen on 127.0.0.1:\(port) within 5 s")
    }

    /// A process's CPU time (user and system), in seconds.
    static func processCPUSeconds(_ pid: Int32) -> Double {
        Double(ProcStat(path: "/proc/\(pid)/stat")?.cpuTicks ?? 0) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }
}

/// One client connection to nats-server: a blocking socket, and the bytes read but not yet parsed.
struct NATSConnection {
    let socket: Int32
    /// Bytes read; those in `start..<end` are not parsed yet.
    private var buffer = [UInt8](repeating: 0, count: 256 * 1024)
    private var start = 0
    private var end = 0

    enum Message {
        /// `MSG subject sid [reply] size` and its payload.
        case message(subject: ArraySlice<UInt8>, reply: ArraySlice<UInt8>?, payload: ArraySlice<UInt8>)
        case ping
        case error(String)
        case other(ArraySlice<UInt8>)
    }

    init(port: UInt16) throws {
        socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in(
            sin_family: sa_family_t(AF_INET), sin_port: port.bigEndian, sin_addr: in_addr(s_addr: inet_addr("127.0.0.1")), sin_zero: (0, 0, 0, 0, 0, 0, 0, 0))
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(socket, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
        guard connected else {
            close(socket)
            throw BenchmarkFailure("could not connect to nats-server on port \(port): errno \(errno)")
        }
        var one: Int32 = 1
        setsockopt(socket, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        try write(Array("CONNECT {\"verbose\":false,\"pedantic\":false,\"echo\":false}\r\n".utf8))
    }

    /// Writes all of `bytes`.
    func write(_ bytes: [UInt8]) throws {
        var sent = 0
        while sent < bytes.count {
            let count = bytes[sent...].withUnsafeBytes { Glibc.send(socket, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if count < 0 {
                if errno == EINTR { continue }
                throw BenchmarkFailure("send to nats-server: errno \(errno)")
            }
            sent += count
        }
    }

    /// Reads what is waiting (one `recv`), after the bytes not parsed yet.
    mutating func fill() throws {
        if start > 0 { // what is left moves to the front
            buffer.withUnsafeMutableBytes { raw in
                if end > start { memmove(raw.baseAddress!, raw.baseAddress! + start, end - start) }
            }
            end -= start
            start = 0
        }
        if end == buffer.count { buffer += [UInt8](repeating: 0, count: buffer.count) } // one message larger than the buffer
        let count = buffer.withUnsafeMutableBytes { raw in recv(socket, raw.baseAddress! + end, raw.count - end, 0) }
        if count == 0 { throw BenchmarkFailure("nats-server closed the connection") }
        if count < 0 {
            if errno == EINTR || errno == EAGAIN { return }
            throw BenchmarkFailure("recv from nats-server: errno \(errno)")
        }
        end += count
    }

    /// The next whole message read, if one is.
    mutating func next() -> Message? {
        guard let lineEnd = crlf(from: start) else { return nil }
        let line = buffer[start..<lineEnd]
        if line.starts(with: Self.msg) {
            let fields = line.split(separator: UInt8(ascii: " "))
            guard fields.count == 4 || fields.count == 5, let size = Self.integer(fields[fields.count - 1]) else {
                start = lineEnd + 2
                return .error("a MSG line this client cannot read")
            }
            let payloadStart = lineEnd + 2
            guard end >= payloadStart + size + 2 else { return nil } // the payload is still coming
            start = payloadStart + size + 2
            return .message(subject: fields[1], reply: fields.count == 5 ? fields[3] : nil, payload: buffer[payloadStart..<(payloadStart + size)])
        }
        start = lineEnd + 2
        if line.elementsEqual("PING".utf8) { return .ping }
        if line.starts(with: Array("-ERR".utf8)) { return .error(String(decoding: line, as: UTF8.self)) }
        return .other(line)
    }

    private static let msg = Array("MSG ".utf8)

    /// A decimal number's value.
    static func integer(_ digits: ArraySlice<UInt8>) -> Int? {
        guard !digits.isEmpty, digits.count < 19 else { return nil }
        var value = 0
        for digit in digits {
            guard (48...57).contains(digit) else { return nil }
            value = value * 10 + Int(digit - 48)
        }
        return value
    }

    private func crlf(from index: Int) -> Int? {
        var index = index
        while index + 1 < end {
            if buffer[index] == 13 && buffer[index + 1] == 10 { return index }
            index += 1
        }
        return nil
    }
}
