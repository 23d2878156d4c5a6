import CZeroMQ
import CanopyMessages
import Dispatch
import Foundation
import Glibc
import Synchronization

// MARK: - Errors

/// A libzmq call failed.
public struct ZMQError: Error, CustomStringConvertible, Sendable {
    /// The C function that failed.
    public var call: String
    /// The `errno` it left.
    public var code: Int32

    init(_ call: String, code: Int32 = zmq_errno()) {
        self.call = call
        self.code = code
    }

    public var description: String {
        "\(call) failed: \(String(cString: zmq_strerror(code))) (errno \(code))"
    }
}

// MARK: - Context

/// A libzmq context: owns the I/O threads. Thread-safe; share one per process.
public final class ZMQContext: @unchecked Sendable {
    let handle: UnsafeMutableRawPointer
    /// Its libzmq I/O threads (``ZMQSocket/pin(toIOThread:)`` picks among them).
    public let ioThreads: Int32

    /// - Parameter ioThreads: libzmq I/O threads; one moves about a gigabyte a second.
    public init(ioThreads: Int32 = 1) {
        precondition(ioThreads >= 1 && ioThreads <= 64, "\(ioThreads) I/O threads")
        self.ioThreads = ioThreads
        guard let handle = zmq_ctx_new() else {
            preconditionFailure("zmq_ctx_new failed: \(ZMQError("zmq_ctx_new"))")
        }
        zmq_ctx_set(handle, ZMQ_IO_THREADS, ioThreads)
        zmq_ctx_set(handle, ZMQ_MAX_SOCKETS, 65_536)
        self.handle = handle
    }

    /// How long ending the context waits for its I/O threads before it lets them go.
    static let termGrace: Double = 2

    deinit {
        // Sockets are closed by their owners; a socket left open would make this block, and
        // so would an I/O thread stuck in the resolver (a broker's name that hangs): past
        // ``termGrace`` the termination finishes on its own thread, and a process that
        // exits meanwhile ends it (SIGTERM is never held up by a hanging lookup).
        zmq_ctx_shutdown(handle)
        let address = Int(bitPattern: handle)
        let ended = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            zmq_ctx_term(UnsafeMutableRawPointer(bitPattern: address))
            ended.signal()
        }
        _ = ended.wait(timeout: .now() + Self.termGrace)
    }
}

// MARK: - Socket

/// The socket types the bus uses.
public enum ZMQSocketType: Int32, Sendable {
    case pair = 0
    case req = 3
    case rep = 4
    case router = 6
    case dealer = 5
    case pull = 7
    case push = 8
}

/// A libzmq socket.
///
/// **Not thread-safe.** One owner only: a socket is created, used and closed by one thread
/// (the bus runs each socket inside its own loop thread); other code talks to that owner
/// through a ``Mailbox``.
public final class ZMQSocket {
    /// The libzmq socket, for calls the binding does not wrap (such as `zmq_proxy`); same single owner.
    public let handle: UnsafeMutableRawPointer
    private var isClosed = false
    /// Its context's I/O threads.
    private let ioThreads: Int32

    /// Opens a socket of `type` in `context`, with linger 0 so closing never blocks.
    public init(_ context: ZMQContext, type: ZMQSocketType) throws {
        guard let handle = zmq_socket(context.handle, type.rawValue) else {
            throw ZMQError("zmq_socket")
        }
        self.handle = handle
        self.ioThreads = context.ioThreads
        try set(ZMQ_LINGER, 0)
    }

    /// Puts the connections this socket makes from now on in I/O thread `index` of its
    /// context (modulo their number), alone there when each index is used once: libzmq
    /// resolves a `tcp://NAME:PORT` endpoint synchronously in that thread (at each connect
    /// and reconnect), so a name that hangs in the resolver stalls only the sockets pinned
    /// beside it, not every connection of the process. Call before ``connect(_:)``.
    public func pin(toIOThread index: Int) throws {
        var mask = UInt64(1) << UInt64(index % Int(ioThreads))
        guard zmq_setsockopt(handle, ZMQ_AFFINITY, &mask, MemoryLayout<UInt64>.size) == 0 else { throw ZMQError("zmq_setsockopt ZMQ_AFFINITY") }
    }

