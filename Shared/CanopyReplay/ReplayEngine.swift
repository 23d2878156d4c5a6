import CanopyBus
import CanopyCapture
import CanopyMessages
import CanopyWire
import CZeroMQ
import Foundation
import Histogram
import DequeModule
import HeapModule

/// The replay's loop, owned by one thread: the capture's reader, the sockets, every request's
/// state.
struct ReplayEngine {
    /// One captured request on its way.
    final class Job {
        let id: UInt64
        let record: CaptureRecord
        let lane: Lane
        let sendAt: ContinuousClock.Instant?
        /// Earlier requests of its client whose answers it waits for (as in the capture).
        var waitingOn = 0
        /// With ``ReplayOptions/causalOrder``: the captured answers (by their order in the
        /// capture) that came before this request, all of which the replay must have had
        /// answered first.
        var needs = 0
        /// Its captured answer's place among the captured answers, once read.
        var answerIndex: Int?
        /// With ``ReplayOptions/causalOrder``: how many answers to services' own requests of
        /// each `service.operation` the capture had recorded before this request came (the
        /// background work it may have seen done).
        var needsBackground: [String: Int] = [:]
        /// When it began to wait for background work (it goes after ``backgroundPatience``).
        var waitingSince: ContinuousClock.Instant?
        var dependents: [Job] = []
        var sentAt: ContinuousClock.Instant?
        /// When it went, by the wall clock (ns since 1970).
        var sentWall: Int64 = 0
        /// From sending it to its answer.
        var took: Duration = .zero
        var deadline: ContinuousClock.Instant?
        /// What the stack answered (or why it did not).
        var outcome: Outcome?
        /// The captured answer, once the reading found it (or found there is none).
        var captured: CaptureRecord?
        var capturedKnown = false
        var done = false

        init(id: UInt64, record: CaptureRecord, lane: Lane, sendAt: ContinuousClock.Instant?) {
            self.id = id
            self.record = record
            self.lane = lane
            self.sendAt = sendAt
        }
    }

    /// One captured client's requests not yet sent, in order.
    final class Lane {
        let socket: Int
        var unsent = Deque<Job>()
        var isDirty = false
        /// Waiting for its head's send time (in `sleeping`).
        var isSleeping = false

        init(socket: Int) { self.socket = socket }
    }

    enum Outcome {
        case answer(body: [UInt8], attachments: [[UInt8]])
        case failure(CanopyError)
        case skipped
    }

    private struct Key: Hashable {
        let client: String
        let correlation: [UInt8]
    }

    private let options: ReplayOptions
    private let ignored: IgnoredPaths
    private let context: ZMQContext
    private let sockets: [ZMQSocket]
    private var poller = Poller()
    private let codec = MessageCodec()

    private var lanes: [String: Lane] = [:]
    private var dirty: [Lane] = []
    private var sleeping: [Lane] = []
    private var inFlight: [UInt64: Job] = [:]
    private var awaiting: [Key: Deque<Job>] = [:]
    private var answered: [String: [Job]] = [:]
    private var derivedInTheAir: [Key: Int] = [:]
    /// Causal order across clients (``ReplayOptions/causalOrder``): captured answers given an
    /// index in capture order; those whose request the replay has not had answered yet; and
    /// the watermark below which every one has been.
    private var answersIndexed = 0
    private var unansweredIndexes = Heap<Int>()
    private var answeredIndexes = Set<Int>()
    private var watermark = 0
    /// Lanes whose next request waits for the watermark.
    private var waitingForOrder: [Lane] = []
    /// Answers to services' own requests read from the capture, by `service.operation`; and
    /// those the stack has given, by the broker's counts (`broker.stats`, asked while a lane
    /// waits for them).
    private var backgroundCaptured: [String: Int] = [:]
    private var backgroundReplayed: [String: Int] = [:]
    private var waitingForBackground: [Lane] = []
    private var statsAskedAt: ContinuousClock.Instant?
    /// The correlation id of the replay's own `broker.stats` requests (jobs count from 1).
    private static let statsCorrelation = Wire.frame(UInt64(0))
    /// How long a request waits for background work the capture saw done before it.
    private static let backgroundPatience: Duration = .seconds(3)
    /// Requests read whose answer from the stack has not come yet: bounded by the window.
    private var outstanding = 0
    /// Requests read and not yet sent, over all lanes.
    private var unsent = 0
    private var nextID: UInt64 = 1
    private var started = ContinuousClock.now
    private var firstTime: Int64?
    private var requestIndex = 0

