import ArgumentParser
import CanopyBus
import CanopyServiceKit
import CanopyTesting
import Foundation
import Testing

/// The executables as an operator uses them: real processes against a live broker.
@Suite(.serialized)
struct CommandLineTests {
    func run(_ name: String, _ arguments: [String], environment: [String: String] = [:]) async throws -> ProcessResult {
        try await runExecutable(name, arguments, environment: environment)
    }

    @Test func canopySendPrintsTheReplyAndExitsNonZeroOnAnError() async throws {
        try await withLiveBus { bus in
            bus.startWorker(name: "cli")
            try await bus.waitForWorkers(1)
            let ok = try await run(
                "canopy", ["send", "test", "echo", "--json", #"{"text":"fern","sleepMilliseconds":0}"#, "--principal", "user-7", "--endpoint", bus.endpoint])
            #expect(ok.status == 0)
            #expect(ok.output.contains(#""text" : "fern""#))
            #expect(ok.output.contains(#""principal" : "user-7""#))

            let failed = try await run("canopy", ["send", "test", "fail", "--json", #"{"text":"notFound","sleepMilliseconds":0}"#, "--endpoint", bus.endpoint])
            #expect(failed.status == 1)
            #expect(failed.errors.contains("error (notFound)"))

            let invalid = try await run("canopy", ["send", "test", "echo", "--json", "{nope", "--endpoint", bus.endpoint])
            #expect(invalid.status != 0)
            #expect(invalid.errors.contains("--json is not valid JSON"))
        }
    }

    @Test func canopySendAttachesFilesAndSavesTheReplysAttachments() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-send-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let photo = directory.appendingPathComponent("photo.bin")
        let bytes = Data((0..<50_000).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        try bytes.write(to: photo)
        try await withLiveBus { bus in
            bus.startWorker(name: "cli")
            try await bus.waitForWorkers(1)
            let saved = directory.appendingPathComponent("reply.bin")
            let sent = try await run(
                "canopy",
                [
                    "send", "test", "blobs", "--json", #"{"label":"photo"}"#, "--attach", photo.path,
                    "--save", saved.path, "--endpoint", bus.endpoint,
                ])
            #expect(sent.status == 0, "\(sent.errors)")
            #expect(sent.output.contains(#""label" : "photo:1""#))
            #expect(try Data(contentsOf: saved) == Data(bytes.reversed()), "the worker's reply attachment, written whole")

            let unsaved = try await run("canopy", ["send", "test", "blobs", "--json", #"{"label":"x"}"#, "--attach", photo.path, "--endpoint", bus.endpoint])
            #expect(unsaved.errors.contains("1 attachment(s) (50000 bytes); --save FILE writes them"))
            let missing = try await run("canopy", ["send", "test", "blobs", "--json", "{}", "--attach", directory.appendingPathComponent("nope").path])
            #expect(missing.status != 0 && missing.errors.contains("cannot read --attach"))
        }
    }

    @Test func canopyServicesAndStatsPrintAlignedTables() async throws {
        try await withLiveBus { bus in
            bus.startWorker(name: "cli")
            try await bus.waitForWorkers(1)
            // The endpoint comes from the environment this time.
            let services = try await run("canopy", ["services"], environment: ["CANOPY_ENDPOINT": bus.endpoint])
            #expect(services.status == 0)
            let lines = services.output.split(separator: "\n").map(String.init)
            #expect(lines.first == "SERVICE  WORKERS  OPERATION  IDEMPOTENT  COALESCABLE")
            #expect(lines.contains("test     1        append     no          no"))
            #expect(lines.contains("                  echo       yes         no"))

            let stats = try await run("canopy", ["stats", "--endpoint", bus.endpoint])
            #expect(stats.status == 0)
            #expect(stats.output.contains("SERVICE  WORKERS  QUEUED  IN FLIGHT  SERVED  ERRORS"))
            #expect(stats.output.contains("test"))
        }
    }

    @Test func badOptionsAreRefusedWithASentenceThatSaysWhatToDo() async throws {
        let result = try await run("canopy-broker", ["serve", "--liveness", "0"])
        #expect(result.status != 0)
        #expect(result.errors.contains("--liveness must be at least 1"))
        let named = try await run("canopy-broker", ["serve", "--name", "broker \"a\""])
        #expect(named.status != 0 && named.errors.contains("--name (CANOPY_BROKER_NAME) is 1 to 64 printable characters"), "\(named.errors)")
        let environment = try await run("canopy-broker", ["serve"], environment: ["CANOPY_HEARTBEAT_MS": "often"])
        #expect(environment.status != 0)
        #expect(environment.errors.contains("CANOPY_HEARTBEAT_MS=often is not a whole number"))
    }

    @Test func everySubcommandShowsAnExampleAndEveryServeOptionItsVariable() async throws {
        #expect(try await helpProblems("canopy", subcommands: [[], ["send"], ["services"], ["stats"], ["keys", "generate"]]) == [])
        #expect(try await helpProblems("canopy-broker", subcommands: [[], ["serve"], ["health"]]) == [])
    }

    @Test func tablesAlignTextLeftAndNumbersRight() {
        var table = Table("NAME", "COUNT")
        table.append(["monstera", "7"])
        table.append(["fern", "120"])
        #expect(table.render() == "NAME      COUNT\nmonstera      7\nfern        120")
    }

    @Test func optionsFallBackToCanopyEnvironmentVariablesAndFlagsWin() async throws {
        setenv("CANOPY_ENDPOINT", "tcp://10.0.0.9:7000", 1)
        defer { unsetenv("CANOPY_ENDPOINT") }
        #expect(try CommonOptions.parse([]).endpoint == "tcp://10.0.0.9:7000")
        #expect(try CommonOptions.parse(["--endpoint", "tcp://127.0.0.1:1"]).endpoint == "tcp://127.0.0.1:1")
    }

    /// Several live brokers: `--endpoint` repeated, or a list in one value or in CANOPY_ENDPOINT.
    @Test func severalBrokersAreNamedByRepeatingTheEndpointOrByAList() throws {
        setenv("CANOPY_ENDPOINT", "tcp://10.0.0.1:5555, tcp://10.0.0.2:5555", 1)
        defer { unsetenv("CANOPY_ENDPOINT") }
        let both = ["tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"]
        #expect(BusClient.Configuration(endpoint: try CommonOptions.parse([]).endpoint).endpoints == both)
        let repeated = try CommonOptions.parse(["--endpoint", "tcp://a:1", "--broker", "tcp://b:2"])
        #expect(ServiceRunner.Configuration(endpoint: repeated.endpoint).endpoints == ["tcp://a:1", "tcp://b:2"])
        // Each broker holds at least one of a worker's credit.
        let options = try WorkerOptions.parse(["--credit", "1"])
        #expect(throws: ValidationError.self) { try options.runnerConfiguration(repeated) }
        #expect(try WorkerOptions.parse(["--credit", "2"]).runnerConfiguration(repeated).endpoints.count == 2)
        // With CURVE: one broker key for all, or one per endpoint in the same order.
        guard Curve.isAvailable else { return }
        let keys = try (0..<3).map { _ in try CurveKeyPair.generate().publicKey }
        let two = try CommonOptions.parse(["--endpoint", "tcp://a:1,tcp://b:2", "--curve-server-key=\(keys[0]),\(keys[1])"]) // = : a Z85 key may begin with '-'
        #expect(try two.curveSettings()?.serverKeys == [keys[0], keys[1]])
        #expect(
            try CommonOptions.parse(["--endpoint", "tcp://a:1,tcp://b:2", "--curve-server-key=\(keys[2])"]).curveSettings()?.serverKey(forBroker: 1) == keys[2])
        let three = try CommonOptions.parse(["--endpoint", "tcp://a:1,tcp://b:2", "--curve-server-key=\(keys.joined(separator: ","))"])
        #expect(throws: ValidationError.self) { try three.curveSettings() }
    }
}
