import Foundation
import CZeroMQ

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
}
