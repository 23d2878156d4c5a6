import Dispatch

/// Runs CPU-heavy test work on a Dispatch thread and returns its result to the test's task.
///
/// Swift's cooperative pool has one thread per core, and test functions run on it: a test
/// that computes for seconds there stalls the live-bus tests of the same process (their
/// brokers, services and clients are tasks on that pool), and on a loaded 2-core machine
/// they time out. Check expectations on the result, back in the test's own task.
public func offThePool<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        DispatchQueue.global().async { continuation.resume(with: Result { try work() }) }
    }
}
