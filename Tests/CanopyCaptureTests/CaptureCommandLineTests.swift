import CanopyBroker
import CanopyBus
import CanopyCapture
import CanopyMessages
import CanopyTesting
import CanopyWire
import Foundation
import Testing

/// `canopy capture …` and `canopy replay` as an operator runs them: real processes.
@Suite(.serialized)
struct CaptureCommandLineTests {
    @Test func inspectPrintsATableOrJSONAndSaysWhereACutFileStops() async throws {
        let path = CaptureFormatTests.temporaryPath("capture")
        let records = (1...3).flatMap { [CaptureFormatTests.request($0), CaptureFormatTests.reply($0, failed: $0 == 2)] }
        try CaptureFormatTests.write(records, to: path)
        let table = try await runExecutable("canopy", ["capture", "inspect", path])
        #expect(table.status == 0, "\(table.errors)")
        #expect(table.output.contains("6 records: 3 requests, 3 answers (1 errors)"))
        #expect(table.output.contains("SERVICE  OPERATION   REQUESTS  ANSWERS  ERRORS"))
        #expect(table.output.contains("notFound"))
        let json = try await runExecutable("canopy", ["capture", "inspect", path, "--json"])
        let summary = try JSONDecoder().decode(CaptureSummary.self, from: Data(json.output.utf8))
        #expect(summary.requests == 3 && summary.errors == 1 && summary.complete)

        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        try data.dropLast(5).write(to: URL(fileURLWithPath: path))
        let cut = try await runExecutable("canopy", ["capture", "inspect", path])
        #expect(cut.status == 2)
        #expect(cut.output.contains("cut short: \(path) ends inside a record at byte"))
        #expect(cut.output.contains("5 records"))
        let missing = try await runExecutable("canopy", ["capture", "inspect", path + ".nope"])
        #expect(missing.status != 0 && missing.errors.contains("cannot open"))
    }

    @Test func aRecordClaimingMoreThanItsFileHoldsIsNeverAllocatedAndNonCapturesExitTwo() async throws {
        let path = CaptureFormatTests.temporaryPath("capture")
        let records = (1...40).map { CaptureFormatTests.request($0, attachments: [Array(repeating: UInt8($0), count: 600)]) }
        try CaptureFormatTests.write(records, to: path)
        let original = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        #expect(original.count > 25_000)
        var first: [UInt8] = []
        CaptureFormat.encode(records[0], into: &first)
        let second = CaptureFormat.fileHeaderBytes + first.count
        // The length each claim writes into the second record's prefix, and how it must end.
        for (claim, ending) in [(UInt32(0x3FFF_FFFF), "damaged"), (UInt32(1 << 30), "damaged"), (UInt32(1 << 20), "cut short")] {
            var bytes = original
            bytes.replaceSubrange(second..<(second + 4), with: withUnsafeBytes(of: claim.bigEndian) { Array($0) })
            try Data(bytes).write(to: URL(fileURLWithPath: path))
            // Under an address-space limit below 1 GiB (with few malloc arenas, whose reservations
            // count too): allocating the claim would kill it, and room is left for the threads.
            for command in [["capture", "inspect", path], ["capture", "filter", path, "--output", path + ".out"], ["replay", path, "--dry-run"]] {
                let result = try await runProgram(
                    at: "/bin/bash", ["-c", "ulimit -v 1000000; exec \"$0\" \"$@\"", try LiveBus.executable("canopy").path] + command,
                    environment: ["MALLOC_ARENA_MAX": "2"])
                // inspect and filter exit 2 for a capture that ends early; a dry run 1 (its checks found something)
                #expect(result.status == (command[0] == "replay" ? 1 : 2), "\(command) \(claim): \(result.status) \(result.errors)")
                #expect((result.output + result.errors).contains("\(ending): \(path)"), "\(command) \(claim): \(result.output) \(result.errors)")
                try? FileManager.default.removeItem(atPath: path + ".out")
            }
        }
        // Not a capture at all: a directory, a short file, a damaged header: exit 2 with a sentence.
        let short = CaptureFormatTests.temporaryPath("short")
        try Data(original.prefix(5)).write(to: URL(fileURLWithPath: short))
        let header = CaptureFormatTests.temporaryPath("header")
        var damaged = original
        damaged[0] ^= 0xFF
        try Data(damaged).write(to: URL(fileURLWithPath: header))
        for (file, sentence) in [((path as NSString).deletingLastPathComponent, "is not a file"), (short, "too short"), (header, header)] {
            let result = try await runExecutable("canopy", ["capture", "inspect", file])
            #expect(result.status == 2 && result.errors.contains(sentence) && !result.errors.contains("Usage"), "\(file): \(result.status) \(result.errors)")
        }
    }

