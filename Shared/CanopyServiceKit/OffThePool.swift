import Dispatch
import ServiceContextModule

/// Runs blocking or CPU-heavy work (libvips, reading a whole photo, a year of tasks for every
/// species) on Dispatch's threads and returns its result to the calling task.
///
/// Swift's cooperative pool has one thread per core: a few such pieces of work there stall
/// every other task of the process — in a service its other requests, in the tests the
/// brokers, services and clients of the live-bus tests running alongside.
///
/// The calling task's service context goes along, so a store call made there is still a span
/// of the request it serves.
public func offThePool<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    let context = ServiceContext.current
    return try await withCheckedThrowingContinuation { continuation in
        DispatchQueue.global().async {
            continuation.resume(with: Result { try ServiceContext.withValue(context) { try work() } })
        }
    }
}
