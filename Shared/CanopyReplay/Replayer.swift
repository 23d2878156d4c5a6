import CanopyBus
import CanopyCapture
import CanopyMessages
import CanopyWire
import Foundation
import Histogram
import Synchronization

/// How a replay is paced and compared.
public struct ReplayOptions: Sendable {
    public enum Pacing: Sendable, Equatable {
        /// At the captured times, `speed` times faster (1: as recorded).
        case recorded(speed: Double)
        /// A fixed number of requests a second, whatever the captured times.
        case rate(Double)
        /// As fast as the stack answers.
        case fast
    }

    public var pacing: Pacing = .recorded(speed: 1)
    /// Paths left out of the comparison (`--ignore`).
    public var ignore: [String] = []
    /// Requests read ahead of their answers at most (a bound on memory).
    public var window = 10_000
    /// Differing answers described in the report (all are counted).
    public var examples = 50
    /// When set, every request waits this long instead of its captured deadline.
    public var timeout: Duration?

    public init() {}
}

/// What a replay found.
public struct ReplayReport: Codable, Sendable, Equatable {
    /// One answer that differed, or a request that failed.
    public struct Example: Codable, Sendable, Equatable {
        public var client: String
        public var service: String
        public var operation: String
        /// When the request was captured, ns since 1970.
        public var time: Int64
        public var principal: String
        /// For a failure: what went wrong.
        public var failure: String?
        public var differences: [Difference]
    }

    public var requests = 0
    /// The answer was the captured one (ids the replay rebound and ignored paths aside).
    public var matched = 0
    public var differed = 0
    /// The stack did not answer (timeout, no workers, worker lost, busy) where the capture had an answer.
    public var failed = 0
    /// Not sent: the capture left their attachments out.
    public var skipped = 0
    /// Sent, but the capture holds no answer to compare with (it ended first).
    public var unanswered = 0
    /// Captured answers whose request began before the capture.
    public var answersWithoutRequest = 0
    /// Requests services made themselves (``RequestHeader/Flag/derived``): not sent, since the
    /// replayed requests make the services make them again.
    public var derived = 0
    /// Ids learned from answers and put into later requests.
    public var rebound = 0
    public var seconds = 0.0
    public var requestsPerSecond = 0.0
    public var replayedP50Micros: UInt64 = 0
    public var replayedP99Micros: UInt64 = 0
    public var capturedP50Micros: UInt64 = 0
    public var capturedP99Micros: UInt64 = 0
    /// How reading the capture ended.
    public var ending = ""
    public var examples: [Example] = []

    public init() {}

    /// Whether anything differed or failed (or the capture was cut short).
    public var isClean: Bool { differed == 0 && failed == 0 && ending == "complete" }
}

/// Progress of a running replay, for a progress bar.
public struct ReplayProgress: Sendable {
    public var bytesRead: Int
    public var sent: Int
    public var completed: Int
}

/// Sends a capture's requests again and compares each answer with the captured one.
///
/// Each captured client becomes a lane: its requests go in their captured order, and a
/// request waits for the answers its client had received before sending it in the capture
/// (so a create is answered before the request that uses its id); requests the client had
/// in the air together go together again. Lanes run concurrently. Answers teach the replay
/// ids that changed (``Rebindings``), which later requests are sent with.
public final class Replayer: Sendable {
    /// The connections requests go out on; each captured client's lane keeps to one.
    private let clients: [BusClient]
    private let options: ReplayOptions
    private let ignored: IgnoredPaths
    private let state = Mutex(State())

    private struct State {
        var rebindings = Rebindings()
        var report = ReplayReport()
        var replayed = Histogram<UInt64>(highestTrackableValue: 3_600_000_000, numberOfSignificantValueDigits: .two)
        var captured = Histogram<UInt64>(highestTrackableValue: 3_600_000_000, numberOfSignificantValueDigits: .two)
        var sent = 0
        var completed = 0
    }

