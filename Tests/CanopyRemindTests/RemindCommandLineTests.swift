import CanopyBus
import CanopyMessages
import CanopyServiceKit
import CanopyTesting
import Foundation
import Testing

@testable import CanopyRemind

/// `canopy-remind` as an operator runs it.
@Suite(.serialized)
struct RemindCommandLineTests {
    func run(_ arguments: [String]) async throws -> ProcessResult {
        try await runExecutable("canopy-remind", arguments, limit: 30)
    }

    @Test func everySubcommandShowsAnExampleAndEveryServeOptionItsVariable() async throws {
        #expect(try await helpProblems("canopy-remind", subcommands: [[], ["serve"], ["devices"], ["pending"], ["send-test"], ["health"]]) == [])
    }

    @Test func devicesPendingAndSendTestPrintTablesFromTheRunningService() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-remind-cli-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        try await withLiveBus { bus in
            let settings = ReminderServiceSettings(directory: directory, runner: bus.runnerConfiguration())
            bus.run(try await buildReminderService(settings: settings, context: bus.context, logger: bus.logger))
            try await bus.waitForWorkers(1, service: Reminders.service)
            let client = try bus.client()
            let device = try await client.call(Reminders.RegisterDevice.self, .init(channel: .log, address: "desk", name: "desk"), principal: "user-42")
            let due = Date().addingTimeInterval(86_400)
            _ = try await bus.client(asService: true).call(Reminders.Sync.self, .init(window: [.water("p1", due: due, name: "Fern")]), principal: "user-42")

            let devices = try await run(["devices", "--user", "user-42", "--endpoint", bus.endpoint])
            #expect(devices.status == 0, "\(devices.errors)")
            #expect(devices.output.hasPrefix("ID") && devices.output.contains(device.id) && devices.output.contains("log"))
            let pending = try await run(["pending", "--user", "user-42", "--endpoint", bus.endpoint])
            #expect(pending.output.contains("Water Fern") && pending.output.contains("pending"))
            #expect(!(try await run(["pending", "--user", "someone-else", "--endpoint", bus.endpoint])).output.contains("Fern"))
            let test = try await run(["send-test", "--user", "user-42", "--device", device.id, "--endpoint", bus.endpoint])
            #expect(test.status == 0 && test.output.contains("yes"), "\(test.output) \(test.errors)")
            let wrong = try await run(["send-test", "--user", "user-42", "--device", "nope", "--endpoint", bus.endpoint])
            #expect(wrong.status != 0 && wrong.errors.contains("devices.list"))
        }
    }

    @Test func apnsOptionsAreAllOrNoneAndCheckedBeforeServing() async throws {
        let partial = try await run(["serve", "--apns-key-file", "/tmp/AuthKey.p8", "--apns-topic", "org.canopy.app"])
        #expect(partial.status != 0)
        #expect(partial.errors.contains("--apns-key-id") && partial.errors.contains("--apns-team-id"), "\(partial.errors)")
        let badTeam = try await run([
            "serve", "--apns-key-file", "/tmp/AuthKey.p8", "--apns-key-id", "ABC123DEFG", "--apns-team-id", "team",
            "--apns-topic", "org.canopy.app",
        ])
        #expect(badTeam.status != 0 && badTeam.errors.contains("team id"), "\(badTeam.errors)")
        let noKey = try await run([
            "serve", "--apns-key-file", "/nonexistent/AuthKey.p8", "--apns-key-id", "ABC123DEFG", "--apns-team-id", "DEF123GHIJ",
            "--apns-topic", "org.canopy.app", "--endpoint", "tcp://127.0.0.1:1", "--metrics-bind", "off",
            "--data-dir", FileManager.default.temporaryDirectory.appendingPathComponent("canopy-remind-cli-\(UUID().uuidString)").path,
        ])
        #expect(noKey.status != 0 && noKey.errors.contains(".p8"), "\(noKey.errors)")
    }
}
