import CZeroMQ
import Glibc
import Synchronization

/// A queue other threads and tasks post to, read by the one thread that owns a socket.
///
/// Posting wakes the owner through an eventfd it polls next to its sockets, so nothing
/// shares a socket and nobody busy-waits. Thread-safe.
public final class Mailbox<Message: Sendable>: Sendable {
    private let queue = Mutex<[Message]>([])
    /// The eventfd the owner polls.
    public let fileDescriptor: Int32

    /// Makes an empty mailbox.
    public init() {
        fileDescriptor = eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))
        precondition(fileDescriptor >= 0, "eventfd failed: errno \(errno)")
    }

    deinit { Glibc.close(fileDescriptor) }

    /// Adds a message and wakes the owner if it may be asleep.
    public func post(_ message: Message) {
        let wasEmpty = queue.withLock { queue in
            queue.append(message)
            return queue.count == 1
        }
        if wasEmpty {
            var one: UInt64 = 1
            _ = Glibc.write(fileDescriptor, &one, 8)
        }
    }

    /// Takes every waiting message, oldest first. Called by the owner only.
    public func drain() -> [Message] {
        var counter: UInt64 = 0
        _ = Glibc.read(fileDescriptor, &counter, 8)
        return queue.withLock { queue in
            guard !queue.isEmpty else { return [] }
            var taken: [Message] = []
            swap(&taken, &queue)
            return taken
        }
    }
}
