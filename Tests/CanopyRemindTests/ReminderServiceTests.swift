import CanopyBus
import CanopyCare
import CanopyMessages
import CanopyServiceKit
import CanopyTesting
import Foundation
import Testing

@testable import CanopyRemind

/// canopy-remind as `serve` builds it, through the real broker (its `.live` tests: the
/// operating endpoint, the broker's counts), with canopy-care's outbox handing it each
/// person's window.
@Suite(.serialized)
struct ReminderServiceTests {
    @Test func careHandsOverTheWindowAndEachPersonSeesOnlyTheirOwn() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-remind-live-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        try await withLiveBus { bus in
            var care = CareServiceSettings(directory: directory.appendingPathComponent("care"), runner: bus.runnerConfiguration())
            care.outboxInterval = .milliseconds(100)
            bus.run(try await buildCareService(settings: care, context: bus.context, logger: bus.logger))
            let settings = ReminderServiceSettings(
                directory: directory.appendingPathComponent("remind"), runner: bus.runnerConfiguration(), metrics: .anyLoopbackPort)
            let remind = try await buildReminderService(settings: settings, context: bus.context, logger: bus.logger)
            let listener = try #require(remind.first(OperatingEndpoint.self))
            bus.run(remind)
            try await bus.waitForWorkers(1, service: Care.service)
            try await bus.waitForWorkers(1, service: Reminders.service)
            let client = try bus.client()

            let phone = try await client.call(Reminders.RegisterDevice.self, .init(channel: .log, address: "alice's phone", name: "phone"), principal: "alice")
            #expect(
                try await client.call(Reminders.RegisterDevice.self, .init(channel: .log, address: "alice's phone"), principal: "alice").id == phone.id,
                "the same device again is the same device")
            _ = try await client.call(Care.AddPlant.self, Care.Plant(scientificName: "Monstera deliciosa", customName: "Monty"), principal: "alice")

            // care's outbox hands over the window; remind holds it.
            var pending: [Reminders.Reminder] = []
            #expect(
                try await eventually(within: .seconds(20)) {
                    pending = try await client.call(Reminders.Pending.self, .init(), principal: "alice")
                    return !pending.isEmpty
                })
            #expect(pending.count == 64 && pending.contains { $0.kind == .water && $0.title.contains("Monty") })
            #expect(pending.map(\.due) == pending.map(\.due).sorted(), "soonest first")

            let test = try await client.call(Reminders.SendTest.self, .init(deviceID: phone.id), principal: "alice")
            #expect(test.accepted)

            // Bob sees none of it and cannot use Alice's device.
            #expect(try await client.call(Reminders.ListDevices.self, .init(), principal: "bob").isEmpty)
            #expect(try await client.call(Reminders.Pending.self, .init(), principal: "bob").isEmpty)
            let borrowed = await #expect(throws: CanopyError.self) {
                _ = try await client.call(Reminders.SendTest.self, .init(deviceID: phone.id), principal: "bob")
            }
            #expect(borrowed?.code == .notFound)
            _ = try await client.call(Reminders.RemoveDevice.self, .init(id: phone.id), principal: "bob")
            #expect(try await client.call(Reminders.ListDevices.self, .init(), principal: "alice").map(\.id) == [phone.id])
            let unknown = await #expect(throws: CanopyError.self) {
                _ = try await client.call(
                    service: Reminders.service, operation: Reminders.RegisterDevice.name,
                    body: Array(#"{"channel":"pigeon","address":"x"}"#.utf8), principal: "alice")
            }
            #expect(unknown?.code == .badRequest)

            let port = try await listener.boundPort(within: .seconds(30))
            #expect(try await OperatingProbe.waitForHealth(port, status: 200))
            let metrics = try await OperatingProbe.metrics(port)
            #expect(metrics.has("canopy_remind_held"))
            #expect(
                metrics.growth(
                    since: try PrometheusText(""), "canopy_service_handler_duration_seconds_count",
                    ["service": "remind", "operation": "reminders.sync", "outcome": "ok"]) >= 1)
        }
    }

    @Test func whenAWindowRunsLowRemindAsksCareForAFreshOne() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-remind-refill-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        try await withLiveBus { bus in
            var care = CareServiceSettings(directory: directory.appendingPathComponent("care"), runner: bus.runnerConfiguration())
            care.outboxInterval = .milliseconds(100)
            bus.run(try await buildCareService(settings: care, context: bus.context, logger: bus.logger))
            var settings = ReminderServiceSettings(directory: directory.appendingPathComponent("remind"), runner: bus.runnerConfiguration())
            settings.dispatch.refillBelow = 65 // a window of 64 is always "low" here
            let clock = ManualClock(Date())
            bus.run(try await buildReminderService(settings: settings, context: bus.context, logger: bus.logger, clock: clock))
            try await bus.waitForWorkers(1, service: Care.service)
            try await bus.waitForWorkers(1, service: Reminders.service)
            let client = try bus.client()
            _ = try await client.call(Reminders.RegisterDevice.self, .init(channel: .log, address: "phone"), principal: "dana")
            _ = try await client.call(Care.AddPlant.self, Care.Plant(scientificName: "Nephrolepis exaltata"), principal: "dana")
            var pending: [Reminders.Reminder] = []
            try #require(
                try await eventually(within: .seconds(20)) {
                    pending = try await client.call(Reminders.Pending.self, .init(), principal: "dana")
                    return !pending.isEmpty
                })
            func requests(_ operation: String) async throws -> UInt64 {
                try await client.call(Broker.Stats.self, .init()).operations.first { $0.operation == operation }?.requests ?? 0
            }
            #expect(try await requests(Care.RequestReminderSync.name) == 0)
            let syncsBefore = try await requests(Reminders.Sync.name)
            // The first reminder comes due and goes; the window is low, so care is asked to
            // send a fresh one through its outbox (in order with the syncs changes send).
            // By the service's clock (the test's own time may have run on since it was made).
            clock.advance(by: pending[0].due.timeIntervalSince(clock.now()) + 1)
            #expect(try await eventually(within: .seconds(20)) { try await requests(Care.RequestReminderSync.name) > 0 })
            #expect(try await requests(Care.RequestReminderSync.name) == 1)
            #expect(try await eventually(within: .seconds(20)) { try await requests(Reminders.Sync.name) > syncsBefore }, "care's outbox sent the window")
            // Delivered (the log channel takes it), and the fresh window does not bring it back.
            #expect(
                try await eventually(within: .seconds(20)) {
                    try await !client.call(Reminders.Pending.self, .init(limit: 256), principal: "dana")
                        .contains { $0.taskID == pending[0].taskID && $0.due == pending[0].due }
                }, "what went does not come back")
        }
    }
}
