import CanopyBroker
import CanopyBus
import CanopyCapture
import CanopyMessages
import CanopyReplay
import CanopyServiceKit
import CanopyTesting
import Foundation
import Synchronization
import Testing

/// A stateful service for replay tests: `notes.create` makes a note with a new random id;
/// `notes.get` answers it by id, for its owner only.
struct NotesService: BusService {
    struct Note: Codable, Sendable, Equatable {
        var id: String
        var text: String
    }

    struct GetRequest: Codable, Sendable { var id: String }

    enum Create: BusOperation {
        typealias Request = Note
        typealias Reply = Note
        static let service = "notes"
        static let name = "create"
    }

    enum Get: BusOperation {
        typealias Request = GetRequest
        typealias Reply = Note
        static let service = "notes"
        static let name = "get"
        static let idempotent = true
    }

    /// What `get` adds to every text (a "new version" of the service changes it).
    var suffix = ""
    final class Store: Sendable {
        let notes = Mutex<[String: (owner: String, note: Note)]>([:])
    }

    let store = Store()
    var name: String { "notes" }

    func register(_ handlers: inout OperationHandlers) {
        let notes = store
        handlers.on(Create.self) { request, owner, _ in
            let note = Note(id: UUID().uuidString, text: request.text)
            notes.notes.withLock { $0[note.id] = (owner, note) }
            return note
        }
        handlers.on(Get.self) { [suffix] request, owner, _ in
            guard var note = notes.notes.withLock({ $0[request.id] }).flatMap({ $0.owner == owner ? $0.note : nil }) else {
                throw CanopyError(.notFound, "no note \(request.id)")
            }
            note.text += suffix
            return note
        }
    }
}

@Suite(.serialized)
struct ReplayTests {
    /// The live test bus with patient heartbeats (3 s before a peer counts as gone): these
    /// tests compare answers, not expiry, and on a loaded machine a runner that stalled past
    /// the usual 1 s registered again and its requests in the air were answered `workerLost`.
    static var patientBus: BrokerConfiguration {
        var configuration = BrokerConfiguration.testing
        configuration.liveness = 30
        return configuration
    }