    deinit { close() }

    /// Closes the socket; messages not yet sent are dropped.
    public func close() {
        guard !isClosed else { return }
        isClosed = true
        zmq_close(handle)
    }

    /// Binds to an endpoint such as `tcp://127.0.0.1:*`.
    public func bind(_ endpoint: String) throws {
        guard zmq_bind(handle, endpoint) == 0 else { throw ZMQError("zmq_bind \(endpoint)") }
    }

    /// Connects to an endpoint; libzmq reconnects by itself when the peer goes away.
    public func connect(_ endpoint: String) throws {
        guard zmq_connect(handle, endpoint) == 0 else { throw ZMQError("zmq_connect \(endpoint)") }
    }

    /// The endpoint last bound, with the port the system chose for `*`.
    public var lastEndpoint: String {
        var buffer = [CChar](repeating: 0, count: 512)
        var size = buffer.count
        zmq_getsockopt(handle, ZMQ_LAST_ENDPOINT, &buffer, &size)
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    // MARK: Options

    /// Sets an integer socket option.
    public func set(_ option: Int32, _ value: Int32) throws {
        var value = value
        guard zmq_setsockopt(handle, option, &value, MemoryLayout<Int32>.size) == 0 else {
            throw ZMQError("zmq_setsockopt \(option)")
        }
    }

    /// Sets a 64-bit integer socket option (`ZMQ_MAXMSGSIZE`).
    public func set64(_ option: Int32, _ value: Int64) throws {
        var value = value
        guard zmq_setsockopt(handle, option, &value, MemoryLayout<Int64>.size) == 0 else {
            throw ZMQError("zmq_setsockopt \(option)")
        }
    }

    /// Sets a text socket option (CURVE keys as Z85, the ZAP domain); values never appear in errors.
    func setText(_ option: Int32, _ value: String) throws {
        let rc = value.withCString { zmq_setsockopt(handle, option, $0, strlen($0) + (option == ZMQ_ZAP_DOMAIN ? 0 : 1)) }
        guard rc == 0 else { throw ZMQError("zmq_setsockopt \(option)") }
    }

    /// Sets the send and receive high-water marks (messages queued per peer).
    public func setHighWaterMarks(_ messages: Int32) throws {
        try set(ZMQ_SNDHWM, messages)
        try set(ZMQ_RCVHWM, messages)
    }

    /// Turns on ZMTP heartbeats: a peer that answers no PING within `timeout` is disconnected.
    public func setHeartbeats(interval: Duration, timeout: Duration) throws {
        try set(ZMQ_HEARTBEAT_IVL, Int32(interval.wholeMilliseconds))
        try set(ZMQ_HEARTBEAT_TIMEOUT, Int32(timeout.wholeMilliseconds))
        try set(ZMQ_HEARTBEAT_TTL, Int32(min(timeout.wholeMilliseconds, 6_553_500)))
    }

    /// Frames larger than this make libzmq drop the connection (the hard memory guard).
    public func setMaximumMessageSize(_ bytes: Int) throws {
        try set64(ZMQ_MAXMSGSIZE, Int64(bytes))
    }

    /// Announces the stack this socket belongs to in its connections' handshake (ZMTP
    /// metadata `X-Canopy-Stack`), which the peer reads off every message it receives (see
    /// ``PeerProperties``). Set before connecting or binding.
    public func announceStack(_ stack: String) throws {
        // ZMQ_METADATA (95) is in libzmq 4.3's draft section of zmq.h; Debian's libzmq takes it.
        let rc = "\(PeerProperties.stackName):\(stack)".withCString { zmq_setsockopt(handle, 95, $0, strlen($0)) }
        guard rc == 0 else { throw ZMQError("zmq_setsockopt ZMQ_METADATA (this libzmq may lack it; 4.3.2 or newer takes it)") }
    }

    // MARK: Sending and receiving

    /// Sends a multipart message; all frames arrive together or not at all.
    ///
    /// - Returns: `false` when the message could not be queued now (`EAGAIN` with
    ///   `dontWait`, or an unroutable ROUTER peer); the message is then dropped.
    @discardableResult
    public func send(_ frames: [[UInt8]], dontWait: Bool = true) throws -> Bool {
        let base = dontWait ? ZMQ_DONTWAIT : 0
        let last = frames.count - 1
        // Borrowing the frames in place: no retain and release of every frame's storage.
        return try frames.withUnsafeBufferPointer { frames in
            for index in frames.indices where try !sendFrame(frames[index], flags: index == last ? base : base | ZMQ_SNDMORE) {
                return false
            }
            return true
        }
    }

    /// Sends an envelope frame (a ROUTER peer's identity) followed by `frames`.
    @discardableResult
    public func send(to identity: [UInt8], _ frames: [[UInt8]]) throws -> Bool {
        guard try sendFrame(identity, flags: ZMQ_DONTWAIT | ZMQ_SNDMORE) else { return false }
        return try send(frames)
    }

    /// Frames at least this large are handed to libzmq without copying (see
    /// ``sendFrameWithoutCopy(_:flags:ticket:)``); smaller ones are cheaper to copy than to hand over.
    static let zeroCopyBytes = 4096

    /// Sends one part of a multipart message without waiting: `more` on every part but the
    /// last. Frames from ``zeroCopyBytes`` up go without copying.
    ///
    /// - Returns: `false` when the part could not be queued (`EAGAIN`, or an unroutable
    ///   ROUTER peer on the first part); send no more parts of that message then.
    public func sendPart(_ frame: [UInt8], more: Bool) throws(ZMQError) -> Bool {
        try sendFrame(frame, flags: more ? ZMQ_DONTWAIT | ZMQ_SNDMORE : ZMQ_DONTWAIT)
    }

    /// Sends one part of a multipart message from bytes valid only during the call (copied).
    /// See ``sendPart(_:more:)``.
    public func sendPart(bytes: UnsafeRawBufferPointer, more: Bool) throws(ZMQError) -> Bool {
        try Self.sent(attemptSend(bytes, flags: more ? ZMQ_DONTWAIT | ZMQ_SNDMORE : ZMQ_DONTWAIT))
    }

    /// Sends a message's last part without copying it, carrying `ticket` until libzmq lets
    /// the message go: written to the connection, or dropped with it (a peer that went away).
    /// So the ticket's counts say how many bytes wait in libzmq for a peer that reads slowly.
    ///
    /// - Returns: `false` when the part could not be queued (the ticket is let go at once).
    public func sendLastPart(_ frame: [UInt8], ticket: SendTicket) throws(ZMQError) -> Bool {
        try sendFrameWithoutCopy(frame, flags: ZMQ_DONTWAIT, ticket: ticket)
    }

    private func sendFrame(_ frame: borrowing [UInt8], flags: Int32) throws(ZMQError) -> Bool {
        if frame.count >= Self.zeroCopyBytes { return try sendFrameWithoutCopy(copy frame, flags: flags) }
        return try Self.sent(frame.withUnsafeBytes { attemptSend($0, flags: flags) })
    }

    /// Copies `bytes` into one part; 0 when queued, else the `errno` (never `EINTR`).
    private func attemptSend(_ bytes: UnsafeRawBufferPointer, flags: Int32) -> Int32 {
        while true {
            if zmq_send(handle, bytes.baseAddress, bytes.count, flags) >= 0 { return 0 }
            let code = zmq_errno()
            if code != EINTR { return code }
        }
    }

    /// Whether a send's outcome (`0` or an `errno`) queued the part: `false` for the ones
    /// that drop a message (`EAGAIN`, `EHOSTUNREACH`), thrown for the rest.
    private static func sent(_ code: Int32) throws(ZMQError) -> Bool {
        switch code {
        case 0: return true
        case EAGAIN, EHOSTUNREACH: return false
        default: throw ZMQError("zmq_send", code: code)
        }
    }

    /// Sends a large frame without copying its bytes: the message points into the array's
    /// storage, which a retained keeper holds alive (and, being shared, unchanged) until
    /// libzmq's I/O thread has written it and calls the free function. A message's ticket is
    /// that keeper itself (one object a reply, not two); other frames get a ``SentFrame``.
    private func sendFrameWithoutCopy(_ frame: [UInt8], flags: Int32, ticket: SendTicket? = nil) throws(ZMQError) -> Bool {
        let hint: UnsafeMutableRawPointer
        let release: @convention(c) (UnsafeMutableRawPointer?, UnsafeMutableRawPointer?) -> Void
        if let ticket {
            ticket.frame = frame
            hint = Unmanaged.passRetained(ticket).toOpaque()
            release = { _, hint in Unmanaged<SendTicket>.fromOpaque(hint!).takeRetainedValue().released() }
        } else {
            hint = Unmanaged.passRetained(SentFrame(frame)).toOpaque()
            release = { _, hint in Unmanaged<SentFrame>.fromOpaque(hint!).release() }
        }
        // An empty frame has no storage: libzmq takes a null pointer with size 0. The pointer is
        // into the storage the keeper's copy shares.
        let data = frame.withUnsafeBytes { $0.baseAddress.map { UnsafeMutableRawPointer(mutating: $0) } }
        var message = zmq_msg_t()
        guard zmq_msg_init_data(&message, data, frame.count, release, hint) == 0 else {
            release(data, hint)
            throw ZMQError("zmq_msg_init_data", code: zmq_errno())
        }
        while true {
            if zmq_msg_send(&message, handle, flags) >= 0 { return true } // libzmq owns the message now
            let code = zmq_errno()
            if code == EINTR { continue }
            zmq_msg_close(&message) // not sent: gives the storage back through `release`
            return try Self.sent(code)
        }
    }

    /// Receives one whole multipart message, frames of any size arriving whole.
    ///
    /// - Returns: `nil` when nothing is waiting and `dontWait` is set.
    public func receive(dontWait: Bool = true) throws -> [[UInt8]]? {
        var properties = PeerProperties()
        return try receive(dontWait: dontWait, reading: [], properties: &properties)
    }

    /// Receives one whole multipart message and what its connection announced: the User-Id
    /// it authenticated with and the stack it belongs to, as far as `reading` asks.
    public func receive(dontWait: Bool = true, reading: PeerProperties.Names, properties: inout PeerProperties) throws -> [[UInt8]]? {
        var frames: [[UInt8]] = []
        frames.reserveCapacity(8)
        var noIdentity: [UInt8]?
        properties = PeerProperties()
        return try receive(dontWait: dontWait, reading: reading, properties: &properties, identity: &noIdentity, into: &frames) ? frames : nil
    }

    /// Receives one message on a ROUTER socket: the peer's routing identity into `identity`
    /// and the rest into `frames` (emptied first, its storage kept, so a loop that receives
    /// message after message allocates no new outer array), and the connection's properties
    /// `reading` names into `properties`.
    ///
    /// - Returns: `false` when nothing is waiting.
    public func receiveRouted(
        identity: inout [UInt8], frames: inout [[UInt8]], reading: PeerProperties.Names = [],
        properties: inout PeerProperties
    ) throws -> Bool {
        frames.removeAll(keepingCapacity: true)
        properties = PeerProperties()
        var routing: [UInt8]? = []
        guard try receive(dontWait: true, reading: reading, properties: &properties, identity: &routing, into: &frames) else { return false }
        identity = routing ?? []
        return true
    }

    /// Receives one message's frames into `frames`; when `identity` is not `nil`, the first
    /// frame (a ROUTER's routing identity) goes there instead.
    private func receive(
        dontWait: Bool, reading: PeerProperties.Names, properties: inout PeerProperties, identity: inout [UInt8]?,
        into frames: inout [[UInt8]]
    ) throws -> Bool {
        var wantsIdentity = identity != nil
        var message = zmq_msg_t()
        zmq_msg_init(&message)
        defer { zmq_msg_close(&message) }
        var flags = dontWait ? ZMQ_DONTWAIT : 0
        var unread = reading
        while true {
            let rc = zmq_msg_recv(&message, handle, flags)
            if rc < 0 {
                let code = zmq_errno()
                if code == EINTR { continue }
                if code == EAGAIN && frames.isEmpty && (identity == nil || identity!.isEmpty) { return false }
                throw ZMQError("zmq_msg_recv", code: code)
            }
            // A ROUTER's identity frame carries no metadata: the properties come from the next.
            if !unread.isEmpty && !wantsIdentity {
                if unread.contains(.userID), let property = zmq_msg_gets(&message, "User-Id"), property.pointee != 0 {
                    properties.userID = String(cString: property)
                }
                if unread.contains(.stack), let property = zmq_msg_gets(&message, PeerProperties.stackName), property.pointee != 0 {
                    properties.stack = String(cString: property)
                }
                unread = [] // one connection's properties are the same on every frame of it
            }
            let count = zmq_msg_size(&message)
            let frame: [UInt8] = count == 0 ? [] : Array(UnsafeBufferPointer(start: zmq_msg_data(&message)!.assumingMemoryBound(to: UInt8.self), count: count))
            if wantsIdentity {
                identity = frame
                wantsIdentity = false
            } else {
                frames.append(frame)
            }
            guard zmq_msg_more(&message) != 0 else { return true }
            flags = 0 // the rest of a multipart message is already here
        }
    }

    /// Asks libzmq to report this socket's connection events on an inproc PAIR endpoint.
    public func monitor(_ endpoint: String, events: Int32) throws {
        guard zmq_socket_monitor(handle, endpoint, events) == 0 else { throw ZMQError("zmq_socket_monitor") }
    }
}

// MARK: - Polling

/// Waits on sockets and file descriptors without busy looping (`zmq_poll`).
///
/// Owned by the same thread that owns the sockets.
public struct Poller {
    private var items: [zmq_pollitem_t] = []

