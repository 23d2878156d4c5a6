import CanopyBus
import CanopyCapture
import CanopyMessages
import CanopyWire
import DequeModule
import Foundation
import HeapModule
import Histogram

/// The replay's schedule, without IO: captured records and the stack's answers go in, with
/// the time; frames to send and answer records to write come out (``Directive``). It owns no
/// socket, file or clock, so tests drive it with made-up records and answers and no stack;
/// ``ReplayEngine`` is the IO shell around it (the capture's reader, the sockets, the answers'
/// file), as ``BusClient`` is around ``ClientSession``.
///
/// Each captured client is a lane: its requests go in captured order, each after the answers
/// its client had received before sending it; with ``ReplayOptions/causalOrder`` also after
/// every answer the capture held before it, and the background work the capture saw done.
struct ReplaySchedule {
    /// Something the shell must do.
    enum Directive {
        /// Send `frames` on connection `socket`; `job` is the request's id (nil for the
        /// replay's own `broker.stats`). When the connection's queue is full, the shell says so
        /// with ``sendFailed(_:now:)``.
        case send(socket: Int, frames: [[UInt8]], job: UInt64?)
        /// Append `record` to the answers' capture (``ReplayOptions/answersPath``).
        case write(CaptureRecord)
    }

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
    /// How many connections the lanes are spread over.
    private let connections: Int
    private let codec = MessageCodec()
    /// What the calls of the moment ask the shell to do (handed over by ``take(_:)``'s callers).
    private var out: [Directive] = []

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
    private let started: ContinuousClock.Instant
    private var firstTime: Int64?
    private var requestIndex = 0

    /// Whether each answer is the captured one, and what answers teach (ids, time fields).
    private var check: AnswerCheck
    private var report = ReplayReport()
    /// Whether this replay's answers are written as a capture (``ReplayOptions/answersPath``),
    /// in the captured order: requests wait in ``answerOrder`` until those before them are done.
    private let writesAnswers: Bool
    private var answerOrder = Deque<Job>()
    private var replayed = Histogram<UInt64>(highestTrackableValue: 3_600_000_000, numberOfSignificantValueDigits: .two)
    private var capturedLatency = Histogram<UInt64>(highestTrackableValue: 3_600_000_000, numberOfSignificantValueDigits: .two)
    private var sent = 0

    /// - Parameters:
    ///   - connections: how many connections the lanes are spread over.
    ///   - now: when the replay starts; with an anchored clock, `wall` (ns since 1970) places
    ///     the first request at its distance from the capture's start after the anchor.
    init(options: ReplayOptions, connections: Int, now: ContinuousClock.Instant, wall: Int64) {
        self.options = options
        check = AnswerCheck(ignore: options.ignore, timeTolerance: options.timeTolerance)
        self.connections = max(1, connections)
        writesAnswers = options.answersPath != nil
        if case .anchored(let captureTime, let at) = options.clock {
            started = now + .nanoseconds(Int64((at.timeIntervalSince1970 * 1e9).rounded()) - wall)
            firstTime = captureTime
        } else {
            started = now
        }
    }

    /// Requests read whose answer from the stack has not come yet (the shell reads more while
    /// this is under ``ReplayOptions/window``).
    var outstandingCount: Int { outstanding }

    /// Requests sent so far.
    var sentCount: Int { sent }

    /// Requests compared so far.
    var completedCount: Int { report.requests }

    /// Whether every request read has been sent and answered (or given up on).
    var isIdle: Bool { inFlight.isEmpty && unsent == 0 }

    /// How long the shell may wait for an answer before calling ``tick(now:)`` again.
    /// `reading`: whether it still has records to read with room in the window (then it only polls).
    func wait(now: ContinuousClock.Instant, reading: Bool) -> Duration {
        var timeout: Duration = reading ? .zero : .milliseconds(50)
        if let wake = sleeping.compactMap({ $0.unsent.first?.sendAt }).min() { timeout = min(timeout, max(.zero, wake - now)) }
        if !waitingForBackground.isEmpty { timeout = min(timeout, .milliseconds(5)) }
        return timeout
    }

    /// Takes the directives the calls so far produced.
    mutating func directives() -> [Directive] {
        defer { out.removeAll(keepingCapacity: true) }
        return out
    }

    /// Sends what is ready at `now` (`wall`: the same instant by the wall clock, ns since 1970).
    mutating func tick(now: ContinuousClock.Instant, wall: Int64) {
        if !waitingForBackground.isEmpty, let asked = statsAskedAt, now - asked >= .milliseconds(100) {
            // No counts came (a lost answer): look again, and ask again.
            for lane in waitingForBackground { markDirty(lane) }
            waitingForBackground.removeAll(keepingCapacity: true)
        }
        sendReady(now: now, wall: wall)
    }

    /// The connection's queue was full: the request is answered `busy`.
    mutating func sendFailed(_ id: UInt64, now: ContinuousClock.Instant) {
        guard let job = inFlight.removeValue(forKey: id) else { return }
        sent -= 1
        // It never went: no latency to count, no deadline, and its time stays the captured one.
        job.sentAt = nil
        job.sentWall = 0
        job.deadline = nil
        settle(outcome: .failure(CanopyError(.busy, "the replay's connection queue is full")), for: job, now: now)
    }

