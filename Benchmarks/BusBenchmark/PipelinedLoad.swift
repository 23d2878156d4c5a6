import CZeroMQ
import CanopyBus
import CanopyWire
import Foundation
import Histogram
import Synchronization

/// A pipelined load generator: `clients` DEALER sockets spread over `threads` threads, each
/// client keeping `window` requests in flight (a reply is answered by the next request at
/// once). Each request's correlation id carries its send time, so replies may come back in
/// any order and no table of pending requests is needed. The same generator drives the
/// broker and the `zmq_proxy` baseline.
///
/// Each thread reads its own CPU time while measuring (``Result/generatorCPUSeconds``): a
/// generator that is not the bottleneck leaves room on the machine's cores.
struct PipelinedLoad {
    typealias Result = LoadResult

    let endpoint: String
    let clients: Int
    let window: Int
    let threads: Int
    /// The request each client sends; frame 2 is replaced by the correlation id.
    let request: [[UInt8]]
    /// Whether every request gets a body of its own (`{"n":…}`), so no two are identical.
    var uniqueBodies = false
    /// Every this many requests of a client carries a sampled trace context in its header
    /// (a trace of its own); nil for none.
    var traceEvery: Int?

    /// The threads' name (in `top -H` and `perf`).
    static let threadName = "bench-load"

    /// Runs for `warmUp` (not counted), then for `duration`, and returns the merged figures.
    func run(warmUp: Duration, duration: Duration) throws -> Result {
        let threadCount = max(1, min(threads, clients))
        let context = ZMQContext(ioThreads: Int32(threadCount))
        let start = ContinuousClock.now
        let measureFrom = start + warmUp
        let end = measureFrom + duration
        var merged = try LoadResult.spread(clients: clients, over: threadCount) { [self] mine in
            try drive(clientIndexes: mine, context: context, measureFrom: measureFrom, end: end)
        }
        let elapsed = end - measureFrom
        merged.seconds = elapsed.seconds
        return merged
    }

    /// One thread's clients, from start to `end`.
    private func drive(clientIndexes: [Int], context: ZMQContext, measureFrom: ContinuousClock.Instant, end: ContinuousClock.Instant) throws -> Result {
        let sockets = try dealers(clientIndexes.count, connectedTo: endpoint, in: context)
        defer { sockets.forEach { $0.close() } }
        var poller = Poller()
        sockets.forEach { poller.add($0) }
        var sequence = [UInt64](repeating: 0, count: sockets.count)
        let origin = DispatchTime.now().uptimeNanoseconds

        // A correlation id is the send time in nanoseconds since `origin`, shifted left by 8,
        // with a per-client counter in the low byte so ids stay unique within a client.
        var frames = request
        let header = RequestHeader(frame: request[5]) ?? RequestHeader(timeoutMilliseconds: 30_000)
        func send(_ index: Int) throws {
            sequence[index] &+= 1
            let sentAt = DispatchTime.now().uptimeNanoseconds - origin
            frames[2] = Wire.frame(sentAt << 8 | (sequence[index] & 0xFF))
            if uniqueBodies { frames[6] = Array("{\"n\":\"\(clientIndexes[index])-\(sequence[index])\"}".utf8) }
            if let traceEvery {
                if sequence[index] % UInt64(traceEvery) == 0 {
                    var header = header
                    header.trace = TraceContext(
                        traceHigh: sequence[index] | 1, traceLow: UInt64(clientIndexes[index] + 1) << 32 | UInt64.random(in: 0...UInt64(UInt32.max)),
                        spanID: sequence[index] | 1, flags: 1)
                    frames[5] = header.frame
                } else {
                    frames[5] = request[5]
                }
            }
            _ = try sockets[index].send(frames, dontWait: false)
        }
        for index in sockets.indices {
            for _ in 0..<window { try send(index) }
        }

        var result = Result()
        var measuring = false
        var cpuAtStart = 0.0
        while true {
            let now = ContinuousClock.now
            if now >= end { break }
            if !measuring && now >= measureFrom {
                measuring = true
                result = Result()
                cpuAtStart = currentThreadCPUSeconds()
            }
            try poller.poll(timeout: .milliseconds(50))
            for index in sockets.indices where poller.isReadable(index) {
                while let reply = try sockets[index].receive() {
                    guard reply.count >= 3 else { continue }
                    if measuring {
                        result.requests += 1
                        if reply[1] != Wire.Command.reply.frame { result.errors += 1 }
                        let sentAt = (Wire.uint64(reply[2]) ?? 0) >> 8
                        let received = DispatchTime.now().uptimeNanoseconds - origin
                        _ = result.latencyMicros.record(received > sentAt ? (received - sentAt) / 1_000 : 0)
                    }
                    try send(index)
                }
            }
        }
        result.generatorCPUSeconds = currentThreadCPUSeconds() - cpuAtStart
        return result
    }
}

/// CPU time (user and system) the calling thread has used, in seconds.
func currentThreadCPUSeconds() -> Double {
    var time = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time)
    return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
}

/// What a load generator measured: requests answered, errors, time, latency at the client,
/// and the generator's own CPU time.
struct LoadResult {
    var requests = 0
    var errors = 0
    var seconds = 0.0
    /// CPU time the generator's threads used while measuring (0 when not measured).
    var generatorCPUSeconds = 0.0
    var latencyMicros = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
    var throughput: Double { Double(requests) / seconds }
    var p50: UInt64 { latencyMicros.valueAtPercentile(50) }
    var p99: UInt64 { latencyMicros.valueAtPercentile(99) }
    /// The generator's share of one core while measuring.
    var generatorCoreShare: Double { generatorCPUSeconds / seconds }

    /// Runs `drive` on `threads` threads named ``PipelinedLoad/threadName``, each with its
    /// share of the clients' indexes, and merges what they measured (the first failure is
    /// thrown).
    static func spread(clients: Int, over threads: Int, _ drive: @escaping @Sendable ([Int]) throws -> LoadResult) throws -> LoadResult {
        let results = Mutex<[LoadResult]>([])
        let failures = Mutex<[String]>([])
        let done = DispatchGroup()
        for thread in 0..<threads {
            let mine = (0..<clients).filter { $0 % threads == thread }
            done.enter()
            Thread {
                canopy_name_thread(PipelinedLoad.threadName)
                do {
                    let result = try drive(mine)
                    results.withLock { $0.append(result) }
                } catch {
                    failures.withLock { $0.append("\(error)") }
                }
                done.leave()
            }.start()
        }
        done.wait()
        if let failure = failures.withLock({ $0.first }) { throw BenchmarkFailure(failure) }
        var merged = LoadResult()
        results.withLock { $0.forEach { merged.merge($0) } }
        return merged
    }

    /// Adds another thread's figures (not its time: the threads measured the same span).
    mutating func merge(_ other: LoadResult) {
        requests += other.requests
        errors += other.errors
        generatorCPUSeconds += other.generatorCPUSeconds
        latencyMicros.add(other.latencyMicros)
    }
}

/// A benchmark set-up that failed, with what went wrong.
struct BenchmarkFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
