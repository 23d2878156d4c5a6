import CZeroMQ
import Glibc
import Synchronization

/// A queue other threads and tasks post to, read by the one thread that owns a socket.
///
/// Posting wakes the owner through an eventfd it polls next to its sockets, so nothing
/// shares a socket and nobody busy-waits. Thread-safe.
public final class Mailbox<Message: Sendable>: Sendable {
    private struct State {
        var queue: [Message] = []
        var closed = false
    }

    private let state = Mutex(State())
    /// The eventfd the owner polls.
    public let fileDescriptor: Int32

    /// Makes an empty mailbox.
    public init() {
        fileDescriptor = eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))
        precondition(fileDescriptor >= 0, "eventfd failed: errno \(errno)")
    }

    deinit { Glibc.close(fileDescriptor) }

    /// Adds a message and wakes the owner if it may be asleep.
    ///
    /// - Returns: `false` when the mailbox is closed: the owner is gone and the message was
    ///   not taken.
    @discardableResult
    public func post(_ message: Message) -> Bool {
        let outcome: Bool? = state.withLock { state in
            guard !state.closed else { return nil }
            state.queue.append(message)
            return state.queue.count == 1
        }
        guard let wasEmpty = outcome else { return false }
        if wasEmpty {
            var one: UInt64 = 1
            _ = Glibc.write(fileDescriptor, &one, 8)
        }
        return true
    }

    /// Refuses further posts and returns what was still waiting. Called by the owner when it
    /// stops, so nothing posted is silently lost.
    public func close() -> [Message] {
        state.withLock { state in
            state.closed = true
            var taken: [Message] = []
            swap(&taken, &state.queue)
            return taken
        }
    }

    /// Takes every waiting message, oldest first. Called by the owner only.
    public func drain() -> [Message] {
        var counter: UInt64 = 0
        _ = Glibc.read(fileDescriptor, &counter, 8)
        return state.withLock { state in
            guard !state.queue.isEmpty else { return [] }
            var taken: [Message] = []
            swap(&taken, &state.queue)
            return taken
        }
    }
}