    private var rebindings = Rebindings()
    private var report = ReplayReport()
    private var timeFields = Set<String>()
    /// The longest any request answered so far took, captured or replayed (ns): how far a
    /// time stamped while serving it may move (``timeWindow(_:captured:)``).
    private var slowest: Int64 = 0
    /// This replay's answers, written as a capture (``ReplayOptions/answersPath``), in the
    /// captured order: requests wait in ``answerOrder`` until those before them are done.
    private var answers: CaptureFileWriter?
    private var answerOrder = Deque<Job>()
    /// Why writing the answers failed, reported when the replay ends.
    private var answersError: Error?
    private var replayed = Histogram<UInt64>(highestTrackableValue: 3_600_000_000, numberOfSignificantValueDigits: .two)
    private var capturedLatency = Histogram<UInt64>(highestTrackableValue: 3_600_000_000, numberOfSignificantValueDigits: .two)
    private var sent = 0

    init(connection: Replayer.Connection, options: ReplayOptions) throws {
        self.options = options
        ignored = IgnoredPaths(options.ignore)
        let context = ZMQContext()
        self.context = context
        sockets = try (0..<connection.count).map { _ in
            let socket = try ZMQSocket(context, type: .dealer)
            if let curve = connection.curve { try socket.becomeCurveClient(curve) }
            try socket.setHighWaterMarks(1_000_000)
            try socket.set(ZMQ_RECONNECT_IVL, 100)
            try socket.connect(connection.endpoint)
            return socket
        }
        for socket in sockets { poller.add(socket) }
    }

    mutating func run(_ reader: CaptureReader, progress: (ReplayProgress) -> Void) throws -> ReplayReport {
        defer { sockets.forEach { $0.close() } }
        if let path = options.answersPath {
            answers = try CaptureFileWriter(path: path, pseudonymized: reader.header.pseudonymized, withoutAttachments: reader.header.withoutAttachments)
        }
        started = .now
        if case .anchored(let captureTime, let at) = options.clock {
            // The first request goes at its distance from the capture's start after `at`.
            started = .now + .nanoseconds(Int64((at.timeIntervalSinceNow * 1e9).rounded()))
            firstTime = captureTime
        }
        var readerDone = false
        var lastTimeoutScan = ContinuousClock.now
        var recordsRead = 0
        while true {
            // Read while the window has room (a bounded batch, so answers keep being taken).
            var budget = 1_024
            while !readerDone, outstanding < options.window, budget > 0 {
                guard let record = try? reader.next() else {
                    readerDone = true
                    endOfCapture()
                    break
                }
                budget -= 1
                recordsRead += 1
                take(record)
                if recordsRead % 4_096 == 0 { progress(ReplayProgress(bytesRead: reader.bytesRead, sent: sent, completed: report.requests)) }
            }
            let now = ContinuousClock.now
            try sendReady(now: now)
            if readerDone && inFlight.isEmpty && unsent == 0 { break }

            var timeout: Duration = .milliseconds(50)
            if !readerDone && outstanding < options.window { timeout = .zero }
            if let wake = sleeping.compactMap({ $0.unsent.first?.sendAt }).min() { timeout = min(timeout, max(.zero, wake - now)) }
            if !waitingForBackground.isEmpty {
                timeout = min(timeout, .milliseconds(5))
                // No counts came (a lost answer): look again, and ask again.
                if let asked = statsAskedAt, now - asked >= .milliseconds(100) {
                    for lane in waitingForBackground { markDirty(lane) }
                    waitingForBackground.removeAll(keepingCapacity: true)
                }
            }
            try poller.poll(timeout: timeout)
            for socket in sockets {
                while let frames = try socket.receive(dontWait: true) { answer(frames) }
            }
            if now - lastTimeoutScan >= .milliseconds(50) {
                lastTimeoutScan = now
                expire(now: now)
            }
        }
        progress(ReplayProgress(bytesRead: reader.bytesRead, sent: sent, completed: report.requests))
        if let answersError { throw answersError }
        try writeAnswers()
        try answers?.close()
        return finish(ending: reader.ending?.description ?? "complete")
    }

    // MARK: - Reading

