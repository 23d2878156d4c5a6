import CanopyDeployment
import CanopyServiceKit
import CanopyTesting
import Foundation
import Glibc
import Testing

/// `canopy up` as an operator runs it: the whole stack as local processes (the executables
/// built next to the tests), on ports of its own, in a data directory of its own.
@Suite(.serialized)
struct CanopyUpTests {
    struct ServiceRow: Equatable {
        var name: String, pid: Int32, state: String, restarts: Int
    }

    static func rows(_ table: String) -> [ServiceRow] {
        table.split(separator: "\n").compactMap { line in
            let cells = line.split(separator: " ").map(String.init)
            guard cells.count >= 4, let pid = Int32(cells[1]), let restarts = Int(cells[3]) else { return nil }
            return ServiceRow(name: cells[0], pid: pid, state: cells[2], restarts: restarts)
        }
    }

    @Test func upStartsEveryServiceRestartsACrashedOneAndDownStopsThemAll() async throws {
        let data = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-up-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: data) }
        let stack = ["--data-dir", data]
        let base = FreePorts.run(of: 5)
        let http = "127.0.0.1:\(FreePorts.any())"
        let broker = "tcp://127.0.0.1:\(FreePorts.any())"
        let up = try await runExecutable(
            "canopy",
            [
                "up", "--detach", "--broker", broker,
                "--http", http, "--metrics-base", "\(base)",
            ] + stack, limit: 240)
        defer { _ = try? Self.runDown(stack) }
        #expect(up.status == 0, "\(up.output) \(up.errors)")
        let started = Self.rows(up.output)
        #expect(started.map(\.name) == CanopyStack.services.map(\.name), "the same services as docker-compose.yml, in order")
        #expect(started.allSatisfy { $0.state == "running" && $0.pid > 0 })
        #expect(up.output.contains("demo token (user demo, 7 days): ey"))
        // Secrets and personal data are the owner's alone.
        func mode(_ path: String) -> Int { ((try? FileManager.default.attributesOfItem(atPath: data + path))?[.posixPermissions] as? Int) ?? -1 }
        for file in ["/token.key", "/stack-id", "/logs/canopy-up.log", "/logs/care.log", "/care/care.sqlite", "/images/images.sqlite"] {
            #expect(mode(file) == 0o600, "\(file) is \(String(mode(file), radix: 8))")
        }
        for directory in ["", "/logs", "/care", "/images"] {
            #expect(mode(directory) == 0o700, "\(directory) is \(String(mode(directory), radix: 8))")
        }

        // A second stack on the same ports is refused before anything of it starts, with a
        // sentence naming the ports, the first stack's data directory and the options.
        let second = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-up-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: second) }
        let clash = try await runExecutable(
            "canopy", ["up", "--detach", "--broker", broker, "--http", http, "--metrics-base", "\(base)", "--data-dir", second],
            limit: 60)
        #expect(clash.status != 0, "\(clash.output)")
        #expect(clash.errors.contains("cannot start a stack from \(second)"), "\(clash.errors)")
        #expect(clash.errors.contains("\(broker.dropFirst(6)) for the broker's bus (--broker) is in use by canopy-broker"))
        #expect(clash.errors.contains("data dir \(data)"))
        #expect(clash.errors.contains("--http") && clash.errors.contains("--metrics-base"))
        #expect(!FileManager.default.fileExists(atPath: second + "/care/care.sqlite"), "nothing of the second stack started")

        // The app's journey over HTTP, as canopy demo walks it.
        let demo = try await runExecutable("canopy", ["demo", "--http", http, "--reminder-seconds", "2"] + stack, limit: 120)
        #expect(demo.status == 0, "\(demo.output) \(demo.errors)\n\(Self.logTails(data, ["remind", "care"]))")
        for step in [
            "identify a photo", "accept it as a plant", "its care schedule", "its reminder delivered", "sent to the log channel",
            "complete the task, then its plant's next task", "the photo's thumbnail and palette", "done in",
        ] {
            #expect(demo.output.contains(step), "canopy demo shows no '\(step)': \(demo.output)")
        }
        #expect(demo.output.contains("best match Ficus exemplaris"), "the demo's photo is of its second reference species")

        // A service killed hard is started again.
        let care = try #require(started.first { $0.name == "care" })
        kill(care.pid, SIGKILL)
        var restarted: ServiceRow?
        _ = try await eventually(within: .seconds(60), every: .milliseconds(300)) {
            let status = try await runExecutable("canopy", ["status"] + stack)
            restarted = Self.rows(status.output).first { $0.name == "care" }
            return restarted?.restarts == 1 && restarted?.state == "running"
        }
        #expect(restarted?.restarts == 1 && restarted?.state == "running" && restarted?.pid != care.pid, "\(String(describing: restarted))")
        let logs = try await runExecutable("canopy", ["logs", "care", "--lines", "400"] + stack)
        #expect(logs.status == 0 && logs.output.contains("canopy-care"))
        let unknown = try await runExecutable("canopy", ["logs", "gardener"] + stack)
        #expect(unknown.status != 0 && unknown.errors.contains("no service 'gardener'"))
        let twice = try await runExecutable("canopy", ["up", "--detach"] + stack)
        #expect(twice.status != 0 && twice.errors.contains("a stack runs already"))

        let down = try Self.runDown(stack)
        #expect(down.status == 0 && down.output.contains("stopped"), "\(down.output) \(down.errors)")
        let pids = Self.rows(try await runExecutable("canopy", ["status"] + stack).output).map(\.pid)
        #expect(pids.count == CanopyStack.services.count && pids.allSatisfy { kill($0, 0) != 0 }, "every process is gone")
    }

    @Test func statusWithoutAStackSaysHowToStartOne() async throws {
        let result = try await runExecutable("canopy", ["status", "--data-dir", "/tmp/canopy-no-stack-\(UUID().uuidString)"])
        #expect(result.status != 0 && result.errors.contains("canopy up"))
        #expect(try await helpProblems("canopy", subcommands: [["up"], ["status"], ["logs"], ["down"]]) == [])
    }

    @Test func aDetachedStackWhoseServiceCannotStartFailsAtOnceNamingIt() async throws {
        let data = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-up-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: data) }
        let started = ContinuousClock.now
        // canopy-api refuses a rate limit of 0 and exits; the others start.
        let up = try await runExecutable(
            "canopy",
            [
                "up", "--detach", "--data-dir", data, "--broker", "tcp://127.0.0.1:\(FreePorts.any())",
                "--http", "127.0.0.1:\(FreePorts.any())", "--metrics-base", "\(FreePorts.run(of: 5))",
            ],
            environment: ["CANOPY_RATE_LIMIT": "0"], limit: 120)
        #expect(up.status != 0)
        #expect(up.errors.contains("canopy-api exited while starting") && up.errors.contains("--rate-limit"), "\(up.errors)")
        #expect(ContinuousClock.now - started < .seconds(60), "not the three minutes a healthy stack is waited for")
        let pids = Self.rows(try await runExecutable("canopy", ["status", "--data-dir", data]).output).map(\.pid).filter { $0 > 0 }
        #expect(!pids.isEmpty && pids.allSatisfy { kill($0, 0) != 0 }, "the services that did start are stopped again")
    }

    /// The last lines of the stack's service logs, to show with a failure.
    static func logTails(_ data: String, _ services: [String], lines: Int = 40) -> String {
        services.map { service in
            // Decoded leniently, as canopy demo reads it: one bad byte must not hide the log.
            let text = FileManager.default.contents(atPath: "\(data)/logs/\(service).log").map { String(decoding: $0, as: UTF8.self) } ?? "(no log)"
            return "--- \(service).log\n" + text.split(separator: "\n").suffix(lines).joined(separator: "\n")
        }.joined(separator: "\n")
    }

    static func runDown(_ stack: [String]) throws -> ProcessResult {
        let process = Process()
        process.executableURL = try LiveBus.executable("canopy")
        process.arguments = ["down"] + stack
        let output = Pipe(), errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        let out = output.fileHandleForReading.readDataToEndOfFile(), err = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return ProcessResult(status: process.terminationStatus, output: String(decoding: out, as: UTF8.self), errors: String(decoding: err, as: UTF8.self))
    }
}