    /// An empty poller.
    public init() {}

    /// Adds a socket to wait on for incoming messages; returns its index.
    @discardableResult
    public mutating func add(_ socket: ZMQSocket) -> Int {
        items.append(zmq_pollitem_t(socket: socket.handle, fd: 0, events: Int16(ZMQ_POLLIN), revents: 0))
        return items.count - 1
    }

    /// Adds a file descriptor (an eventfd) to wait on; returns its index.
    @discardableResult
    public mutating func add(fileDescriptor: Int32) -> Int {
        items.append(zmq_pollitem_t(socket: nil, fd: fileDescriptor, events: Int16(ZMQ_POLLIN), revents: 0))
        return items.count - 1
    }

    /// Removes every item.
    public mutating func removeAll() { items.removeAll() }

    /// Waits until an item is readable or `timeout` passes (`nil`: forever).
    public mutating func poll(timeout: Duration?) throws {
        let milliseconds = timeout.map { Int($0.wholeMilliseconds) + ($0 > .zero && $0.wholeMilliseconds == 0 ? 1 : 0) } ?? -1
        let rc = items.withUnsafeMutableBufferPointer { zmq_poll($0.baseAddress, Int32($0.count), milliseconds) }
        if rc < 0 && zmq_errno() != EINTR { throw ZMQError("zmq_poll") }
    }

