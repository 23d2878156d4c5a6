import CanopyBroker
import CanopyBus
import CanopyCapture
import CanopyMessages
import CanopyTesting
import Foundation
import Testing

/// Capture at a live broker: what it records, and `broker.capture.*`.
@Suite(.serialized)
struct BrokerCaptureTests {
    private struct Pair: Hashable {
        let client: String
        let correlation: [UInt8]
    }

    @Test func theBrokerRecordsEveryRequestAndItsAnswer() async throws {
        let directory = (CaptureFormatTests.temporaryPath("x") as NSString).deletingLastPathComponent
        let path = directory + "/from-start"
        var configuration = BrokerConfiguration.testing
        configuration.capture = CaptureSettings(path: path)
        configuration.captureDirectory = directory
        try await withLiveBus(configuration: configuration) { bus in
            bus.startWorker(name: "w1", credit: 8)
            try await bus.waitForWorkers(1)
            let client = try bus.client()
            _ = try await client.call(TestService.Echo.self, .init(text: "monstera"), principal: "user-1")
            // Three identical lookups at once: one worker call, three answers marked shared.
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<3 {
                    group.addTask { _ = try await client.call(TestService.Lookup.self, .init(text: "same", sleepMilliseconds: 200), principal: "user-1") }
                }
                try await group.waitForAll()
            }
            await #expect(throws: CanopyError.self) { _ = try await client.call(TestService.Fail.self, .init(text: "notFound"), principal: "user-2") }
            await #expect(throws: CanopyError.self) { _ = try await client.call(service: "test", operation: "no-such-operation", body: Array("{}".utf8)) }

            let status = try await client.call(Broker.CaptureStop.self, .init())
            #expect(!status.capturing)
            #expect(status.path == path)
            #expect(status.records == 12) // six requests, six answers; broker.* calls are not captured
            #expect(status.dropped == 0)

            let (records, reader) = try CaptureFormatTests.readAll(path)
            #expect(reader.ending == .complete)
            #expect(records.count == 12)
            let requests = records.filter { $0.kind == .request }, answers = records.filter { $0.kind == .reply }
            #expect(requests.count == 6 && answers.count == 6)
            // Every answer pairs with a request of the same client and correlation id, and comes after it.
            for answer in answers {
                let request = requests.first {
                    Pair(client: $0.client, correlation: $0.correlation) == Pair(client: answer.client, correlation: answer.correlation)
                }
                #expect(request != nil)
                #expect(request.map { $0.time <= answer.time } == true)
                #expect(request?.operation == answer.operation && request?.header.principal == answer.header.principal)
            }
            #expect(Set(records.map(\.client)).count == 1 && records[0].client.hasPrefix("c-"))
            #expect(!records.contains { $0.service == Broker.service })

            let echo = try #require(answers.first { $0.operation == "echo" })
            #expect(echo.worker.hasPrefix("w-"))
            #expect(echo.latencyNanoseconds > 0)
            #expect(!echo.flags.contains(.failed))
            #expect(try MessageCodec().decode(TestService.Reply.self, from: echo.body).text == "monstera")
            let lookups = answers.filter { $0.operation == "lookup" }
            #expect(lookups.count == 3 && lookups.allSatisfy { $0.flags.contains(.shared) })
            #expect(lookups.allSatisfy { $0.latencyNanoseconds >= 150_000_000 })
            let failed = try #require(answers.first { $0.operation == "fail" })
            #expect(failed.flags.contains(.failed))
            #expect(try MessageCodec().decode(CanopyError.self, from: failed.body).code == .notFound)
            #expect(failed.header.principal == "user-2")
            let refused = try #require(answers.first { $0.operation == "no-such-operation" })
            #expect(refused.flags.contains(.failed) && refused.worker.isEmpty, "the broker refused it itself")

            // The summary counts them the same way.
            let summary = try CaptureSummary.make(try CaptureReader(path: path))
            #expect(summary.requests == 6 && summary.replies == 6 && summary.errors == 2)
            #expect(summary.errorCodes == ["notFound": 1, "badRequest": 1])
            #expect(summary.operations.first { $0.operation == "lookup" }?.shared == 3)
        }
    }

    @Test func captureIsStartedAndStoppedOverTheBusOnlyWhereTheBrokerAllowsIt() async throws {
        let directory = (CaptureFormatTests.temporaryPath("x") as NSString).deletingLastPathComponent
        var configuration = BrokerConfiguration.testing
        configuration.captureDirectory = directory
        try await withLiveBus(configuration: configuration) { bus in
            bus.startWorker(name: "w1")
            try await bus.waitForWorkers(1)
            let client = try bus.client()
            #expect(try await client.call(Broker.CaptureStatusOperation.self, .init()).capturing == false)
            for name in ["../escape", "", ".hidden", "a/b", String(repeating: "n", count: 101)] {
                await #expect(throws: CanopyError(.badRequest, "a capture's name is 1 to 100 of A-Z, a-z, 0-9, '.', '-', '_', not starting with '.'")) {
                    _ = try await client.call(Broker.CaptureStart.self, .init(name: name))
                }
            }
            await #expect(throws: CanopyError.self) { _ = try await client.call(Broker.CaptureStop.self, .init()) } // none running

            let started = try await client.call(Broker.CaptureStart.self, .init(name: "tuesday", pseudonymize: true))
            #expect(started.capturing && started.path == directory + "/tuesday")
            await #expect(throws: CanopyError.self) { _ = try await client.call(Broker.CaptureStart.self, .init(name: "another")) } // one at a time
            _ = try await client.call(TestService.Echo.self, .init(text: "fern"), principal: "user-7")
            let stopped = try await client.call(Broker.CaptureStop.self, .init())
            #expect(stopped.records == 2 && !stopped.capturing)
            // A capture started over the bus never overwrites a file.
            await #expect(throws: CanopyError.self) { _ = try await client.call(Broker.CaptureStart.self, .init(name: "tuesday")) }
            #expect(try await client.call(Broker.CaptureStatusOperation.self, .init()) == stopped)
            #expect(try await client.call(Broker.Stats.self, .init()).capture == stopped, "broker.stats carries the capture's counts")
            let (records, reader) = try CaptureFormatTests.readAll(directory + "/tuesday")
            #expect(reader.header.pseudonymized)
            #expect(records.count == 2 && records.allSatisfy { $0.header.principal.hasPrefix("p-") })
        }
        // Without a capture directory, nobody on the bus may make the broker write files.
        try await withLiveBus { bus in
            let client = try bus.client()
            await #expect(throws: CanopyError.self) { _ = try await client.call(Broker.CaptureStart.self, .init(name: "sneaky")) }
        }
    }

    /// A capture started with a hold makes a cut: `capture.start` answers once the requests
    /// in the air are answered; requests that come meanwhile wait (services' own go on),
    /// and go on after `capture.release`, recorded after the mark that names the snapshot.
    @Test func aHoldAnswersAtTheCutHoldsNewRequestsAndReleasesThemAfterTheMark() async throws {
        let name = "hold-\(UInt32.random(in: 0 ... .max))"
        try await withHoldingBus { bus, directory in
            let (client, operator_, service) = (try bus.client(), try bus.client(), try bus.client(asService: true))
            // In the air when the hold begins: answered before the cut.
            let sent = ContinuousClock.now
            let early = Task { try await client.call(TestService.Append.self, .init(text: "early", sleepMilliseconds: 400), principal: "user-1") }
            try await bus.waitForLoad(inFlight: 1)
            // a loaded machine may take seconds between the cut and the release
            let cut = try await operator_.call(Broker.CaptureStart.self, .init(name: name, holdMilliseconds: 30_000), timeout: .seconds(40))
            // (Timed from the request's sending: noticing it is in the air may take a while on a loaded machine.)
            #expect(ContinuousClock.now - sent >= .milliseconds(400), "the cut waits for the request in the air")
            #expect(try await early.value.text == "early")
            #expect(cut.capturing && cut.cutAt != nil)
            // Held: a person's request waits; a service's own goes on.
            let late = Task { try await client.call(TestService.Append.self, .init(text: "late"), principal: "user-1") }
            #expect(try await service.call(TestService.Echo.self, .init(text: "derived"), principal: "user-1").text == "derived")
            #expect(try await eventually { try await operator_.call(Broker.CaptureStatusOperation.self, .init()).held == 1 }, "the person's request is held")
            let released = try await operator_.call(Broker.CaptureRelease.self, .init(snapshot: "\(name).snapshot"))
            #expect(released.held == 0)
            #expect(try await late.value.text == "late")
            await #expect(throws: CanopyError.self) { _ = try await operator_.call(Broker.CaptureRelease.self, .init(snapshot: nil)) } // none in force
            _ = try await operator_.call(Broker.CaptureStop.self, .init())
            let (records, _) = try CaptureFormatTests.readAll(directory + "/" + name)
            let markIndex = try #require(records.firstIndex { $0.kind == .mark })
            let mark = try JSONDecoder().decode(CaptureMark.self, from: Data(records[markIndex].body))
            #expect(mark == CaptureMark(snapshot: "\(name).snapshot", held: 1))
            let own = records.enumerated().filter { $0.element.kind == .request && $0.element.header.flags & RequestHeader.Flag.derived == 0 }
            #expect(
                own.map { String(decoding: $0.element.body, as: UTF8.self).contains("late") } == [true], "only the held request is recorded, after the mark")
            #expect(own.allSatisfy { $0.offset > markIndex })
            #expect(
                !records.contains { $0.kind == .request && String(decoding: $0.body, as: UTF8.self).contains("early") }, "the request before the cut is not")
            // inspect lists the mark; filter keeps it unless it leaves the beginning out.
            let summary = try CaptureSummary.make(try CaptureReader(paths: [directory + "/" + name]))
            #expect(summary.marks.map(\.snapshot) == ["\(name).snapshot"] && summary.marks.first?.held == 1)
            var keepAll = CaptureSelection(services: [], operations: [], principals: [], from: nil, to: nil)
            var later = CaptureSelection(services: [], operations: [], principals: [], from: CaptureTime("+0"), to: nil)
            #expect(keepAll.keeps(records[markIndex]) && !later.keeps(records[markIndex]))
        }
    }

    /// A hold nobody releases ends at its limit; one whose requests in the air outlast it
    /// fails with a sentence, stops its capture and lets everything go.
    @Test func aHoldEndsByItselfAndFailsWhenRequestsInTheAirOutlastIt() async throws {
        try await withHoldingBus { bus, _ in
            let (client, operator_) = (try bus.client(), try bus.client())
            // Timed from before the start is asked for: the hold begins after that, whenever
            // its answer comes back on a loaded machine.
            let started = ContinuousClock.now
            _ = try await operator_.call(Broker.CaptureStart.self, .init(name: "limit-\(UInt32.random(in: 0 ... .max))", holdMilliseconds: 300))
            #expect(try await client.call(TestService.Echo.self, .init(text: "waits"), principal: "user-2").text == "waits")
            #expect(ContinuousClock.now - started >= .milliseconds(300), "held until the hold's limit")
            _ = try await operator_.call(Broker.CaptureStop.self, .init())

            let slow = Task { try await client.call(TestService.Append.self, .init(text: "slow", sleepMilliseconds: 1_500), principal: "user-2") }
            try await bus.waitForLoad(inFlight: 1)
            await #expect(throws: CanopyError.self) {
                _ = try await operator_.call(Broker.CaptureStart.self, .init(name: "busy-\(UInt32.random(in: 0 ... .max))", holdMilliseconds: 200))
            }
            #expect(try await operator_.call(Broker.CaptureStatusOperation.self, .init()).capturing == false, "the capture stopped with the failed hold")
            #expect(try await client.call(TestService.Echo.self, .init(text: "free"), principal: "user-2").text == "free")
            #expect(try await slow.value.text == "slow")
            await #expect(throws: CanopyError.self) {
                _ = try await operator_.call(Broker.CaptureStart.self, .init(name: "x", holdMilliseconds: 600_000)) // past the longest hold
            }
        }
    }

    /// A backup's hold (`broker.hold`) makes the same cut without a capture: answered once
    /// the request in the air is answered, a person's request held until `capture.release`;
    /// a second hold meanwhile is refused; one that fails leaves a running capture alone.
    @Test func aBackupsHoldCutsWithoutACaptureAndLeavesARunningCaptureAlone() async throws {
        try await withHoldingBus { bus, _ in
            let (client, operator_) = (try bus.client(), try bus.client())
            let sent = ContinuousClock.now
            let early = Task { try await client.call(TestService.Append.self, .init(text: "early", sleepMilliseconds: 400), principal: "user-3") }
            try await bus.waitForLoad(inFlight: 1)
            // a loaded machine may take seconds between the cut and the release
            let cut = try await operator_.call(Broker.Hold.self, .init(holdMilliseconds: 30_000), timeout: .seconds(40))
            #expect(ContinuousClock.now - sent >= .milliseconds(400), "the cut waits for the request in the air")
            #expect(cut.cutAt != nil && !cut.capturing)
            #expect(try await early.value.text == "early")
            let late = Task { try await client.call(TestService.Echo.self, .init(text: "late"), principal: "user-3") }
            #expect(try await eventually { try await operator_.call(Broker.CaptureStatusOperation.self, .init()).held == 1 }, "the person's request is held")
            let again = await #expect(throws: CanopyError.self) { _ = try await operator_.call(Broker.Hold.self, .init(holdMilliseconds: 1_000)) }
            #expect(again?.code == .conflict)
            let capture = await #expect(throws: CanopyError.self) {
                _ = try await operator_.call(Broker.CaptureStart.self, .init(name: "during-\(UInt32.random(in: 0 ... .max))", holdMilliseconds: 1_000))
            }
            #expect(capture?.code == .conflict)
            _ = try await operator_.call(Broker.CaptureRelease.self, .init(snapshot: nil))
            #expect(try await late.value.text == "late")
            let person = await #expect(throws: CanopyError.self) {
                _ = try await client.call(Broker.Hold.self, .init(holdMilliseconds: 1_000), principal: "user-3")
            }
            #expect(person?.code == .unauthorized)

            // A hold whose request in the air outlasts it fails; the capture running goes on.
            _ = try await operator_.call(Broker.CaptureStart.self, .init(name: "running-\(UInt32.random(in: 0 ... .max))"))
            let slow = Task { try await client.call(TestService.Append.self, .init(text: "slow", sleepMilliseconds: 1_500), principal: "user-3") }
            try await bus.waitForLoad(inFlight: 1)
            let failed = await #expect(throws: CanopyError.self) { _ = try await operator_.call(Broker.Hold.self, .init(holdMilliseconds: 200)) }
            #expect(failed?.code == .timeout)
            #expect(try await operator_.call(Broker.CaptureStatusOperation.self, .init()).capturing, "the capture goes on")
            #expect(try await slow.value.text == "slow")
            _ = try await operator_.call(Broker.CaptureStop.self, .init())
        }
    }

    /// A live bus whose broker takes captures into a directory of its own (its path given),
    /// with one worker of the `test` service: what every hold test starts from.
    func withHoldingBus(_ body: (LiveBus, String) async throws -> Void) async throws {
        let directory = (CaptureFormatTests.temporaryPath("x") as NSString).deletingLastPathComponent
        var configuration = BrokerConfiguration.testing
        configuration.captureDirectory = directory
        try await withLiveBus(configuration: configuration) { bus in
            bus.startWorker(name: "w1", credit: 8)
            try await bus.waitForWorkers(1)
            try await body(bus, directory)
        }
    }
}
