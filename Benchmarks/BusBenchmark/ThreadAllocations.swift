import CZeroMQ
import Foundation
import Glibc
import MallocInterposerSwift
import Synchronization

/// Heap allocations one named thread of this process makes (the broker's loop thread),
/// counted by malloc-interposer's allocation hook, which runs on the allocating thread.
///
/// canopy-bench links malloc-interposer's library, whose `malloc` and `free` then stand in
/// for libc's in the whole process; with counting off they pass straight through (with a
/// 16-byte header an allocation), so the proxy and the broker pay the same. The hook compares
/// the calling thread with the counted one: by name (one `prctl`) until the counted thread
/// first allocates, then by `pthread_self()` alone.
enum ThreadAllocations {
    private static let name = Mutex<[CChar]>([])
    private static let watched = Atomic<UInt>(0)
    private static let counted = Atomic<Int>(0)
    /// Set while a window counts, so allocations after it are not counted.
    private static let counting = Atomic<Bool>(false)

    /// Whether allocations are counted in this process: the interposer's `malloc` is the one
    /// called (it is not when something loaded libc's first, or under a sanitizer).
    static let isAvailable: Bool = {
        MallocInterposerSwift.initialize()
        MallocInterposerSwift.hook()
        let probe = UnsafeMutableRawPointer.allocate(byteCount: 64, alignment: 16)
        probe.deallocate()
        MallocInterposerSwift.unhook()
        defer { MallocInterposerSwift.reset() }
        return MallocInterposerSwift.getStatistics().mallocCount > 0
    }()

    /// Counts the allocations of the thread named `threadName` from `after` on, for `duration`,
    /// while `body` runs (which should measure the same window). Returns `body`'s result and
    /// the count, or nil for the count when counting is not available.
    static func count<T>(threadNamed threadName: String, after: Duration, for duration: Duration, during body: () throws -> T) rethrows -> (T, Int?) {
        guard isAvailable else { return (try body(), nil) }
        name.withLock { $0 = Array(threadName.utf8CString.prefix(15)) + [0] }
        watched.store(0, ordering: .relaxed)
        counted.store(0, ordering: .relaxed)
        let window = Thread {
            Thread.sleep(forTimeInterval: after.seconds)
            counting.store(true, ordering: .relaxed)
            MallocInterposerSwift.hook()
            Thread.sleep(forTimeInterval: duration.seconds)
            counting.store(false, ordering: .relaxed)
            MallocInterposerSwift.unhook()
        }
        MallocInterposerSwift.setAllocationHook { _ in ThreadAllocations.record() }
        window.start()
        defer { MallocInterposerSwift.setAllocationHook(nil) }
        let result = try body()
        return (result, counted.load(ordering: .relaxed))
    }

    /// One allocation, on whichever thread made it.
    private static func record() {
        guard counting.load(ordering: .relaxed) else { return }
        let me = UInt(pthread_self())
        let thread = watched.load(ordering: .relaxed)
        if thread == me {
            counted.add(1, ordering: .relaxed)
        } else if thread == 0, threadIsNamed() {
            watched.store(me, ordering: .relaxed)
            counted.add(1, ordering: .relaxed)
        }
    }

    /// Whether the calling thread bears the counted name (read without allocating: the
    /// name was copied into a C string before counting began).
    private static func threadIsNamed() -> Bool {
        name.withLockIfAvailable { $0.withUnsafeBufferPointer { canopy_thread_is_named($0.baseAddress) != 0 } } ?? false
    }
}
