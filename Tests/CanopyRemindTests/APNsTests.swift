import CanopyBus
import CanopyMessages
import CanopyTesting
import Foundation
import GRDB
import Logging
import ServiceLifecycle
import Testing

@testable import CanopyRemind

/// The `apns` channel against a local HTTP/2 TLS server that answers as Apple documents:
/// headers, the provider token (reused, then replaced), every answer's outcome, a payload cut to
/// fit, and a 410 that deactivates the device through the dispatcher.
@Suite(.serialized)
struct APNsTests {
    static let start = Date(timeIntervalSince1970: 1_800_000_000)
    static let phone = String(repeating: "a1", count: 32)

    struct Setup {
        let apns: FakeAPNs
        let channel: APNsChannel
        let clock: ManualClock
        let directory: URL

        func device(_ token: String = APNsTests.phone, owner: String = "alice") -> DeviceRecord {
            DeviceRecord(
                device: Reminders.Device(
                    id: "device-\(token.prefix(6))", channel: .apns, address: token, name: "iPhone",
                    active: true, registeredAt: APNsTests.start), owner: owner)
        }

        func notification(_ titles: [String] = ["Water Monstera"]) -> ReminderNotification {
            let reminders = titles.enumerated().map { index, title in
                Reminders.Reminder(taskID: "task-\(index)", plantID: "plant-\(index)", kind: .water, title: title, due: clock.now(), state: .sending)
            }
            return ReminderNotification(
                id: ReminderNotification.key(deviceID: "d", reminders: reminders.map { ($0.taskID, $0.due.timeIntervalSince1970) }),
                reminders: reminders)
        }
    }

    /// A fake APNs and a channel configured for it, both on `clock`.
    func withAPNs(topic: String = FakeAPNs.topic, _ body: (Setup) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-apns-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        let clock = ManualClock(Self.start)
        let apns = try FakeAPNs(directory: directory, now: { clock.now() })
        try await withRunning([apns.application], logger: logger) {
            let keyFile = directory.appendingPathComponent("AuthKey_\(FakeAPNs.keyID).p8")
            try Data(apns.keyPEM.utf8).write(to: keyFile)
            var settings = APNsSettings(keyFile: keyFile.path, keyID: FakeAPNs.keyID, teamID: FakeAPNs.teamID, topic: topic)
            settings.server = try await apns.url()
            settings.caFile = apns.caFile.path
            settings.timeout = .seconds(60) // amid the whole suite, a TLS handshake on two cores can take seconds
            let channel = try APNsChannel(settings: settings, logger: logger, now: { clock.now() })
            try await withRunning([channel], logger: logger) {
                try await body(Setup(apns: apns, channel: channel, clock: clock, directory: directory))
            }
        }
    }

    @Test func aNotificationGoesAsAppleDocumentsWithOneTokenReusedThenReplaced() async throws {
        try await withAPNs { setup in
            let notification = setup.notification()
            #expect(await setup.channel.deliver(notification, to: setup.device()) == .accepted("APNs accepted it"))
            let first = try #require(setup.apns.received.first)
            #expect(first.http2, "APNs speaks HTTP/2 only")
            #expect(first.status == 200)
            #expect(first.deviceToken == Self.phone)
            #expect(first.headers["apns-topic"] == FakeAPNs.topic)
            #expect(first.headers["apns-push-type"] == "alert")
            #expect(first.headers["apns-priority"] == "10")
            #expect(first.headers["apns-id"] == notification.id)
            #expect(first.headers["apns-collapse-id"] == notification.id)
            #expect(first.headers["apns-expiration"] == "\(Int(Self.start.timeIntervalSince1970) + 12 * 3_600)")
            let payload = try JSONSerialization.jsonObject(with: Data(first.body)) as? [String: Any]
            let alert = (payload?["aps"] as? [String: Any])?["alert"] as? [String: String]
            #expect(alert == ["title": "Water Monstera", "body": "Water Monstera"])
            #expect(((payload?["canopy"] as? [String: Any])?["tasks"] as? [String]) == ["task-0"])

            // The same token for 50 minutes (Apple refuses new ones more often than every 20)…
            for minutes in [10.0, 20, 29] {
                setup.clock.advance(by: minutes * 60 - (setup.clock.now().timeIntervalSince(Self.start)))
                #expect(await setup.channel.deliver(setup.notification(), to: setup.device()) == .accepted("APNs accepted it"))
            }
            // …then a new one (the fake refuses tokens over an hour old).
            setup.clock.advance(by: 51 * 60 - setup.clock.now().timeIntervalSince(Self.start))
            #expect(await setup.channel.deliver(setup.notification(), to: setup.device()) == .accepted("APNs accepted it"))
            let tokens = setup.apns.received.map { $0.headers["authorization"] ?? "" }
            #expect(tokens.count == 5)
            #expect(Set(tokens.prefix(4)).count == 1)
            #expect(tokens[4] != tokens[0])
            #expect(setup.apns.received.allSatisfy { $0.status == 200 && $0.http2 })
        }
    }