    /// Whether the item at `index` was readable after the last ``poll(timeout:)``.
    public func isReadable(_ index: Int) -> Bool {
        items[index].revents & Int16(ZMQ_POLLIN) != 0
    }
}

/// Keeps a frame sent without copying alive until libzmq is done with it.
private final class SentFrame {
    let bytes: [UInt8]
    init(_ bytes: [UInt8]) { self.bytes = bytes }
}

/// A number of bytes counted from more than one thread: what waits in libzmq for one peer,
/// or for all of them.
public final class ByteCount: Sendable {
    private let value = Atomic<Int>(0)

    public init() {}

    /// The bytes counted now.
    public var bytes: Int { value.load(ordering: .relaxed) }

    fileprivate func add(_ bytes: Int) { value.add(bytes, ordering: .relaxed) }
    fileprivate func subtract(_ bytes: Int) { value.subtract(bytes, ordering: .relaxed) }
}

/// One message's bytes, added to its counts while libzmq holds the message: the ticket rides
/// on the message's last frame (``ZMQSocket/sendLastPart(_:ticket:)``), and when libzmq frees
/// that frame (the whole message is written, or was dropped with its connection) or the
/// ticket is let go unsent, the bytes are taken off again (on whichever thread that is).
///
/// A ticket from a ``TicketPool`` goes back to it once libzmq lets its message go, and is
/// handed out again: a broker sends a ticketed reply per request, and one object allocated
/// and freed a reply was a sixth of its loop thread's heap allocations. Its fields change
/// hands with the ticket (the sending thread, then libzmq's I/O thread through libzmq's
/// queue, then the pool's lock), never shared: hence `@unchecked Sendable`.
public final class SendTicket: @unchecked Sendable {
    private var bytes = 0
    private var peer: ByteCount?
    private var all: ByteCount?
    /// Where it goes back to; weak, so an idle pool's tickets keep nothing alive.
    private weak var pool: TicketPool?
    /// The last frame, kept alive while libzmq sends it without a copy: set by the sending
    /// thread before libzmq has the message, let go when libzmq does.
    fileprivate var frame: [UInt8] = []