    private mutating func take(_ record: CaptureRecord) {
        let key = Key(client: record.client, correlation: record.correlation)
        switch record.kind {
        case .mark:
            report.marks += 1
        case .request where record.header.flags & RequestHeader.Flag.derived != 0:
            report.derived += 1
            derivedInTheAir[key, default: 0] += 1
        case .request:
            let first = firstTime ?? record.time
            firstTime = first
            let sendAt: ContinuousClock.Instant? = switch options.pacing {
            case .recorded(let speed): started + .nanoseconds(Int64(Double(max(0, record.time - first)) / speed))
            case .rate(let rate): started + .nanoseconds(Int64(Double(requestIndex) / rate * 1e9))
            case .fast: nil
            }
            requestIndex += 1
            let lane = lanes[record.client] ?? {
                let lane = Lane(socket: lanes.count % sockets.count)
                lanes[record.client] = lane
                return lane
            }()
            let job = Job(id: nextID, record: record, lane: lane, sendAt: sendAt)
            nextID += 1
            if options.causalOrder {
                job.needs = answersIndexed
                job.needsBackground = backgroundCaptured
            }
            for earlier in answered.removeValue(forKey: record.client) ?? [] where !earlier.done {
                earlier.dependents.append(job)
                job.waitingOn += 1
            }
            awaiting[key, default: []].append(job)
            if answers != nil { answerOrder.append(job) }
            outstanding += 1
            unsent += 1
            lane.unsent.append(job)
            if lane.unsent.count == 1 { markDirty(lane) }
        case .reply:
            if let count = derivedInTheAir[key] {
                derivedInTheAir[key] = count > 1 ? count - 1 : nil
                if options.causalOrder { backgroundCaptured["\(record.service).\(record.operation)", default: 0] += 1 }
                return
            }
            guard let job = awaiting[key]?.popFirst() else {
                report.answersWithoutRequest += 1
                return
            }
            if awaiting[key]?.isEmpty == true { awaiting[key] = nil }
            job.captured = record
            job.capturedKnown = true
            if options.causalOrder {
                job.answerIndex = answersIndexed
                unansweredIndexes.insert(answersIndexed)
                if job.outcome != nil { answeredIndexes.insert(answersIndexed) }
                answersIndexed += 1
                advanceWatermark()
            }
            answered[record.client, default: []].append(job)
            if job.outcome != nil { complete(job) }
        }
    }

    /// The capture ended: requests still waiting for a captured answer have none.
    private mutating func endOfCapture() {
        for jobs in awaiting.values {
            for job in jobs {
                job.capturedKnown = true
                if job.outcome != nil { complete(job) }
            }
        }
        awaiting.removeAll()
    }

    // MARK: - Sending

    private mutating func markDirty(_ lane: Lane) {
        guard !lane.isDirty else { return }
        lane.isDirty = true
        dirty.append(lane)
    }

    private mutating func sendReady(now: ContinuousClock.Instant) throws {
        if !sleeping.isEmpty {
            let waking = sleeping.filter { ($0.unsent.first?.sendAt ?? now) <= now }
            sleeping.removeAll { ($0.unsent.first?.sendAt ?? now) <= now }
            for lane in waking {
                lane.isSleeping = false
                markDirty(lane)
            }
        }
        while let lane = dirty.popLast() {
            lane.isDirty = false
            while let job = lane.unsent.first, job.waitingOn == 0 {
                if job.needs > watermark {
                    waitingForOrder.append(lane) // sent once the replay has had what came before it answered
                    break
                }
                if !backgroundDone(for: job, now: now) {
                    waitingForBackground.append(lane) // sent once the stack's own work caught up (or after a while)
                    break
                }
                if let at = job.sendAt, at > now {
                    if !lane.isSleeping {
                        lane.isSleeping = true
                        sleeping.append(lane)
                    }
                    break
                }
                lane.unsent.removeFirst()
                unsent -= 1
                try send(job, now: now)
            }
        }
    }