    /// The report once the shell is done (`seconds`: since the start).
    func finish(ending: String, now: ContinuousClock.Instant) -> ReplayReport {
        var report = self.report
        report.rebound = check.rebindings.count
        report.seconds = (now - started).seconds
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
        report.timeFields = check.timeFields.sorted()
        return report
    }

    // MARK: - Reading

    /// A record read from the capture.
    mutating func take(_ record: CaptureRecord) {
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
            let sendAt: ContinuousClock.Instant? =
                switch options.pacing {
                case .recorded(let speed): started + .nanoseconds(Int64(Double(max(0, record.time - first)) / speed))
                case .rate(let rate): started + .nanoseconds(Int64(Double(requestIndex) / rate * 1e9))
                case .fast: nil
                }
            requestIndex += 1
            let lane =
                lanes[record.client]
                ?? {
                    let lane = Lane(socket: lanes.count % connections)
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
            if writesAnswers { answerOrder.append(job) }
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
    mutating func endOfCapture() {
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

    private mutating func sendReady(now: ContinuousClock.Instant, wall: Int64) {
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
                send(job, now: now, wall: wall)
            }
        }
    }

    private mutating func send(_ job: Job, now: ContinuousClock.Instant, wall: Int64) {
        let record = job.record
        if record.flags.contains(.attachmentsOmitted) {
            settle(outcome: .skipped, for: job, now: now)
            return
        }
        let timeout = options.timeout ?? (record.header.timeoutMilliseconds > 0 ? .milliseconds(Int64(record.header.timeoutMilliseconds)) : .seconds(30))
        var header = record.header
        header.timeoutMilliseconds = UInt32(clamping: max(1, timeout.wholeMilliseconds))
        header.trace = nil // a replayed request is not part of the trace it was recorded in
        let frames = WireMessage.request(
            WireRequest(
                correlation: Wire.frame(job.id), service: record.service, operation: record.operation, header: header,
                body: check.rebindings.rewrite(record.body), attachments: record.attachments)
        ).encoded
        out.append(.send(socket: job.lane.socket, frames: frames, job: job.id))
        sent += 1
        job.sentAt = now
        job.sentWall = wall
        job.deadline = now + timeout + .seconds(1) // the broker answers timeout itself first
        inFlight[job.id] = job
    }

    // MARK: - Answers

    /// A message from the stack on one of the connections.
    mutating func answer(_ frames: [[UInt8]], now: ContinuousClock.Instant) {
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
    mutating func expire(now: ContinuousClock.Instant) {
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
        let shift = job.sentWall == 0 ? nil : stackTime(job) - job.record.time
        let verdict = check.verdict(outcome, captured: job.captured, took: job.took, clockShift: shift)
        switch verdict {
        case .matched: report.matched += 1
        case .skipped: report.skipped += 1
        case .unanswered: report.unanswered += 1
        case .differed(let differences):
            report.differed += 1
            example(job.record, failure: nil, differences)
            for path in Set(differences.map { AnswerCheck.pattern($0.path) }) {
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
        writeAnswers()
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
        let frames = WireMessage.request(
            WireRequest(
                correlation: Self.statsCorrelation, service: Broker.service, operation: Broker.Stats.name,
                header: RequestHeader(timeoutMilliseconds: 2_000), body: Array("{}".utf8))
        ).encoded
        out.append(.send(socket: 0, frames: frames, job: nil))
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

    /// Writes the answers of the requests done, up to the first not done (captured order).
    mutating func writeAnswers() {
        guard writesAnswers else { return }
        while let job = answerOrder.first, job.done {
            answerOrder.removeFirst()
            // The request as this replay sent it (at its time by the stack's clock), so that
            // another replay of these answers compares its times with this one's.
            var request = job.record
            if job.sentWall != 0 { request.time = stackTime(job) }
            out.append(.write(request))
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
                (body, attachments) = (check.rebindings.restore(replied), replyAttachments)
            }
            out.append(
                .write(
                    CaptureRecord(
                        kind: .reply, flags: flags, time: request.time + Int64(job.took.nanoseconds),
                        latencyNanoseconds: UInt64(max(0, job.took.nanoseconds)), client: record.client,
                        service: record.service, operation: record.operation, correlation: record.correlation,
                        header: record.header, body: body, attachments: attachments)))
        }
    }

    /// When `job` was sent, by the stack's clock (ns since 1970).
    private func stackTime(_ job: Job) -> Int64 {
        switch options.clock {
        case .system: job.sentWall
        case .anchored(let captureTime, let at): job.sentWall - Int64((at.timeIntervalSince1970 * 1e9).rounded()) + captureTime
        }
    }

    private mutating func example(_ record: CaptureRecord, failure: String?, _ differences: [Difference]) {
        guard report.examples.count < options.examples else { return }
        report.examples.append(
            .init(
                client: record.client, service: record.service, operation: record.operation, time: record.time,
                principal: record.header.principal, failure: failure, differences: differences))
    }
}