    /// - Parameters:
    ///   - clients: the bus connections to send on (lanes are spread over them; one
    ///     connection's I/O thread is a ceiling at saturation).
    ///   - options: pacing, comparison and bounds.
    public init(clients: [BusClient], options: ReplayOptions) {
        precondition(!clients.isEmpty, "a replay needs a bus connection")
        self.clients = clients
        self.options = options
        ignored = IgnoredPaths(options.ignore)
    }

    /// One request on its way: what it must wait for, and where its captured answer will be put.
    private final class Job: Sendable {
        let record: CaptureRecord
        let after: [OneShot<Void>]
        let sendAt: ContinuousClock.Instant?
        let captured = OneShot<CaptureRecord?>()
        let done = OneShot<Void>()

        init(record: CaptureRecord, after: [OneShot<Void>], sendAt: ContinuousClock.Instant?) {
            self.record = record
            self.after = after
            self.sendAt = sendAt
        }
    }

    private struct Key: Hashable {
        let client: String
        let correlation: [UInt8]
    }

    /// Replays every request of `reader`'s capture.
    public func run(_ reader: CaptureReader, progress: @escaping @Sendable (ReplayProgress) -> Void = { _ in }) async throws -> ReplayReport {
        let window = WindowLimiter(options.window)
        let started = ContinuousClock.now
        var firstTime: Int64?
        var index = 0
        var awaiting: [Key: [Job]] = [:]
        var answered: [String: [OneShot<Void>]] = [:]
        var lanes: [String: AsyncStream<Job>.Continuation] = [:]
        var answersWithoutRequest = 0, derived = 0
        var derivedInTheAir: [Key: Int] = [:]

        await withDiscardingTaskGroup { group in
            do {
                while let record = try reader.next() {
                    let key = Key(client: record.client, correlation: record.correlation)
                    switch record.kind {
                    case .request where record.header.flags & RequestHeader.Flag.derived != 0:
                        derived += 1
                        derivedInTheAir[key, default: 0] += 1
                    case .reply where derivedInTheAir[key] != nil:
                        derivedInTheAir[key] = derivedInTheAir[key]! > 1 ? derivedInTheAir[key]! - 1 : nil
                    case .request:
                        await window.acquire()
                        let time = record.time
                        let first = firstTime ?? time
                        firstTime = first
                        let sendAt: ContinuousClock.Instant? = switch options.pacing {
                        case .recorded(let speed): started + .nanoseconds(Int64(Double(max(0, time - first)) / speed))
                        case .rate(let rate): started + .nanoseconds(Int64(Double(index) / rate * 1e9))
                        case .fast: nil
                        }
                        index += 1
                        let job = Job(record: record, after: answered.removeValue(forKey: record.client) ?? [], sendAt: sendAt)
                        awaiting[key, default: []].append(job)
                        if lanes[record.client] == nil {
                            let (stream, continuation) = AsyncStream<Job>.makeStream()
                            lanes[record.client] = continuation
                            let client = clients[lanes.count % clients.count]
                            group.addTask { await self.lane(stream, client: client, window: window) }
                        }
                        lanes[record.client]!.yield(job)
                        if index % 1024 == 0 {
                            let counts = state.withLock { ($0.sent, $0.completed) }
                            progress(ReplayProgress(bytesRead: reader.bytesRead, sent: counts.0, completed: counts.1))
                        }
                    case .reply:
                        guard var jobs = awaiting[key], !jobs.isEmpty else {
                            answersWithoutRequest += 1
                            continue
                        }
                        let job = jobs.removeFirst()
                        awaiting[key] = jobs.isEmpty ? nil : jobs
                        job.captured.fulfill(record)
                        answered[record.client, default: []].append(job.done)
                    }
                }
            } catch {
                // A record the reader could not decode ends the reading like damage does: `reader.ending` says where.
            }
            for jobs in awaiting.values { for job in jobs { job.captured.fulfill(nil) } }
            for lane in lanes.values { lane.finish() }
        }

        return state.withLock { state in
            var report = state.report
            report.answersWithoutRequest = answersWithoutRequest
            report.derived = derived
            report.rebound = state.rebindings.count
            let elapsed = ContinuousClock.now - started
            report.seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            report.requestsPerSecond = report.seconds > 0 ? Double(report.requests) / report.seconds : 0
            if state.replayed.totalCount > 0 {
                report.replayedP50Micros = state.replayed.valueAtPercentile(50)
                report.replayedP99Micros = state.replayed.valueAtPercentile(99)
            }
            if state.captured.totalCount > 0 {
                report.capturedP50Micros = state.captured.valueAtPercentile(50)
                report.capturedP99Micros = state.captured.valueAtPercentile(99)
            }
            report.ending = reader.ending?.description ?? "complete"
            return report
        }
    }

