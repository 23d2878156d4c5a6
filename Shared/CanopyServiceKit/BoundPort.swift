import Synchronization

/// The port an HTTP listener bound (port 0 lets the system choose one), set by its start-up
/// callback and awaited by whoever needs it: tests, and logs that say where to connect.
public final class BoundPort: Sendable {
    private let value = Mutex<Int?>(nil)
    /// What listens, for the error when it never does (e.g. "the metrics listener").
    private let listener: String

    public init(listener: String) {
        self.listener = listener
    }

    /// Called once the listener runs.
    public func set(_ port: Int?) {
        value.withLock { $0 = port }
    }

    /// The port if it is bound by now (for a caller that cannot wait asynchronously).
    public var current: Int? { value.withLock { $0 } }

    /// The port, once it is bound; an error saying so when it is not within `limit`.
    public func wait(within limit: Duration = .seconds(10)) async throws -> Int {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            if let port = value.withLock({ $0 }) { return port }
            try await Task.sleep(for: .milliseconds(10))
        }
        throw CommandFailure("\(listener) did not start within \(limit)")
    }
}
