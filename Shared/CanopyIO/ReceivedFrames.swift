import CZeroMQ
import CanopyWire
import Glibc

/// The frames of the message a ROUTER socket received last, held as libzmq's own messages
/// and read in place: receiving copies nothing into Swift arrays, and the decoder copies only
/// what it keeps (a request's correlation id and body). One per loop, reused for every
/// message; its frames are valid until the next ``ZMQSocket/receiveRouted(into:identity:reading:properties:)``
/// or ``release()``. For the loop thread that owns the socket only. Its reads are
/// `@inlinable`, so the decoder specialized for it in the broker reads frames directly.
public final class ReceivedFrames: FrameList {
    // Unchecked exclusivity: one thread uses it, and the runtime's check on every access
    // showed in the broker's profile.
    @usableFromInline @exclusivity(unchecked) var messages: UnsafeMutablePointer<zmq_msg_t>
    @usableFromInline @exclusivity(unchecked) var capacity: Int
    /// Frames of the message received last (the routing identity not among them).
    @exclusivity(unchecked) public fileprivate(set) var count = 0
    /// Slots that may hold a frame's data (closed by ``release()``).
    @exclusivity(unchecked) private var used = 0
    /// Frames of the message received last beyond ``maximumFrames``: read and let go, so the
    /// holder stays bounded whatever a peer sends (the message is to be refused whole).
    @exclusivity(unchecked) public fileprivate(set) var dropped = 0

    /// The most frames kept of one message: more than any canopy/3 message has (7 and 64
    /// attachments) or a Majordomo one needs.
    public static let maximumFrames = 128

    public init(capacity: Int = 16) {
        self.capacity = max(1, capacity)
        messages = .allocate(capacity: self.capacity)
        for index in 0..<self.capacity { zmq_msg_init(messages + index) }
    }

    deinit {
        for index in 0..<capacity { zmq_msg_close(messages + index) }
        messages.deallocate()
    }

    @inlinable
    public func byteCount(_ index: Int) -> Int {
        precondition(index < count, "frame \(index) of \(count)")
        return zmq_msg_size(messages + index)
    }

    @inlinable
    public func withFrame<R>(_ index: Int, _ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        precondition(index < count, "frame \(index) of \(count)")
        let size = zmq_msg_size(messages + index)
        return try body(UnsafeRawBufferPointer(start: size == 0 ? nil : zmq_msg_data(messages + index), count: size))
    }

    @inlinable
    public func array(_ index: Int) -> [UInt8] {
        withFrame(index) { $0.isEmpty ? [] : Array($0) }
    }

    /// Gives the frames' memory back to libzmq (a large attachment is not held until the
    /// next message of as many frames).
    public func release() {
        for index in 0..<used {
            zmq_msg_close(messages + index)
            zmq_msg_init(messages + index)
        }
        used = 0
        count = 0
    }

    /// The slot for frame `index`, growing the buffer when a message has more frames.
    fileprivate func slot(_ index: Int) -> UnsafeMutablePointer<zmq_msg_t> {
        if index >= capacity {
            let grown = UnsafeMutablePointer<zmq_msg_t>.allocate(capacity: capacity * 2)
            grown.moveInitialize(from: messages, count: capacity) // a zmq_msg_t may be moved bitwise while no call uses it
            for added in capacity..<(capacity * 2) { zmq_msg_init(grown + added) }
            messages.deallocate()
            messages = grown
            capacity *= 2
        }
        used = max(used, index + 1)
        return messages + index
    }
}

extension ZMQSocket {
    /// Receives one message from a ROUTER socket without waiting, into `frames`, read in
    /// place. The routing identity goes to `identity`, whose storage is reused (no allocation)
    /// unless another holds it; `properties` keeps its strings while the connection's
    /// properties are the same.
    ///
    /// - Returns: false when no message was waiting.
    public func receiveRouted(
        into frames: ReceivedFrames, identity: inout [UInt8], reading: PeerProperties.Names = [],
        properties: inout PeerProperties
    ) throws -> Bool {
        var routing = zmq_msg_t()
        zmq_msg_init(&routing)
        defer { zmq_msg_close(&routing) }
        while zmq_msg_recv(&routing, handle, ZMQ_DONTWAIT) < 0 {
            let code = zmq_errno()
            if code == EINTR { continue }
            if code == EAGAIN { return false }
            throw ZMQError("zmq_msg_recv", code: code)
        }
        let size = zmq_msg_size(&routing)
        let same = identity.count == size && (size == 0 || identity.withUnsafeBytes { memcmp($0.baseAddress!, zmq_msg_data(&routing), size) == 0 })
        if !same { // into the same storage when no one else holds it: no allocation
            identity.removeAll(keepingCapacity: true)
            if size > 0 { identity.append(contentsOf: UnsafeRawBufferPointer(start: zmq_msg_data(&routing), count: size)) }
        }
        var unread = reading
        var index = 0
        var more = zmq_msg_more(&routing) != 0
        frames.dropped = 0
        while more {
            if index == ReceivedFrames.maximumFrames {
                try drain(counting: frames)
                break
            }
            let message = frames.slot(index)
            while zmq_msg_recv(message, handle, 0) < 0 { // the rest of a multipart message is already here
                let code = zmq_errno()
                if code == EINTR { continue }
                frames.count = index
                throw ZMQError("zmq_msg_recv", code: code)
            }
            // A ROUTER's identity frame carries no metadata: the properties come from the next.
            if !unread.isEmpty {
                if unread.contains(.userID) { Self.keep(zmq_msg_gets(message, "User-Id"), in: &properties.userID) }
                if unread.contains(.stack) { Self.keep(zmq_msg_gets(message, PeerProperties.stackName), in: &properties.stack) }
                unread = [] // one connection's properties are the same on every frame of it
            }
            more = zmq_msg_more(message) != 0
            index += 1
        }
        frames.count = index
        return true
    }

    /// Reads the rest of a message past ``ReceivedFrames/maximumFrames`` into one scratch
    /// message and lets it go, counting the frames in `frames.dropped`.
    private func drain(counting frames: ReceivedFrames) throws {
        var scratch = zmq_msg_t()
        zmq_msg_init(&scratch)
        defer { zmq_msg_close(&scratch) }
        var more = true
        while more {
            while zmq_msg_recv(&scratch, handle, 0) < 0 {
                let code = zmq_errno()
                if code == EINTR { continue }
                throw ZMQError("zmq_msg_recv", code: code)
            }
            frames.dropped += 1
            more = zmq_msg_more(&scratch) != 0
        }
    }

    /// Sets `value` to the C string `property` (nil when absent or empty), keeping the string
    /// it holds when it is the same text.
    private static func keep(_ property: UnsafePointer<CChar>?, in value: inout String?) {
        guard let property, property.pointee != 0 else {
            value = nil
            return
        }
        if let current = value,
            current.utf8.withContiguousStorageIfAvailable({ stored in
                stored.count == strlen(property) && memcmp(stored.baseAddress!, property, stored.count) == 0
            }) == true
        {
            return
        }
        value = String(cString: property)
    }
}