    /// One client's requests, in order; each sent once the answers it depends on are in.
    private func lane(_ jobs: AsyncStream<Job>, client: BusClient, window: WindowLimiter) async {
        await withDiscardingTaskGroup { group in
            for await job in jobs {
                for dependency in job.after { await dependency.value() }
                if let sendAt = job.sendAt, sendAt > .now { try? await Task.sleep(until: sendAt, clock: .continuous) }
                group.addTask {
                    await self.replay(job, client: client, window: window)
                    job.done.fulfill(())
                }
            }
        }
    }

    /// Sends one request and compares its answer. Its place in the window is given back once
    /// the stack answered, before the captured answer is awaited: the reading goes on to
    /// find it however many requests the capture had in the air.
    private func replay(_ job: Job, client: BusClient, window: WindowLimiter) async {
        let record = job.record
        if record.flags.contains(.attachmentsOmitted) {
            state.withLock { $0.report.requests += 1; $0.report.skipped += 1; $0.completed += 1 }
            window.release()
            return
        }
        let body = state.withLock { state -> [UInt8] in
            state.sent += 1
            return state.rebindings.rewrite(record.body)
        }
        let timeout = options.timeout ?? (record.header.timeoutMilliseconds > 0 ? .milliseconds(Int64(record.header.timeoutMilliseconds)) : nil)
        let started = ContinuousClock.now
        let outcome: Result<RawReply, CanopyError>
        do {
            outcome = .success(try await client.call(service: record.service, operation: record.operation, body: body, attachments: record.attachments,
                                                     principal: record.header.principal.isEmpty ? nil : record.header.principal, timeout: timeout,
                                                     idempotent: record.header.flags & RequestHeader.Flag.idempotent != 0))
        } catch let error as CanopyError {
            outcome = .failure(error)
        } catch {
            outcome = .failure(CanopyError(.internal, "\(error)"))
        }
        let elapsed = ContinuousClock.now - started
        window.release()
        let captured = await job.captured.value()
        let verdict = compare(captured, outcome)
        state.withLock { state in
            state.completed += 1
            state.report.requests += 1
            _ = state.replayed.record(UInt64(max(0, elapsed.components.seconds * 1_000_000 + elapsed.components.attoseconds / 1_000_000_000_000)))
            if let captured { _ = state.captured.record(captured.latencyNanoseconds / 1_000) }
            switch verdict {
            case .matched: state.report.matched += 1
            case .unanswered: state.report.unanswered += 1
            case .differed(let differences):
                state.report.differed += 1
                example(record, failure: nil, differences, into: &state.report)
            case .failed(let failure):
                state.report.failed += 1
                example(record, failure: failure, [], into: &state.report)
            }
        }
    }

    private enum Verdict {
        case matched
        case unanswered
        case differed([Difference])
        case failed(String)
    }

    private func example(_ record: CaptureRecord, failure: String?, _ differences: [Difference], into report: inout ReplayReport) {
        guard report.examples.count < options.examples else { return }
        report.examples.append(.init(client: record.client, service: record.service, operation: record.operation, time: record.time,
                                     principal: record.header.principal, failure: failure, differences: differences))
    }

    /// Errors that say the stack did not answer, rather than what it answered.
    private static let unanswering: Set<CanopyError.Code> = [.timeout, .noWorkers, .workerLost, .busy]