    private mutating func send(_ job: Job, now: ContinuousClock.Instant) throws {
        let record = job.record
        if record.flags.contains(.attachmentsOmitted) {
            settle(outcome: .skipped, for: job, now: now)
            return
        }
        let timeout = options.timeout ?? (record.header.timeoutMilliseconds > 0 ? .milliseconds(Int64(record.header.timeoutMilliseconds)) : .seconds(30))
        var header = record.header
        header.timeoutMilliseconds = UInt32(clamping: max(1, timeout.wholeMilliseconds))
        header.trace = nil // a replayed request is not part of the trace it was recorded in
        let frames = WireMessage.request(WireRequest(correlation: Wire.frame(job.id), service: record.service, operation: record.operation, header: header,
                                                     body: rebindings.rewrite(record.body), attachments: record.attachments)).encoded
        guard try sockets[job.lane.socket].send(frames) else {
            settle(outcome: .failure(CanopyError(.busy, "the replay's connection queue is full")), for: job, now: now)
            return
        }
        sent += 1
        job.sentAt = now
        job.sentWall = CaptureWriter.wallClockNanoseconds()
        job.deadline = now + timeout + .seconds(1) // the broker answers timeout itself first
        inFlight[job.id] = job
    }

    // MARK: - Answers

    private mutating func answer(_ frames: [[UInt8]]) {
        let now = ContinuousClock.now
        switch try? WireMessage(frames: frames) {
        case .reply(let correlation, _, let body, let attachments)?:
            if correlation == Self.statsCorrelation { return tookStats(body) }
            guard let id = Wire.uint64(correlation), let job = inFlight.removeValue(forKey: id) else { return }
            settle(outcome: .answer(body: body, attachments: attachments), for: job, now: now)
        case .error(let correlation, let error)?:
            guard let id = Wire.uint64(correlation), let job = inFlight.removeValue(forKey: id) else { return }
            let decoded = (try? codec.decode(CanopyError.self, from: error)) ?? CanopyError(.internal, "an error frame that did not decode")
            settle(outcome: .failure(decoded), for: job, now: now)
        default:
            return // heartbeats and anything else a client may hear
        }
    }

    /// Requests the stack did not answer in time.
    private mutating func expire(now: ContinuousClock.Instant) {
        for (id, job) in inFlight where (job.deadline ?? now) < now {
            inFlight[id] = nil
            settle(outcome: .failure(CanopyError(.timeout, "no answer within the request's deadline")), for: job, now: now)
        }
    }

    private mutating func settle(outcome: Outcome, for job: Job, now: ContinuousClock.Instant) {
        job.outcome = outcome
        outstanding -= 1
        if let index = job.answerIndex {
            answeredIndexes.insert(index)
            advanceWatermark()
        }
        if let sentAt = job.sentAt {
            let elapsed = now - sentAt
            job.took = elapsed
            _ = replayed.record(UInt64(max(0, elapsed.microseconds)))
        }
        if job.capturedKnown { complete(job) }
    }

    /// Both answers are in: compare them, learn ids, and let the requests that waited go.
    private mutating func complete(_ job: Job) {
        guard !job.done, let outcome = job.outcome else { return }
        job.done = true
        report.requests += 1
        if let captured = job.captured { _ = capturedLatency.record(captured.latencyNanoseconds / 1_000) }
        let verdict = verdict(job, job.captured, outcome)
        slowest = max(slowest, Int64(job.took.nanoseconds), Int64(job.captured?.latencyNanoseconds ?? 0))
        switch verdict {
        case .matched: report.matched += 1
        case .skipped: report.skipped += 1
        case .unanswered: report.unanswered += 1
        case .differed(let differences):
            report.differed += 1
            example(job.record, failure: nil, differences)
            for path in Set(differences.map { Self.pattern($0.path) }) {
                let place = "\(job.record.service).\(job.record.operation) \(path)"
                if report.differingPaths[place] != nil || report.differingPaths.count < ReplayReport.pathLimit { report.differingPaths[place, default: 0] += 1 }
            }
        case .failed(let failure):
            report.failed += 1
            example(job.record, failure: failure, [])
        }
        for dependent in job.dependents {
            dependent.waitingOn -= 1
            if dependent.waitingOn == 0 { markDirty(dependent.lane) }
        }
        job.dependents = []
        if answers != nil, answersError == nil {
            do { try writeAnswers() } catch { answersError = error }
        }
    }