    /// Captures a scripted session on one stack: two people create notes and read them back,
    /// with echoes and an error between.
    static func captureSession(into path: String) async throws {
        var configuration = patientBus
        configuration.capture = CaptureSettings(path: path)
        try await withLiveBus(configuration: configuration) { bus in
            bus.startWorker(name: "w1")
            bus.startRunner(NotesService())
            try await bus.waitForWorkers(1)
            try await bus.waitForWorkers(1, service: "notes")
            let client = try bus.client()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for person in ["ana", "ben"] {
                    group.addTask {
                        for index in 0..<5 {
                            let note = try await client.call(NotesService.Create.self, .init(id: "", text: "\(person) \(index)"), principal: person)
                            _ = try await client.call(NotesService.Get.self, .init(id: note.id), principal: person)
                            _ = try await client.call(TestService.Echo.self, .init(text: "\(person) \(index)"), principal: person)
                        }
                        // Someone else's note is not found, in the capture and again in the replay.
                        await #expect(throws: CanopyError.self) { _ = try await client.call(NotesService.Get.self, .init(id: "nobody's"), principal: person) }
                    }
                }
                try await group.waitForAll()
            }
            _ = try await client.call(Broker.CaptureStop.self, .init())
        }
    }

    /// Replays `path` against a fresh stack whose notes service adds `suffix` to every text.
    static func replay(_ path: String, suffix: String = "", options: ReplayOptions = ReplayOptions()) async throws -> ReplayReport {
        try await withLiveBus(configuration: patientBus) { bus in
            bus.startWorker(name: "w1")
            bus.startRunner(NotesService(suffix: suffix))
            try await bus.waitForWorkers(1)
            try await bus.waitForWorkers(1, service: "notes")
            return try await Replayer(connection: .init(endpoint: bus.endpoint), options: options).run(try CaptureReader(path: path))
        }
    }

    @Test func aCaptureReplaysAgainstAFreshStackWithZeroDifferencesRebindingNewIds() async throws {
        let path = CaptureFormatTests.temporaryPath("session")
        try await Self.captureSession(into: path)
        var options = ReplayOptions()
        options.pacing = .recorded(speed: 4)
        // The recorded 10 s deadline once passed for the first two requests amid the whole
        // suite (its p50 was 350 ms): what is compared here is the answers, not the speed.
        options.timeout = .seconds(60)
        let report = try await Self.replay(path, options: options)
        #expect(report.requests == 32)
        #expect(report.matched == 32, "\(report.examples)")
        #expect(report.differed == 0 && report.failed == 0)
        #expect(report.rebound == 10, "each created note's new id was learned")
        #expect(report.isClean)
        #expect(report.capturedP50Micros > 0 && report.replayedP50Micros > 0)
    }

    @Test func withoutRebindingTheReadsOfNewNotesWouldFailSoTheRebindingIsWhatMakesThemMatch() async throws {
        let path = CaptureFormatTests.temporaryPath("session")
        try await Self.captureSession(into: path)
        // A capture whose creates were left out: the reads name ids the fresh stack never made.
        let reads = CaptureFormatTests.temporaryPath("reads")
        let reader = try CaptureReader(path: path)
        var writer = try CaptureFileWriter(path: reads, pseudonymized: false, withoutAttachments: false)
        while let record = try reader.next() {
            if record.operation != "create" { try writer.append(record) }
        }
        try writer.close()
        var options = ReplayOptions()
        options.pacing = .fast
        let report = try await Self.replay(reads, options: options)
        #expect(report.differed == 10)
        #expect(report.rebound == 0)
        let difference = try #require(report.examples.first { $0.operation == "get" }?.differences.first)
        #expect(difference.path == "$" && difference.replayed.hasPrefix("error notFound"))
    }

    @Test func aChangedAnswerIsCaughtAndShownAsAJSONPath() async throws {
        let path = CaptureFormatTests.temporaryPath("session")
        try await Self.captureSession(into: path)
        var options = ReplayOptions()
        options.pacing = .fast
        let report = try await Self.replay(path, suffix: " (v2)", options: options)
        #expect(report.differed == 10)
        #expect(report.matched == 22)
        #expect(!report.isClean)
        let example = try #require(report.examples.first)
        #expect(example.service == "notes" && example.operation == "get")
        #expect(example.differences.count == 1)
        #expect(example.differences[0].path == "$.text")
        #expect(example.differences[0].replayed.hasSuffix(#" (v2)""#))
        // Ignoring the field makes the same replay clean.
        options.ignore = ["text"]
        let ignoring = try await Self.replay(path, suffix: " (v2)", options: options)
        #expect(ignoring.isClean && ignoring.matched == 32)
    }

    @Test func aDryRunReportsWhatWouldBeSentAndWhatIsWrong() throws {
        let path = CaptureFormatTests.temporaryPath("capture")
        var early = CaptureFormatTests.request(5)
        early.time -= 10_000_000 // earlier than the record before it
        var photo = CaptureFormatTests.request(6, attachments: [[1, 2, 3]])
        photo.flags.insert(.attachmentsOmitted)
        photo.attachments = []
        try CaptureFormatTests.write([CaptureFormatTests.request(1), CaptureFormatTests.reply(1), CaptureFormatTests.reply(0), early, photo], to: path)
        let check = try ReplayCheck.make(try CaptureReader(path: path), offered: ["care.plants.get"])
        #expect(check.requests == 3 && check.answers == 2)
        #expect(check.operations == ["care.plants.get": 3])
        #expect(check.outOfOrder == 2) // the answer without its request, and the request moved back
        #expect(check.missingAnswers == 2)
        #expect(check.answersWithoutRequest == 1)
        #expect(check.attachmentsOmitted == 1)
        #expect(check.unknownOperations.isEmpty)
        #expect(check.problems.count == 3)
        let strict = try ReplayCheck.make(try CaptureReader(path: path), offered: ["images.put"])
        #expect(strict.unknownOperations == ["care.plants.get"])
    }

    @Test func comparisonSkipsIgnoredPathsAndExplainsReboundIds() {
        var rebindings = Rebindings()
        rebindings.learn(
            captured: ["plant": ["id": "old-1", "name": "Fern"], "photoIDs": ["a", "b"]] as [String: Any],
            replayed: ["plant": ["id": "new-1", "name": "Fern"], "photoIDs": ["a", "c"]] as [String: Any])
        #expect(rebindings.table == ["old-1": "new-1", "b": "c"])
        #expect(
            String(decoding: rebindings.rewrite(Array(#"{"ids":["old-1","x"],"plantID":"old-1"}"#.utf8)), as: UTF8.self)
                == #"{"ids":["new-1","x"],"plantID":"new-1"}"#)
        let untouched = Array(#"{"b" : 1}"#.utf8)
        #expect(rebindings.rewrite(untouched) == untouched)
        let captured = Array(#"{"plant":{"addedAt":1,"id":"old-1","name":"Fern"},"tasks":[{"due":5},{"due":6}]}"#.utf8)
        let replayed = Array(#"{"plant":{"addedAt":2,"id":"new-1","name":"Ivy"},"tasks":[{"due":7},{"due":6}],"extra":true}"#.utf8)
        let found = ReplyComparison.differences(captured: captured, replayed: replayed, ignored: IgnoredPaths(["addedAt"]), rebindings: rebindings)
        #expect(
            found == [
                Difference(path: "$.extra", captured: "(absent)", replayed: "true"),
                Difference(path: "$.plant.name", captured: #""Fern""#, replayed: #""Ivy""#),
                Difference(path: "$.tasks[0].due", captured: "5", replayed: "7"),
            ])
        #expect(
            ReplyComparison.differences(
                captured: captured, replayed: replayed,
                ignored: IgnoredPaths(["addedAt", "$.plant.name", "tasks[*].due", "extra"]), rebindings: rebindings
            ).isEmpty)
    }

    /// Times are compared as times: a date-time moved by the request's clock shift (give or
    /// take the requests' own time) is the same, and the paths where that happened are named.
    @Test func timesThatDifferByTheClockShiftAreTheSameAndNamed() {
        let hour: Int64 = 3_600_000_000_000
        let window = TimeWindow(shift: 72 * hour, below: 5_000_000, above: 8_000_000)
        let captured = Array(
            #"{"plant":{"dateAdded":"2026-11-24T09:00:00.000Z"},"tasks":[{"due":"2026-11-25T09:00:00.000Z"},{"due":"2026-11-26T09:00:00.000Z"}],"day":"2026-11-24"}"#
                .utf8)
        // Three days later, 7 ms into the request; one task two hours further off; a date alone is text.
        let replayed = Array(
            #"{"plant":{"dateAdded":"2026-11-27T09:00:00.007Z"},"tasks":[{"due":"2026-11-28T09:00:00.000Z"},{"due":"2026-11-29T11:00:00.000Z"}],"day":"2026-11-27"}"#
                .utf8)
        var timed = Set<String>()
        let found = ReplyComparison.differences(
            captured: captured, replayed: replayed, ignored: IgnoredPaths([]), rebindings: Rebindings(),
            times: window, timed: &timed)
        #expect(found.map(\.path) == ["$.day", "$.tasks[1].due"])
        #expect(timed == ["$.plant.dateAdded", "$.tasks[*].due"])
        // Outside the window on either side, and without a window, times are text.
        #expect(!window.explains(captured: 0, replayed: 72 * hour - 6_000_000))
        #expect(!window.explains(captured: 0, replayed: 72 * hour + 9_000_000))
        #expect(ReplyComparison.differences(captured: captured, replayed: replayed, ignored: IgnoredPaths([]), rebindings: Rebindings()).count == 4)
        #expect(WireTime.nanoseconds("2026-11-24T09:00:00+02:00") == WireTime.nanoseconds("2026-11-24T07:00:00.000Z"))
        #expect(WireTime.nanoseconds("2026-11-24") == nil && WireTime.nanoseconds("not a time at all, though long") == nil)
    }

    /// An id made of learned ids (a task's `PLANT:water`) is rebound part by part, and put
    /// back whole for another replay to compare against.
    @Test func compositeIdsAreReboundByTheirPartsAndRestored() {
        var rebindings = Rebindings()
        rebindings.learn(captured: ["plant": ["id": "5f1d2c3b-old"]] as [String: Any], replayed: ["plant": ["id": "9e8a7b6c-new"]] as [String: Any])
        #expect(String(decoding: rebindings.rewrite(Array(#"{"taskID":"5f1d2c3b-old:water"}"#.utf8)), as: UTF8.self) == #"{"taskID":"9e8a7b6c-new:water"}"#)
        // Learning a list in another order does not learn a composite whole.
        rebindings.learn(
            captured: ["tasks": [["id": "5f1d2c3b-old:rotate"]]] as [String: Any], replayed: ["tasks": [["id": "9e8a7b6c-new:water"]]] as [String: Any])
        #expect(rebindings.count == 1)
        let found = ReplyComparison.differences(
            captured: Array(#"{"tasks":[{"id":"5f1d2c3b-old:water"},{"id":"5f1d2c3b-old:rotate"}]}"#.utf8),
            replayed: Array(#"{"tasks":[{"id":"9e8a7b6c-new:water"},{"id":"9e8a7b6c-new:water"}]}"#.utf8),
            ignored: IgnoredPaths([]), rebindings: rebindings)
        #expect(found.map(\.path) == ["$.tasks[1].id"], "the first is explained by its part, the second differs for real")
        #expect(
            String(decoding: rebindings.restore(Array(#"{"ids":["9e8a7b6c-new","9e8a7b6c-new:mist","x"]}"#.utf8)), as: UTF8.self)
                == #"{"ids":["5f1d2c3b-old","5f1d2c3b-old:mist","x"]}"#)
    }

    /// A fresh replay stack's clock: the cut at one instant of the system clock, whenever
    /// each process parsed it.
    @Test func aClockAnchoredAtAnInstantShowsTheCutThenAndRuns() throws {
        let cut = Date(timeIntervalSince1970: 1_780_300_800) // 2026-06-01T08:00:00Z
        let at = Date().addingTimeInterval(10)
        let format = Date.ISO8601FormatStyle(includingFractionalSeconds: true)
        let clock = try #require(ServiceClock(parsing: "from:\(cut.formatted(format)),at:\(at.formatted(format))"))
        #expect(abs(clock.now().timeIntervalSince(cut) + 10) < 0.5, "ten seconds before the anchor, the clock is ten seconds before the cut")
        #expect(ServiceClock(parsing: "from:2026-06-01T08:00:00Z,at:soon") == nil)
        #expect(ServiceClock(parsing: "from:2026-06-01T08:00:00Z,since:2026-06-01T08:00:00Z") == nil)
        #expect(ServiceClock(parsing: "fixed:2026-06-01T08:00:00Zjunk") == nil)
    }
}