    private func compare(_ captured: CaptureRecord?, _ outcome: Result<RawReply, CanopyError>) -> Verdict {
        guard let captured else { return .unanswered }
        let capturedError = captured.flags.contains(.failed) ? (try? MessageCodec().decode(CanopyError.self, from: captured.body)) : nil
        switch outcome {
        case .failure(let error):
            if let capturedError, capturedError.code == error.code { return .matched } // same refusal (messages may name ids)
            if Self.unanswering.contains(error.code) { return .failed("\(error.code.rawValue): \(error.message)") }
            let was = capturedError.map { "error \($0.code.rawValue)" } ?? "an answer"
            return .differed([Difference(path: "$", captured: was, replayed: "error \(error.code.rawValue): \(error.message.prefix(200))")])
        case .success(let reply):
            if let capturedError {
                return .differed([Difference(path: "$", captured: "error \(capturedError.code.rawValue)", replayed: "an answer")])
            }
            if reply.body != captured.body {
                // Ids first: what this answer teaches explains its own differences too.
                if let left = try? JSONSerialization.jsonObject(with: Data(captured.body), options: [.fragmentsAllowed]),
                   let right = try? JSONSerialization.jsonObject(with: Data(reply.body), options: [.fragmentsAllowed]) {
                    state.withLock { $0.rebindings.learn(captured: left, replayed: right) }
                }
            }
            let rebindings = state.withLock { $0.rebindings }
            var differences = ReplyComparison.differences(captured: captured.body, replayed: reply.body, ignored: ignored, rebindings: rebindings)
            if !captured.flags.contains(.attachmentsOmitted) {
                for index in 0..<max(captured.attachments.count, reply.attachments.count) {
                    let left = index < captured.attachments.count ? captured.attachments[index] : nil
                    let right = index < reply.attachments.count ? reply.attachments[index] : nil
                    if left != right && !ignored.contains(["attachments", "\(index)"]) {
                        differences.append(Difference(path: "$attachments[\(index)]", captured: left.map { "\($0.count) bytes" } ?? "(absent)",
                                                      replayed: right.map { "\($0.count) bytes, other bytes" } ?? "(absent)"))
                    }
                }
            }
            return differences.isEmpty ? .matched : .differed(differences)
        }
    }
}

/// A value set once and awaited by any number of tasks.
final class OneShot<Value: Sendable>: Sendable {
    private enum Slot {
        case waiting([CheckedContinuation<Value, Never>])
        case set(Value)
    }

    private let slot = Mutex(Slot.waiting([]))

    func fulfill(_ value: Value) {
        let waiting: [CheckedContinuation<Value, Never>] = slot.withLock { slot in
            guard case .waiting(let continuations) = slot else { return [] }
            slot = .set(value)
            return continuations
        }
        for continuation in waiting { continuation.resume(returning: value) }
    }

    func value() async -> Value {
        if case .set(let value) = slot.withLock({ $0 }) { return value }
        return await withCheckedContinuation { continuation in
            let ready: Value? = slot.withLock { slot in
                switch slot {
                case .set(let value): return value
                case .waiting(var continuations):
                    continuations.append(continuation)
                    slot = .waiting(continuations)
                    return nil
                }
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }
}

/// At most `limit` requests read and not yet answered.
final class WindowLimiter: Sendable {
    private struct State {
        var free: Int
        var waiting: [CheckedContinuation<Void, Never>] = []
    }

    private let state: Mutex<State>

    init(_ limit: Int) {
        state = Mutex(State(free: max(1, limit)))
    }

    func acquire() async {
        let taken = state.withLock { state -> Bool in
            guard state.free > 0 else { return false }
            state.free -= 1
            return true
        }
        if taken { return }
        await withCheckedContinuation { continuation in
            let now = state.withLock { state -> Bool in
                if state.free > 0 {
                    state.free -= 1
                    return true
                }
                state.waiting.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    func release() {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if state.waiting.isEmpty {
                state.free += 1
                return nil
            }
            return state.waiting.removeFirst()
        }
        next?.resume()
    }
}