    /// Whether the stack has done the background work (services' own requests, such as
    /// canopy-care's follow-ups to canopy-remind) that the capture had seen done before `job`
    /// came: by the broker's counts of answered requests per operation. A request waits for
    /// it at most ``backgroundPatience`` (the stack may do less of it than the capture did).
    private mutating func backgroundDone(for job: Job, now: ContinuousClock.Instant) -> Bool {
        guard !job.needsBackground.isEmpty else { return true }
        if job.needsBackground.allSatisfy({ backgroundReplayed[$0.key, default: 0] >= $0.value }) { return true }
        let since = job.waitingSince ?? now
        job.waitingSince = since
        if now - since >= Self.backgroundPatience {
            report.backgroundWaitsEnded += 1
            return true
        }
        askForStats(now: now)
        return false
    }

    /// Asks the broker for its counts (one request at a time, at most every 5 ms).
    private mutating func askForStats(now: ContinuousClock.Instant) {
        if let asked = statsAskedAt, now - asked < .milliseconds(5) { return }
        statsAskedAt = now
        let frames = WireMessage.request(WireRequest(correlation: Self.statsCorrelation, service: Broker.service, operation: Broker.Stats.name,
                                                     header: RequestHeader(timeoutMilliseconds: 2_000), body: Array("{}".utf8))).encoded
        _ = try? sockets[0].send(frames)
    }

    /// The broker's counts came: background work done so far, by operation.
    private mutating func tookStats(_ body: [UInt8]) {
        guard let statistics = try? codec.decode(BrokerStatistics.self, from: body) else { return }
        for operation in statistics.operations {
            backgroundReplayed["\(operation.service).\(operation.operation)"] = Int(operation.outcomes.values.reduce(0, +))
        }
        for lane in waitingForBackground { markDirty(lane) }
        waitingForBackground.removeAll(keepingCapacity: true)
    }

    /// Moves the watermark past every captured answer whose request the replay has had
    /// answered, and lets the lanes that waited for it go.
    private mutating func advanceWatermark() {
        while let lowest = unansweredIndexes.min, answeredIndexes.contains(lowest) {
            unansweredIndexes.removeMin()
            answeredIndexes.remove(lowest)
        }
        let advanced = unansweredIndexes.min ?? answersIndexed
        guard advanced != watermark else { return }
        watermark = advanced
        for lane in waitingForOrder { markDirty(lane) }
        waitingForOrder.removeAll(keepingCapacity: true)
    }

    /// `$.tasks[3].due` as `$.tasks[*].due`.
    static func pattern(_ path: String) -> String {
        var out = "", inIndex = false
        for character in path {
            if character == "[" { inIndex = true; out += "[*"; continue }
            if character == "]" { inIndex = false; out += "]"; continue }
            if !inIndex { out.append(character) }
        }
        return out
    }

    /// Writes the answers of the requests done, up to the first not done (captured order).
    private mutating func writeAnswers() throws {
        guard answers != nil else { return }
        while let job = answerOrder.first, job.done {
            answerOrder.removeFirst()
            // The request as this replay sent it (at its time by the stack's clock), so that
            // another replay of these answers compares its times with this one's.
            var request = job.record
            if job.sentWall != 0 { request.time = stackTime(job) }
            try answers!.append(request)
            guard let outcome = job.outcome else { continue }
            let record = job.record
            var flags: CaptureRecord.Flags = []
            let body: [UInt8], attachments: [[UInt8]]
            switch outcome {
            case .skipped:
                continue
            case .failure(let error):
                flags.insert(.failed)
                (body, attachments) = ((try? codec.encode(error)) ?? [], [])
            case .answer(let replied, let replyAttachments):
                (body, attachments) = (rebindings.restore(replied), replyAttachments)
            }
            try answers!.append(CaptureRecord(kind: .reply, flags: flags, time: request.time + Int64(job.took.nanoseconds),
                                              latencyNanoseconds: UInt64(max(0, job.took.nanoseconds)), client: record.client,
                                              service: record.service, operation: record.operation, correlation: record.correlation,
                                              header: record.header, body: body, attachments: attachments))
        }
    }

    /// How the stack's clock and the capture's differed for `job`, and how much room its
    /// times get.
    ///
    /// A time in an answer was stamped while some request was being served: this one, or an
    /// earlier one whose answer did not show it (a photo's `addedAt`, stamped while its
    /// identification was served, first shown by a later list). Within its request it may
    /// fall anywhere between taking it and answering it, in the capture and in the replay, so
    /// it may move by as much as the slowest request served so far took, either way.
    private func timeWindow(_ job: Job, captured: CaptureRecord) -> TimeWindow? {
        guard let tolerance = options.timeTolerance, job.sentWall != 0 else { return nil }
        let slack = Int64(tolerance.nanoseconds)
        return TimeWindow(shift: stackTime(job) - job.record.time, below: max(Int64(captured.latencyNanoseconds), slowest) + slack,
                          above: max(Int64(job.took.nanoseconds), slowest) + slack)
    }