    /// Counts `bytes` in `peer` and `all` until the ticket is let go.
    public convenience init(bytes: Int, peer: ByteCount, all: ByteCount) {
        self.init(pool: nil)
        count(bytes, peer: peer, all: all)
    }

    fileprivate init(pool: TicketPool?) {
        self.pool = pool
    }

    fileprivate func count(_ bytes: Int, peer: ByteCount, all: ByteCount) {
        self.bytes = bytes
        self.peer = peer
        self.all = all
        peer.add(bytes)
        all.add(bytes)
    }

    /// libzmq let the message go: the bytes come off, and a pooled ticket goes back.
    fileprivate func released() {
        uncount()
        frame = []
        pool?.put(self)
    }

    private func uncount() {
        peer?.subtract(bytes)
        all?.subtract(bytes)
        (peer, all, bytes) = (nil, nil, 0)
    }

    deinit { uncount() } // let go unsent (its message was dropped before its last frame)
}

/// Tickets used again (``SendTicket``): at most `limit` idle ones are kept (about 100 bytes
/// each); past that, a returned ticket is freed.
public final class TicketPool: Sendable {
    private let idle = Mutex<[SendTicket]>([])
    public let limit: Int

    public init(limit: Int = 4_096) {
        self.limit = limit
    }

    /// A ticket counting `bytes` in `peer` and `all` until libzmq lets its message go: an idle
    /// one when there is one, else a new one.
    public func ticket(bytes: Int, peer: ByteCount, all: ByteCount) -> SendTicket {
        let ticket = idle.withLock { $0.popLast() } ?? SendTicket(pool: self)
        ticket.count(bytes, peer: peer, all: all)
        return ticket
    }

    /// Idle tickets now.
    public var idleCount: Int { idle.withLock { $0.count } }

    fileprivate func put(_ ticket: SendTicket) {
        idle.withLock { if $0.count < limit { $0.append(ticket) } }
    }
}

/// What a peer's connection says about it, read off the messages it sends: the User-Id its
/// CurveZMQ handshake authenticated (the ZAP handler's answer: its public key), and the stack
/// it announced (``ZMQSocket/announceStack(_:)``).
public struct PeerProperties: Sendable, Equatable {
    /// The ZMTP metadata property that carries a stack's id.
    public static let stackName = "X-Canopy-Stack"

    /// Which properties to read.
    public struct Names: OptionSet, Sendable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }
        public static let userID = Names(rawValue: 1)
        public static let stack = Names(rawValue: 2)
    }

    /// The CURVE public key (Z85) the connection authenticated with.
    public var userID: String?
    /// The stack the peer announced.
    public var stack: String?

    public init(userID: String? = nil, stack: String? = nil) {
        self.userID = userID
        self.stack = stack
    }
}
