import CZeroMQ
import CanopyBus
import CanopyCapture
import CanopyWire
import Foundation

/// The replay's IO shell, owned by one thread: the capture's reader, the DEALER connections
/// to the stack's broker and the answers' file, around a ``ReplaySchedule`` that decides
/// everything else.
struct ReplayEngine {
    private let options: ReplayOptions
    private let context: ZMQContext
    private let sockets: [ZMQSocket]
    private var poller = Poller()

    init(connection: Replayer.Connection, options: ReplayOptions) throws {
        self.options = options
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

    /// Reads `reader` while the window has room, sends what the schedule says, takes the
    /// answers, and ends once the capture is read and every request answered or given up on.
    mutating func run(_ reader: CaptureReader, progress: (ReplayProgress) -> Void) throws -> ReplayReport {
        defer { sockets.forEach { $0.close() } }
        var answers = try options.answersPath.map {
            try CaptureFileWriter(path: $0, pseudonymized: reader.header.pseudonymized, withoutAttachments: reader.header.withoutAttachments)
        }
        var schedule = ReplaySchedule(options: options, connections: sockets.count, now: .now, wall: CaptureWriter.wallClockNanoseconds())
        /// Why writing the answers failed, reported when the replay ends (the replay goes on).
        var answersError: Error?
        /// Carries out what the schedule asks, until it asks nothing more (a failed send
        /// settles its request, which may write its answer).
        func carryOut(_ schedule: inout ReplaySchedule) throws {
            var directives = schedule.directives()
            while !directives.isEmpty {
                defer { directives = schedule.directives() }
                for directive in directives {
                    switch directive {
                    case .send(let socket, let frames, let job):
                        guard let job else {
                            _ = try? sockets[socket].send(frames) // the replay's own broker.stats: asked again if lost
                            continue
                        }
                        if try !sockets[socket].send(frames) { schedule.sendFailed(job, now: .now) }
                    case .write(let record):
                        guard answersError == nil else { continue }
                        do { try answers?.append(record) } catch { answersError = error }
                    }
                }
            }
        }
        func report(_ schedule: ReplaySchedule) {
            progress(ReplayProgress(bytesRead: reader.bytesRead, sent: schedule.sentCount, completed: schedule.completedCount))
        }

        var readerDone = false
        var lastTimeoutScan = ContinuousClock.now
        var recordsRead = 0
        while true {
            // Read while the window has room (a bounded batch, so answers keep being taken).
            var budget = 1_024
            while !readerDone, schedule.outstandingCount < options.window, budget > 0 {
                guard let record = try? reader.next() else {
                    readerDone = true
                    schedule.endOfCapture()
                    break
                }
                budget -= 1
                recordsRead += 1
                schedule.take(record)
                if recordsRead % 4_096 == 0 { report(schedule) }
            }
            let now = ContinuousClock.now
            schedule.tick(now: now, wall: CaptureWriter.wallClockNanoseconds())
            try carryOut(&schedule)
            if readerDone && schedule.isIdle { break }

            try poller.poll(timeout: schedule.wait(now: now, reading: !readerDone && schedule.outstandingCount < options.window))
            for socket in sockets {
                while let frames = try socket.receive(dontWait: true) { schedule.answer(frames, now: .now) }
            }
            if now - lastTimeoutScan >= .milliseconds(50) {
                lastTimeoutScan = now
                schedule.expire(now: now)
            }
            try carryOut(&schedule)
        }
        report(schedule)
        if let answersError { throw answersError }
        schedule.writeAnswers()
        try carryOut(&schedule)
        if let answersError { throw answersError }
        try answers?.close()
        return schedule.finish(ending: reader.ending?.description ?? "complete", now: .now)
    }
}