    @Test func captureOnALiveBrokerThenFilterAndReplayIt() async throws {
        let directory = (CaptureFormatTests.temporaryPath("x") as NSString).deletingLastPathComponent
        var configuration = BrokerConfiguration.testing
        configuration.captureDirectory = directory
        try await withLiveBus(configuration: configuration) { bus in
            bus.startWorker(name: "cli")
            try await bus.waitForWorkers(1)
            let started = try await runExecutable("canopy", ["capture", "start", "session", "--broker", bus.endpoint])
            #expect(started.status == 0 && started.output.contains("capturing into \(directory)/session"), "\(started.errors)")
            for text in ["fern", "ivy"] {
                let sent = try await runExecutable(
                    "canopy",
                    [
                        "send", "test", "echo", "--json", #"{"text":"\#(text)","sleepMilliseconds":0}"#, "--principal", "p1",
                        "--broker", bus.endpoint,
                    ])
                #expect(sent.status == 0)
            }
            _ = try await runExecutable("canopy", ["send", "test", "lookup", "--json", #"{"text":"x","sleepMilliseconds":0}"#, "--broker", bus.endpoint])
            let stopped = try await runExecutable("canopy", ["capture", "stop", "--broker", bus.endpoint])
            #expect(stopped.status == 0)
            #expect(stopped.output.contains("CAPTURING  FILE"))
            let row = stopped.output.split(separator: "\n").first { $0.contains("\(directory)/session") }?.split(separator: " ").map(String.init)
            #expect(row.map { [$0[0], $0[2], $0[4], $0[5], $0[6]] } == ["no", "6", "0", "0", "1"], "\(stopped.output)")
            let again = try await runExecutable("canopy", ["capture", "stop", "--broker", bus.endpoint])
            #expect(again.status == 1 && again.errors.contains("no capture is running"))

            let filtered = try await runExecutable(
                "canopy", ["capture", "filter", "\(directory)/session", "--output", "\(directory)/echoes", "--operation", "echo"])
            #expect(filtered.status == 0 && filtered.output.contains("wrote 4 of 6 records"), "\(filtered.output) \(filtered.errors)")

            let dry = try await runExecutable("canopy", ["replay", "\(directory)/echoes", "--dry-run", "--broker", bus.endpoint])
            #expect(dry.status == 0, "\(dry.output)")
            #expect(dry.output.contains("would send 2 request(s)") && dry.output.contains("checks: all passed"))
            let replayed = try await runExecutable("canopy", ["replay", "\(directory)/session", "--fast", "--broker", bus.endpoint])
            #expect(replayed.status == 0, "\(replayed.output) \(replayed.errors)")
            #expect(replayed.output.contains("every answer matched"))

            // A captured answer the worker no longer gives: shown as a JSON path, exit status 1.
            let changed = "\(directory)/changed"
            let header = RequestHeader(timeoutMilliseconds: 5_000, flags: 1, principal: "p1")
            let request = CaptureRecord(
                kind: .request, time: 1, client: "c-1", service: "test", operation: "echo", correlation: [1], header: header,
                body: Array(#"{"sleepMilliseconds":0,"text":"fern"}"#.utf8))
            var reply = request
            reply.kind = .reply
            reply.body = Array(#"{"pid":\#(getpid()),"principal":"p1","text":"palm","worker":"cli"}"#.utf8)
            try CaptureFormatTests.write([request, reply], to: changed)
            let differed = try await runExecutable("canopy", ["replay", changed, "--fast", "--broker", bus.endpoint])
            #expect(differed.status == 1)
            #expect(differed.output.contains(#"$.text: "palm" -> "fern""#), "\(differed.output)")
            #expect(differed.output.contains("1 answer(s) differed"))
        }
    }

    /// Given several brokers, start, status and stop act on each: each captures what crosses
    /// it into its own directory.
    @Test func captureStartsAndStopsOnEveryBrokerNamed() async throws {
        let root = try TemporaryDirectory("capture-brokers")
        defer { root.remove() }
        let directories = ["a", "b"].map { root.path($0) }
        for directory in directories { try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true) }
        var first = BrokerConfiguration.testing, second = BrokerConfiguration.testing
        first.captureDirectory = directories[0]
        second.captureDirectory = directories[1]
        try await withLiveBus(configuration: first) { a in
            try await withLiveBus(configuration: second) { b in
                let brokers = "\(a.endpoint),\(b.endpoint)"
                let started = try await runExecutable("canopy", ["capture", "start", "both", "--broker", brokers])
                #expect(started.status == 0, "\(started.errors)")
                #expect(started.output.contains("\(a.endpoint): capturing") && started.output.contains("\(b.endpoint): capturing"), "\(started.output)")
                let status = try await runExecutable("canopy", ["capture", "status", "--broker", brokers])
                #expect(status.output.contains(a.endpoint) && status.output.contains(b.endpoint), "\(status.output)")
                // A worker on both brokers, and a client of each: calls cross both.
                var runner = a.runnerConfiguration()
                runner.endpoints = [a.endpoint, b.endpoint]
                a.run([ServiceRunner(service: TestWorkerService(workerName: "both"), configuration: runner, context: a.context, logger: a.logger)])
                try await a.waitForWorkers(1)
                try await b.waitForWorkers(1)
                for (index, bus) in [a, b].enumerated() {
                    let client = try bus.client()
                    for call in 0..<3 { _ = try await client.call(TestService.Echo.self, .init(text: "\(index)-\(call)"), principal: "p\(index)") }
                }
                let stopped = try await runExecutable("canopy", ["capture", "stop", "--broker", brokers])
                #expect(stopped.status == 0, "\(stopped.errors)")
                for directory in directories {
                    #expect(FileManager.default.fileExists(atPath: directory + "/both"), "\(directory) holds its broker's capture")
                }
                // The two captures read as one: every request of both, merged by time, and replayed clean.
                let files = directories.map { $0 + "/both" }
                let inspected = try await runExecutable("canopy", ["capture", "inspect"] + files + ["--json"])
                #expect(inspected.status == 0 && inspected.output.contains("\"requests\" : 6"), "\(inspected.output) \(inspected.errors)")
                let replayed = try await runExecutable("canopy", ["replay"] + files + ["--fast", "--broker", a.endpoint, "--ignore", "pid"])
                #expect(replayed.status == 0, "\(replayed.output) \(replayed.errors)")
            }
        }
    }

    @Test func theCaptureAndReplayCommandsShowExamples() async throws {
        #expect(
            try await helpProblems(
                "canopy",
                subcommands: [
                    ["capture"], ["capture", "start"], ["capture", "stop"], ["capture", "status"],
                    ["capture", "inspect"], ["capture", "filter"], ["replay"],
                ]) == [])
        #expect(try await helpProblems("canopy-broker", subcommands: [["serve"]]) == [])
        let refused = try await runExecutable("canopy-broker", ["serve", "--capture-dir", "/no/such/dir"])
        #expect(refused.status != 0 && refused.errors.contains("mkdir -p /no/such/dir"))
    }
}
