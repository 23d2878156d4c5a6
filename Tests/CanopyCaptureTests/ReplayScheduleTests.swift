import CanopyCapture
import CanopyMessages
import CanopyWire
import Testing

@testable import CanopyReplay

/// ``ReplaySchedule`` on its own: captured records and made-up answers in, frames and
/// answer records out, no socket, file or stack.
struct ReplayScheduleTests {
    static let start = ContinuousClock.now
    static let captured: Int64 = 1_700_000_000_000_000_000

    static func request(_ index: Int, client: String = "c-1", at offset: Int64 = 0, body: String) -> CaptureRecord {
        CaptureRecord(
            kind: .request, time: captured + offset, client: client, service: "notes", operation: "get", correlation: [UInt8(index)],
            header: RequestHeader(timeoutMilliseconds: 5_000, principal: "alice"), body: Array(body.utf8))
    }

    static func reply(_ index: Int, client: String = "c-1", at offset: Int64 = 1_000, body: String) -> CaptureRecord {
        CaptureRecord(
            kind: .reply, time: captured + offset, latencyNanoseconds: 1_000, client: client, service: "notes", operation: "get",
            correlation: [UInt8(index)], header: RequestHeader(timeoutMilliseconds: 5_000, principal: "alice"), body: Array(body.utf8))
    }

    /// The requests the directives send: (connection, job id, body).
    static func sends(_ directives: [ReplaySchedule.Directive]) -> [(socket: Int, job: UInt64, body: String)] {
        directives.compactMap { directive in
            guard case .send(let socket, let frames, let job?) = directive, case .request(let request)? = try? WireMessage(frames: frames) else { return nil }
            return (socket, job, String(decoding: request.body, as: UTF8.self))
        }
    }

    static func answer(_ job: UInt64, _ body: String) -> [[UInt8]] {
        WireMessage.reply(correlation: Wire.frame(job), shared: false, body: Array(body.utf8)).encoded
    }

    @Test func aClientsRequestWaitsForTheAnswersItHadAndEachAnswerIsCompared() {
        var options = ReplayOptions()
        options.pacing = .fast
        var schedule = ReplaySchedule(options: options, connections: 2, now: Self.start, wall: Self.captured)
        // c-1 sent its second request after its first was answered; c-2's goes at once.
        schedule.take(Self.request(1, body: #"{"id":"n1"}"#))
        schedule.take(Self.reply(1, body: #"{"id":"n1","text":"water"}"#))
        schedule.take(Self.request(2, at: 2_000, body: #"{"id":"n1","again":true}"#))
        schedule.take(Self.reply(2, at: 3_000, body: #"{"id":"n1","text":"water"}"#))
        schedule.take(Self.request(3, client: "c-2", at: 500, body: #"{"id":"n2"}"#))
        schedule.endOfCapture()
        schedule.tick(now: Self.start, wall: Self.captured)
        let first = Self.sends(schedule.directives()).sorted { $0.body < $1.body }
        #expect(first.map(\.body) == [#"{"id":"n1"}"#, #"{"id":"n2"}"#], "c-1's second request waits for its first's answer")
        #expect(Set(first.map(\.socket)) == [0, 1], "the two clients' lanes are spread over the connections")
        #expect(schedule.sentCount == 2 && !schedule.isIdle)

        schedule.answer(Self.answer(first[0].job, #"{"id":"n1","text":"water"}"#), now: Self.start + .milliseconds(1))
        schedule.tick(now: Self.start + .milliseconds(1), wall: Self.captured + 1_000_000)
        let second = Self.sends(schedule.directives())
        #expect(second.map(\.body) == [#"{"id":"n1","again":true}"#])
        schedule.answer(Self.answer(second[0].job, #"{"id":"n1","text":"repot"}"#), now: Self.start + .milliseconds(2))
        schedule.answer(Self.answer(first[1].job, #"{"id":"n2"}"#), now: Self.start + .milliseconds(2))
        #expect(schedule.isIdle)

        let report = schedule.finish(ending: "complete", now: Self.start + .milliseconds(3))
        #expect(report.requests == 3)
        #expect(report.matched == 1, "n1's first answer matched")
        #expect(report.differed == 1, "n1's second answer says repot where the capture said water")
        #expect(report.unanswered == 1, "c-2's request has no captured answer")
        #expect(report.examples.first?.differences.map(\.path) == ["$.text"])
    }

    @Test func requestsGoAtTheirCapturedTimesAndAStackThatDoesNotAnswerTimesOut() {
        var options = ReplayOptions()
        options.pacing = .recorded(speed: 1)
        options.timeout = .milliseconds(100)
        var schedule = ReplaySchedule(options: options, connections: 1, now: Self.start, wall: Self.captured)
        schedule.take(Self.request(1, body: "{}"))
        schedule.take(Self.request(2, client: "c-2", at: 40_000_000, body: "{}"))
        schedule.endOfCapture()
        schedule.tick(now: Self.start, wall: Self.captured)
        #expect(Self.sends(schedule.directives()).count == 1, "the second goes 40 ms after the first, as captured")
        #expect(schedule.wait(now: Self.start, reading: false) <= .milliseconds(40))
        schedule.tick(now: Self.start + .milliseconds(40), wall: Self.captured + 40_000_000)
        #expect(Self.sends(schedule.directives()).count == 1)

        schedule.expire(now: Self.start + .seconds(2))
        #expect(schedule.isIdle)
        let report = schedule.finish(ending: "complete", now: Self.start + .seconds(2))
        #expect(report.unanswered == 2, "no captured answers to compare with")
        #expect(report.requests == 2)
    }

    @Test func aFullQueueAnswersTheRequestBusyAndTheAnswersAreWrittenInCapturedOrder() {
        var options = ReplayOptions()
        options.pacing = .fast
        options.answersPath = "/unused" // the schedule only says what to write
        var schedule = ReplaySchedule(options: options, connections: 1, now: Self.start, wall: Self.captured)
        schedule.take(Self.request(1, body: "{}"))
        schedule.take(Self.reply(1, body: #"{"ok":true}"#))
        schedule.take(Self.request(2, client: "c-2", body: "{}"))
        schedule.take(Self.reply(2, client: "c-2", body: #"{"ok":true}"#))
        schedule.endOfCapture()
        schedule.tick(now: Self.start, wall: Self.captured)
        let sent = Self.sends(schedule.directives()).sorted { $0.job < $1.job }
        #expect(sent.count == 2)
        // The second answers first; its answer is written only once the first's is.
        schedule.answer(Self.answer(sent[1].job, #"{"ok":true}"#), now: Self.start + .milliseconds(1))
        #expect(schedule.directives().isEmpty)
        schedule.sendFailed(sent[0].job, now: Self.start + .milliseconds(1))
        let written = schedule.directives().compactMap { directive -> CaptureRecord? in
            if case .write(let record) = directive { return record }
            return nil
        }
        #expect(written.map(\.kind) == [.request, .reply, .request, .reply])
        #expect(written.map(\.client) == ["c-1", "c-1", "c-2", "c-2"])
        #expect(written[1].flags.contains(.failed), "the request that could not go is answered busy")
        let report = schedule.finish(ending: "complete", now: Self.start + .milliseconds(2))
        #expect(report.failed == 1 && report.matched == 1)
        #expect(schedule.sentCount == 1)
    }
}
