import CanopyBus
import CanopyCare
import CanopyMessages
import CanopyTesting
import Foundation
import Glibc
import Testing

@testable import CanopyCare

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// `canopy-care` as an operator runs it.
@Suite(.serialized)
struct CareCommandLineTests {
    func run(_ arguments: [String], environment: [String: String] = [:]) async throws -> ProcessResult {
        try await runExecutable("canopy-care", arguments, environment: environment)
    }

    @Test func everySubcommandShowsAnExampleAndEveryServeOptionItsVariable() async throws {
        #expect(try await helpProblems("canopy-care", subcommands: [[], ["serve"], ["catalog", "search"], ["plan"], ["upcoming"], ["health"]]) == [])
    }

    @Test func catalogSearchPrintsAnAlignedTable() async throws {
        let result = try await run(["catalog", "search", "swiss cheese"])
        #expect(result.status == 0)
        let lines = result.output.split(separator: "\n")
        #expect(lines.first?.hasPrefix("SCIENTIFIC NAME     COMMON NAME") == true)
        #expect(lines.contains { $0.hasPrefix("Monstera deliciosa  Swiss cheese plant  Araceae") })
        #expect(try await run(["catalog", "search", "xyzabc123"]).output.contains("no species matches"))
    }

    /// `serve --catalog FILE`: a file that is not a catalog stops it at once with a sentence;
    /// one that is serves its species (a live service answers from it).
    @Test func serveTakesACatalogOfItsOwnAndRefusesOneThatIsNot() async throws {
        let directory = try TemporaryDirectory("care-catalog")
        defer { directory.remove() }
        for (content, problem) in [
            (nil, "cannot read the catalog"), ("{\"species\": 3}", "is not a catalog"), ("{\"sources\": {}, \"species\": []}", "names no species"),
        ] {
            let file = directory.path("catalog-\(problem.count).json")
            if let content { try content.write(toFile: file, atomically: true, encoding: .utf8) }
            let result = try await run(["serve", "--catalog", file, "--endpoint", "tcp://127.0.0.1:1", "--metrics-bind", "off"])
            #expect(result.status != 0 && result.errors.contains(problem), "\(result.errors)")
        }
        let catalog = try Catalog.load(
            file: URL(fileURLWithPath: #filePath).deletingLastPathComponent()
                .appendingPathComponent("../../Services/Care/Core/Resources/catalog.json").path)
        #expect(catalog.species.count == Catalog.shipped.species.count && catalog.lookup("Ficus lyrata")?.profile.wateringIntervalDays == 8)
    }

    @Test func planPrintsTasksAtTheLocalTimeInTheGivenZone() async throws {
        let result = try await run(["plan", "--species", "Monstera deliciosa", "--days", "30", "--tz", "Europe/Berlin", "--time", "08:15"])
        #expect(result.status == 0, "\(result.errors)")
        let rows = result.output.split(separator: "\n").dropFirst(2)
        #expect(!rows.isEmpty)
        #expect(rows.allSatisfy { $0.contains("8:15") })
        #expect(rows.contains { $0.contains("water") })
        let bad = try await run(["plan", "--species", "Monstera deliciosa", "--tz", "Nowhere/Land"])
        #expect(bad.status != 0 && bad.errors.contains("not an IANA time zone"))
    }

    @Test func upcomingAsksTheRunningService() async throws {
        try await CareServiceTests().withCare(.live) { bus, client, _, _ in
            let endpoint = try #require(bus.live?.endpoint)
            _ = try await client.call(Care.AddPlant.self, Care.Plant(scientificName: "Nephrolepis exaltata", customName: "Fern"), principal: "user-42")
            let result = try await run(["upcoming", "--user", "user-42", "--days", "14", "--endpoint", endpoint])
            #expect(result.status == 0, "\(result.errors)")
            #expect(result.output.contains("Water Fern"))
            #expect(!(try await run(["upcoming", "--user", "someone-else", "--endpoint", endpoint]).output.contains("Fern")))
        }
    }

    @Test func replicasAsProcessesShareOnePostgreSQL() async throws {
        let server = try await PostgresServer.shared()
        var url = try await server.database()
        let directory = try TemporaryDirectory("canopy-care-replicas")
        defer { directory.remove() }
        // The password from a file, as compose secrets mount it; the URL names none.
        let passwordFile = directory.url.appendingPathComponent("password")
        try Data((url.password ?? "").utf8).write(to: passwordFile)
        url.password = nil
        try await withLiveBus { bus in
            func replica() throws -> Process {
                let process = Process()
                process.executableURL = try LiveBus.executable("canopy-care")
                process.arguments = [
                    "serve", "--endpoint", bus.endpoint, "--data-dir", directory.path("data"), "--metrics-bind", "off",
                    "--heartbeat-ms", "100", "--liveness", "\(bus.configuration.liveness)", "--log-level", "critical",
                ]
                process.environment = ["CANOPY_DATABASE_URL": url.description, "CANOPY_DATABASE_PASSWORD_FILE": passwordFile.path]
                try process.run()
                return process
            }
            let replicas = [try replica(), try replica()]
            defer {
                replicas.filter(\.isRunning).forEach {
                    $0.terminate()
                    $0.waitUntilExit()
                }
            }
            try await bus.waitForWorkers(2, service: Care.service)
            let client = try bus.client()
            for index in 0..<10 {
                _ = try await client.call(Care.AddPlant.self, Care.Plant(id: "plant-\(index)", scientificName: "Ficus lyrata"), principal: "alice")
            }
            // Whichever replica answers, it sees every plant; nothing is in the data directory.
            for _ in 0..<4 {
                #expect(try await client.call(Care.ListPlants.self, .init(limit: 100), principal: "alice").total == 10)
            }
            #expect(!FileManager.default.fileExists(atPath: directory.path("data/care/care.sqlite")))
            // One replica killed: the other goes on with the same data.
            kill(replicas[0].processIdentifier, SIGKILL)
            replicas[0].waitUntilExit()
            try await bus.waitForWorkers(1, service: Care.service)
            _ = try await client.call(Care.AddPlant.self, Care.Plant(id: "plant-10", scientificName: "Ficus lyrata"), principal: "alice")
            #expect(try await client.call(Care.ListPlants.self, .init(limit: 100), principal: "alice").total == 11)
        }
        // A URL that is not one, and a server that is not there, stop it with a sentence.
        let invalid = try await run(["serve", "--endpoint", "tcp://127.0.0.1:1", "--database-url", "mysql://db/canopy"])
        #expect(invalid.status != 0 && invalid.errors.contains("not postgres"), "\(invalid.errors)")
        // It is waited for (a line each try) up to --database-wait, then the sentence.
        let absent = try await run([
            "serve", "--endpoint", "tcp://127.0.0.1:1", "--metrics-bind", "off", "--database-wait", "2",
            "--database-url", "postgres://canopy@127.0.0.1:\(FreePorts.any())/canopy",
        ])
        #expect(absent.status != 0 && absent.errors.contains("cannot reach PostgreSQL"), "\(absent.errors)")
        #expect(absent.errors.contains("store.database.waiting") && absent.errors.contains("trying again in"), "\(absent.errors)")
    }

    /// In a container stack the services may start before PostgreSQL (podman-compose ignores
    /// `depends_on` conditions): canopy-care waits, a line each try, and SIGTERM meanwhile is
    /// a stop asked for (exit 0), not a death by signal.
    @Test func aServiceWaitingForItsDatabaseStopsCleanlyOnSIGTERM() async throws {
        let directory = try TemporaryDirectory("canopy-care-waiting")
        defer { directory.remove() }
        let log = directory.url.appendingPathComponent("stderr")
        FileManager.default.createFile(atPath: log.path, contents: nil)
        let process = Process()
        process.executableURL = try LiveBus.executable("canopy-care")
        process.arguments = [
            "serve", "--endpoint", "tcp://127.0.0.1:1", "--metrics-bind", "off", "--data-dir", directory.path("data"),
            "--database-wait", "600", "--database-url", "postgres://canopy@127.0.0.1:\(FreePorts.any())/canopy",
        ]
        process.standardError = try FileHandle(forWritingTo: log)
        try process.run()
        defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
        func written() -> String { (try? String(contentsOf: log, encoding: .utf8)) ?? "" }
        #expect(try await eventually(within: .seconds(60)) { written().contains("store.database.waiting") }, "\(written())")
        let lines = written().split(separator: "\n").filter { $0.contains("store.database.waiting") }
        #expect(!lines.isEmpty && lines.allSatisfy { $0.contains("trying again in") }, "a whole line a try: \(lines)")
        kill(process.processIdentifier, SIGTERM)
        #expect(try await eventually(within: .seconds(30)) { !process.isRunning })
        #expect(process.terminationReason == .exit && process.terminationStatus == 0, "\(written())")
    }

    /// A fatal sentence leaves in one `write(2)` (whole lines, as container engines log them):
    /// swift-argument-parser writes its error a byte at a time, and standard error was
    /// unbuffered, so podman's log showed it one byte a line, scrambled. Watched with strace
    /// (Debian's, which scripts/test installs).
    @Test func aFatalSentenceIsWrittenAsOneWholeLine() async throws {
        let strace = "/usr/bin/strace"
        try #require(FileManager.default.isExecutableFile(atPath: strace), "strace is not installed; scripts/test installs Debian's strace")
        let directory = try TemporaryDirectory("canopy-care-fatal-line")
        defer { directory.remove() }
        let trace = directory.path("writes")
        let result = try await runProgram(
            at: strace,
            [
                "-f", "-e", "trace=write", "-s", "4096", "-o", trace, try LiveBus.executable("canopy-care").path,
                "serve", "--endpoint", "tcp://127.0.0.1:1", "--database-url", "mysql://db/canopy",
            ], limit: 60)
        #expect(result.status != 0 && result.errors.contains("not postgres"), "\(result.errors)")
        let writes = try String(contentsOfFile: trace, encoding: .utf8).split(separator: "\n").filter { $0.contains("write(2, ") }
        #expect(writes.contains { $0.contains("not postgres") && $0.contains("\\n\"") }, "the sentence and its newline in one write: \(writes.prefix(5))")
        #expect(!writes.contains { $0.hasSuffix("= 1") }, "no write of one byte: \(writes.prefix(5))")
    }

    @Test func healthSaysWhetherTheRunningServiceIsRegistered() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-care-health-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let listener = "127.0.0.1:\(FreePorts.any())"
        let nobody = try await run(["health", "--metrics-bind", listener])
        #expect(nobody.status == 1)
        #expect(nobody.output.contains("nothing answers"))

        try await withLiveBus { bus in
            let process = Process()
            process.executableURL = try LiveBus.executable("canopy-care")
            process.arguments = [
                "serve", "--endpoint", bus.endpoint, "--data-dir", directory.path, "--metrics-bind", listener,
                "--heartbeat-ms", "100", "--liveness", "\(bus.configuration.liveness)", "--log-level", "critical",
            ]
            try process.run()
            defer {
                process.terminate()
                process.waitUntilExit()
            }
            try await bus.waitForWorkers(1, service: Care.service)
            var healthy = ProcessResult(status: -1, output: "", errors: "")
            _ = try await eventually(within: .seconds(5), every: .milliseconds(100)) {
                healthy = try await run(["health"], environment: ["CANOPY_METRICS_BIND": listener])
                return healthy.status == 0
            }
            #expect(healthy.status == 0, "\(healthy.output)")
            #expect(healthy.output.hasPrefix("healthy: broker registered"))
            #expect(healthy.output.contains("store answering") && healthy.output.contains("follow-up(s) pending"))

            // The process's /metrics after traffic: a call made is a call counted.
            let client = try bus.client()
            _ = try await client.call(Care.AddPlant.self, Care.Plant(scientificName: "Ficus lyrata"), principal: "user-1")
            let (data, _) = try await URLSession.shared.data(from: URL(string: "http://\(listener)/metrics")!)
            let metrics = String(decoding: data, as: UTF8.self)
            let added = metrics.split(separator: "\n").first {
                $0.hasPrefix("canopy_service_handler_duration_seconds_count") && $0.contains(#"operation="plants.add""#) && $0.contains(#"outcome="ok""#)
            }
            #expect(added?.hasSuffix(" 1") == true, "\(added ?? "no plants.add series")")
            #expect(metrics.contains("canopy_service_credit{service=\"care\"} 8"))
            #expect(metrics.contains("canopy_care_outbox_pending"))

            bus.stopBroker()
            var gone = healthy
            _ = try await eventually(within: .seconds(5), every: .milliseconds(100)) {
                gone = try await run(["health", "--metrics-bind", listener])
                return gone.status != 0
            }
            #expect(gone.status == 1)
            #expect(gone.output.contains("not registered with the broker"))
        }
    }
}
