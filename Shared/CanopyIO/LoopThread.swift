import CZeroMQ
import Foundation
import ServiceLifecycle

/// Runs a blocking socket loop on a thread of its own, so a ZeroMQ socket has exactly one
/// owner and no Swift concurrency thread is blocked in `zmq_poll`.
package enum LoopThread {
    /// Starts `body` on a new thread named `name` and returns without waiting.
    package static func start(name: String, _ body: @escaping @Sendable () -> Void) {
        let thread = Thread {
            canopy_name_thread(String(name.prefix(15))) // shows in top and perf
            body()
        }
        thread.name = name
        thread.stackSize = 1 << 20
        thread.start()
    }

    /// Runs `body` on a new thread and waits for it to finish, rethrowing what it throws.
    package static func run(name: String, _ body: @escaping @Sendable () throws -> Void) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, Error>) in
            start(name: name) {
                do {
                    try body()
                    continuation.resume()
                } catch {
                    continuation.resume(throwing: error)
                }
            }
        }
    }

    /// Runs a socket loop as a service's `run()`: `body` on a thread of its own until it
    /// returns, and `stop` (which asks the loop to end, as SIGTERM does) on graceful shutdown
    /// and on cancellation too, so a loop never outlives its service group (the group cancels
    /// its services when one of them fails, such as a listener whose port is taken).
    package static func serve(name: String, stop: @escaping @Sendable () -> Void, _ body: @escaping @Sendable () throws -> Void) async throws {
        try await withTaskCancellationHandler {
            try await withGracefulShutdownHandler {
                try await run(name: name, body)
            } onGracefulShutdown: {
                stop()
            }
        } onCancel: {
            stop()
        }
    }
}
