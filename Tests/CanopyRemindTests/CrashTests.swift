import CanopyMessages
import CanopyServiceKit
import CanopyTesting
import Foundation
import GRDB
import Logging
import Testing

@testable import CanopyRemind

/// A canopy-remind process killed with SIGKILL while it delivers, then started again: every
/// reminder arrives, none twice more than a resend, none lost.
@Suite(.serialized)
struct CrashTests {
    @Test func killedWhileSendingAThousandRemindersItLosesNoneAndSendsNoneMoreThanTwice() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-remind-crash-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        var logger = Logger(label: "test")
        logger.logLevel = .warning
        let receiver = RecordingServer(delay: .milliseconds(20))
        let serving = serviceGroup([receiver.application], signals: [], logger: logger)
        let server = Task { try await serving.run() }
        defer { server.cancel() }
        let webhook = try await receiver.url("/hook")

        // 1,000 people, each with a webhook and one reminder due a minute ago.
        let path = try await Self.seed(people: 1_000, webhook: webhook, in: directory)

        try await withLiveBus { bus in
            func start() throws -> Process {
                let process = Process()
                process.executableURL = try LiveBus.executable("canopy-remind")
                process.arguments = [
                    "serve", "--endpoint", bus.endpoint, "--data-dir", directory.path, "--allow-host", "127.0.0.1",
                    "--metrics-bind", "off", "--log-level", "error",
                ]
                process.standardError = FileHandle.nullDevice
                try process.run()
                return process
            }
            let first = try start()
            // A wait for the process to get going, not a figure: amid the whole suite a debug
            // build's start took over a minute once.
            #expect(try await eventually(within: .seconds(180)) { receiver.received.count >= 200 }, "deliveries started")
            kill(first.processIdentifier, SIGKILL)
            first.waitUntilExit()
            let sentBeforeTheKill = Set(receiver.received.compactMap { $0.headers["webhook-id"] }).count
            #expect(sentBeforeTheKill < 1_000, "killed mid-way (\(sentBeforeTheKill) of 1,000 had arrived)")

            let second = try start()
            defer {
                second.terminate()
                second.waitUntilExit()
            }
            #expect(try await eventually(within: .seconds(120)) { Set(receiver.received.compactMap { $0.headers["webhook-id"] }).count == 1_000 })
            var seen: [String: Int] = [:]
            for request in receiver.received { seen[request.headers["webhook-id"] ?? "", default: 0] += 1 }
            #expect(seen.count == 1_000, "none lost")
            #expect(seen.values.allSatisfy { $0 <= 2 }, "none sent more than twice")
            let store = try SQLiteReminderStore(path: path)
            #expect(
                try await eventually(within: .seconds(30)) {
                    try store.database.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM reminders WHERE state = 'delivered'") } == 1_000
                })
        }
        await serving.triggerGracefulShutdown()
        _ = try? await server.value
    }

    /// `--rehearse` (a replay's or a staging copy's stack): reminders due go out as log lines,
    /// recorded as delivered, and nothing reaches the devices' webhooks.
    @Test func aRehearsingServiceDeliversEveryReminderToItsLogAndNothingToTheWebhooks() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-remind-rehearse-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        var logger = Logger(label: "test")
        logger.logLevel = .warning
        let receiver = RecordingServer()
        let serving = serviceGroup([receiver.application], signals: [], logger: logger)
        let server = Task { try await serving.run() }
        defer { server.cancel() }
        let webhook = try await receiver.url("/hook")
        let path = try await Self.seed(people: 20, webhook: webhook, in: directory)
        try await withLiveBus { bus in
            let process = Process()
            process.executableURL = try LiveBus.executable("canopy-remind")
            process.arguments = ["serve", "--endpoint", bus.endpoint, "--data-dir", directory.path, "--allow-host", "127.0.0.1", "--metrics-bind", "off"]
            process.environment = ProcessInfo.processInfo.environment.merging(["CANOPY_REHEARSAL": "1"]) { $1 }
            let log = Pipe()
            process.standardError = log
            process.standardOutput = log
            try process.run()
            let store = try SQLiteReminderStore(path: path)
            #expect(
                try await eventually(within: .seconds(60)) {
                    try store.database.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM reminders WHERE state = 'delivered'") } == 20
                })
            process.terminate()
            let text = String(decoding: log.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            process.waitUntilExit()
            #expect(receiver.received.isEmpty, "no webhook was called")
            #expect(text.components(separatedBy: "remind.rehearsal=webhook").count - 1 == 20, "each notification a log line naming its channel")
        }
        await serving.triggerGracefulShutdown()
        _ = try? await server.value
    }

    /// `people` people in canopy-remind's store in `directory`, each with a webhook device and
    /// one reminder due a minute ago; returns the store's path.
    static func seed(people: Int, webhook: String, in directory: URL) async throws -> String {
        let path = directory.appendingPathComponent("remind/remind.sqlite").path
        try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        let due = Date().addingTimeInterval(-60).timeIntervalSince1970
        let store = try SQLiteReminderStore(path: path)
        try await store.database.write { db in
            for person in 0..<people {
                try db.execute(
                    sql: "INSERT INTO devices (id, owner, channel, address, secret, active, registeredAt) VALUES (?, ?, 'webhook', ?, ?, 1, 0)",
                    arguments: ["d\(person)", "u\(person)", webhook, DispatcherTests.secret])
                try db.execute(
                    sql: """
                        INSERT INTO reminders (owner, taskID, due, plantID, kind, title, fireAt, state, updatedAt) VALUES (?, ?, ?, ?, 'water', 'Water it', ?, 'pending', 0)
                        """, arguments: ["u\(person)", "p\(person):water", due, "p\(person)", due])
            }
        }
        return path
    }
}