    /// When `job` was sent, by the stack's clock (ns since 1970).
    private func stackTime(_ job: Job) -> Int64 {
        switch options.clock {
        case .system: job.sentWall
        case .anchored(let captureTime, let at): job.sentWall - Int64((at.timeIntervalSince1970 * 1e9).rounded()) + captureTime
        }
    }

    private enum Verdict {
        case matched
        case skipped
        case unanswered
        case differed([Difference])
        case failed(String)
    }

    private mutating func example(_ record: CaptureRecord, failure: String?, _ differences: [Difference]) {
        guard report.examples.count < options.examples else { return }
        report.examples.append(.init(client: record.client, service: record.service, operation: record.operation, time: record.time,
                                     principal: record.header.principal, failure: failure, differences: differences))
    }

    /// Errors that say the stack did not answer, rather than what it answered.
    private static let unanswering: Set<CanopyError.Code> = [.timeout, .noWorkers, .workerLost, .brokerLost, .shuttingDown, .busy]

    private mutating func verdict(_ job: Job, _ captured: CaptureRecord?, _ outcome: Outcome) -> Verdict {
        if case .skipped = outcome { return .skipped }
        guard let captured else { return .unanswered }
        let capturedError = captured.flags.contains(.failed) ? (try? codec.decode(CanopyError.self, from: captured.body)) : nil
        switch outcome {
        case .skipped:
            return .skipped
        case .failure(let error):
            if let capturedError, capturedError.code == error.code { return .matched } // same refusal (messages may name ids)
            if Self.unanswering.contains(error.code) { return .failed("\(error.code.rawValue): \(error.message)") }
            let was = capturedError.map { "error \($0.code.rawValue)" } ?? "an answer"
            return .differed([Difference(path: "$", captured: was, replayed: "error \(error.code.rawValue): \(error.message.prefix(200))")])
        case .answer(let body, let attachments):
            if let capturedError {
                return .differed([Difference(path: "$", captured: "error \(capturedError.code.rawValue)", replayed: "an answer")])
            }
            if body != captured.body {
                // Ids first: what this answer teaches explains its own differences too.
                if let left = try? JSONSerialization.jsonObject(with: Data(captured.body), options: [.fragmentsAllowed]),
                   let right = try? JSONSerialization.jsonObject(with: Data(body), options: [.fragmentsAllowed]) {
                    rebindings.learn(captured: left, replayed: right)
                }
            }
            var differences = ReplyComparison.differences(captured: captured.body, replayed: body, ignored: ignored, rebindings: rebindings,
                                                          times: timeWindow(job, captured: captured), timed: &timeFields)
            if !captured.flags.contains(.attachmentsOmitted) {
                for index in 0..<max(captured.attachments.count, attachments.count) {
                    let left = index < captured.attachments.count ? captured.attachments[index] : nil
                    let right = index < attachments.count ? attachments[index] : nil
                    if left != right && !ignored.contains(["attachments", "\(index)"]) {
                        differences.append(Difference(path: "$attachments[\(index)]", captured: left.map { "\($0.count) bytes" } ?? "(absent)",
                                                      replayed: right.map { "\($0.count) bytes, other bytes" } ?? "(absent)"))
                    }
                }
            }
            return differences.isEmpty ? .matched : .differed(differences)
        }
    }

    private func finish(ending: String) -> ReplayReport {
        var report = self.report
        report.rebound = rebindings.count
        let elapsed = ContinuousClock.now - started
        report.seconds = elapsed.seconds
        report.requestsPerSecond = report.seconds > 0 ? Double(report.requests) / report.seconds : 0
        if replayed.totalCount > 0 {
            report.replayedP50Micros = replayed.valueAtPercentile(50)
            report.replayedP99Micros = replayed.valueAtPercentile(99)
        }
        if capturedLatency.totalCount > 0 {
            report.capturedP50Micros = capturedLatency.valueAtPercentile(50)
            report.capturedP99Micros = capturedLatency.valueAtPercentile(99)
        }
        report.ending = ending
        report.timeFields = timeFields.sorted()
        return report
    }
}