    @Test func anExpiredProviderTokenIsReplacedAndTheNotificationSentAgainAtOnce() async throws {
        try await withAPNs { setup in
            setup.clock.advance(by: 25 * 60) // a new token is allowed again
            #expect(await setup.channel.deliver(setup.notification(), to: setup.device()) == .accepted("APNs accepted it"))
            setup.clock.advance(by: 21 * 60)
            setup.apns.script([(403, "ExpiredProviderToken")])
            #expect(await setup.channel.deliver(setup.notification(), to: setup.device()) == .accepted("APNs accepted it"))
            let received = setup.apns.received
            #expect(received.map(\.status) == [200, 403, 200])
            #expect(received[1].headers["authorization"] == received[0].headers["authorization"])
            #expect(received[2].headers["authorization"] != received[1].headers["authorization"])
        }
    }

    /// Each documented answer, and what canopy-remind makes of it.
    @Test(arguments: [
        (400, "BadDeviceToken", "rejected"), (400, "DeviceTokenNotForTopic", "rejected"), (403, "Forbidden", "rejected"),
        (413, "PayloadTooLarge", "rejected"), (400, "BadCollapseId", "rejected"),
        (410, "Unregistered", "deactivated"), (410, "ExpiredToken", "deactivated"),
        (429, "TooManyRequests", "retry"), (429, "TooManyProviderTokenUpdates", "retry"), (500, "InternalServerError", "retry"),
        (503, "ServiceUnavailable", "retry"), (503, "Shutdown", "retry"), (403, "InvalidProviderToken", "retry"),
    ])
    func everyAnswerOfAPNsHasItsOutcome(status: Int, reason: String, expected: String) async throws {
        try await withAPNs { setup in
            setup.apns.script([(status, reason)])
            let outcome = await setup.channel.deliver(setup.notification(), to: setup.device())
            let kind =
                switch outcome {
                case .accepted: "accepted"
                case .retry: "retry"
                case .rejected(_, deactivate: true): "deactivated"
                case .rejected(_, deactivate: false): "rejected"
                }
            #expect(kind == expected, "\(status) \(reason) gave \(outcome)")
            #expect(setup.apns.received.count == 1, "no second try within the delivery")
            if case .rejected(let detail, _) = outcome { #expect(detail.contains(reason)) }
            if case .retry(let detail) = outcome { #expect(detail.contains(reason)) }
        }
    }

    @Test func theServersOwnRefusalsComeFromWhatWasSent() async throws {
        // Another app's topic: APNs itself refuses it, as it would a phone of another app.
        try await withAPNs(topic: "org.other.app") { setup in
            let outcome = await setup.channel.deliver(setup.notification(), to: setup.device())
            #expect(outcome == .rejected("APNs answered HTTP 400 DeviceTokenNotForTopic", deactivate: false))
        }
        // A token the phone no longer has: gone.
        try await withAPNs { setup in
            setup.apns.unregister(Self.phone)
            guard case .rejected(_, deactivate: true) = await setup.channel.deliver(setup.notification(), to: setup.device()) else {
                Issue.record("410 Unregistered did not deactivate")
                return
            }
            #expect(setup.apns.received.first?.status == 410)
        }
    }

    @Test func aLargeDigestIsCutToFitFourKilobytes() async throws {
        try await withAPNs { setup in
            let titles = (0..<64).map { "Water the plant with a rather long name number \($0) " + String(repeating: "ü", count: 60) }
            let notification = setup.notification(titles)
            #expect(try MessageCodec().encode(notification).count > 4_096)
            #expect(await setup.channel.deliver(notification, to: setup.device()) == .accepted("APNs accepted it"))
            let body = try #require(setup.apns.received.first?.body)
            #expect(body.count <= 4_096)
            let aps = try #require((try JSONSerialization.jsonObject(with: Data(body)) as? [String: Any])?["aps"] as? [String: Any])
            let alert = try #require(aps["alert"] as? [String: String])
            #expect(alert["title"]?.hasPrefix("Water 64 plants: ") == true)
            #expect(alert["body"]?.contains(" more") == true)
        }
    }

    @Test func settingsAndKeysAreCheckedWithASentenceSayingWhatToFix() throws {
        var settings = APNsSettings(keyFile: "/nonexistent/AuthKey.p8", keyID: FakeAPNs.keyID, teamID: FakeAPNs.teamID, topic: FakeAPNs.topic)
        #expect(throws: CanopyError.self) { try APNsChannel(settings: settings, logger: Logger(label: "test")) }
        settings.keyID = "short"
        #expect { try settings.validate() } throws: { ($0 as? CanopyError)?.message.contains("key id") == true }
        settings.keyID = FakeAPNs.keyID
        settings.tokenLifetime = .seconds(90 * 60)
        #expect { try settings.validate() } throws: { ($0 as? CanopyError)?.message.contains("20 to 60 minutes") == true }
        settings.tokenLifetime = .seconds(50 * 60)
        settings.server = "http://api.push.apple.com"
        #expect { try settings.validate() } throws: { ($0 as? CanopyError)?.message.contains("https") == true }
    }

    // MARK: - Through the dispatcher

    @Test func throughTheDispatcherA410DeactivatesThePhoneAndA429IsRetried() async throws {
        try await withAPNs { setup in
            var logger = Logger(label: "test")
            logger.logLevel = .critical
            let store = try SQLiteReminderStore(path: setup.directory.appendingPathComponent("remind.sqlite").path)
            let library = ReminderLibrary(store: store, channels: [.apns, .log])
            let phone = try library.register(.init(channel: .apns, address: Self.phone.uppercased(), name: "iPhone"), owner: "alice")
            #expect(phone.address == Self.phone, "tokens are kept in lower case")
            var settings = DispatchSettings()
            settings.firstBackoff = .seconds(2)
            let dispatcher = Dispatcher(store: store, channels: [setup.channel], clock: setup.clock, settings: settings, logger: logger)
            try await withRunning([dispatcher], logger: logger) {
                let t = setup.clock.now()

                // Throttled once, then delivered on the retry.
                setup.apns.script([(429, "TooManyRequests")])
                dispatcher.schedule(try await library.sync([.water("p1", due: t + 60, name: "Fern")], owner: "alice", now: t))
                setup.clock.advance(by: 60)
                #expect(try await eventually { setup.apns.received.count == 1 })
                #expect(
                    try await eventually { // the attempt is recorded with its backoff
                        try store.database.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM attempts") ?? 0 } == 1
                    })
                setup.clock.advance(by: 3)
                #expect(try await eventually { setup.apns.received.count == 2 })
                #expect(try await eventually { try library.pending(owner: "alice", limit: 10).isEmpty })
                #expect(setup.apns.received.map(\.status) == [429, 200])
                #expect(setup.apns.received[0].headers["apns-id"] == setup.apns.received[1].headers["apns-id"], "a resend keeps its apns-id")

                // The app was removed: 410, the phone deactivated, nothing more sent to it.
                setup.apns.unregister(Self.phone)
                dispatcher.schedule(
                    try await library.sync(
                        [.water("p2", due: t + 3_600, name: "Pothos"), .water("p3", due: t + 7_200, name: "Ivy")],
                        owner: "alice", now: setup.clock.now()))
                setup.clock.advance(by: 3_600)
                #expect(try await eventually { try library.devices(owner: "alice").first?.active == false })
                #expect(try library.devices(owner: "alice").first?.deactivatedReason?.contains("Unregistered") == true)
                #expect(try library.failures(owner: "alice", limit: 10).first?.lastError.contains("410") == true)
                setup.clock.advance(by: 3_600)
                #expect(try await eventually { dispatcher.held.sends == 0 }, "nothing left to send")
                #expect(setup.apns.received.count == 3, "nothing goes to a deactivated phone")

                // Registering again makes it active.
                #expect(try library.register(.init(channel: .apns, address: Self.phone, name: "iPhone"), owner: "alice").active)
            }
        }
    }

    @Test func withoutAPNsConfiguredAnAPNsDeviceIsRefusedWhenItRegisters() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-apns-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try SQLiteReminderStore(path: directory.appendingPathComponent("remind.sqlite").path)
        let library = ReminderLibrary(store: store, channels: [.log, .webhook, .ntfy])
        #expect { try library.register(.init(channel: .apns, address: Self.phone), owner: "alice") } throws: {
            ($0 as? CanopyError)?.message.contains("does not deliver through apns") == true
        }
        #expect(try library.devices(owner: "alice").isEmpty)
    }

    // MARK: - As serve builds it

    @Test func theServiceBuiltWithAPNsSettingsDeliversToAnAPNsDeviceOverTheBus() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-apns-live-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        let apns = try FakeAPNs(directory: directory)
        try await withRunning([apns.application], logger: logger) {
            let keyFile = directory.appendingPathComponent("AuthKey.p8")
            try Data(apns.keyPEM.utf8).write(to: keyFile)
            var configured = APNsSettings(keyFile: keyFile.path, keyID: FakeAPNs.keyID, teamID: FakeAPNs.teamID, topic: FakeAPNs.topic)
            configured.server = try await apns.url()
            configured.caFile = apns.caFile.path
            try await withLiveBus { bus in
                var settings = ReminderServiceSettings(directory: directory.appendingPathComponent("remind"), runner: bus.runnerConfiguration())
                settings.apns = configured
                bus.run(try await buildReminderService(settings: settings, context: bus.context, logger: bus.logger))
                try await bus.waitForWorkers(1, service: Reminders.service)
                let client = try bus.client()
                let phone = try await client.call(Reminders.RegisterDevice.self, .init(channel: .apns, address: Self.phone, name: "iPhone"), principal: "alice")
                let test = try await client.call(Reminders.SendTest.self, .init(deviceID: phone.id), principal: "alice")
                #expect(test.accepted, "\(test.detail)")
                #expect(apns.received.count == 1 && apns.received.first?.http2 == true && apns.received.first?.deviceToken == Self.phone)
                // Bob cannot reach Alice's phone.
                await #expect(throws: CanopyError.self) {
                    _ = try await client.call(Reminders.SendTest.self, .init(deviceID: phone.id), principal: "bob")
                }
                #expect(apns.received.count == 1)
            }
        }
    }
}
