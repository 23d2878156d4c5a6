import CanopyMessages
import CanopyOutbound
import CanopyServiceKit
import CanopyTesting
import Foundation
import GRDB
import Logging
import ServiceLifecycle
import Testing

@testable import CanopyRemind

/// The reminder queue with a hand-driven clock and a local webhook receiver: on time, once,
/// digested, retried, given up, stale after an outage.
@Suite(.serialized)
struct DispatcherTests {
    static let start = Date(timeIntervalSince1970: 1_800_000_000)
    static let secret = "whsec_" + Data((0..<32).map { UInt8($0 &* 7 &+ 3) }).base64EncodedString()

    struct Setup {
        let store: SQLiteReminderStore
        let library: ReminderLibrary
        let dispatcher: Dispatcher
        let clock: ManualClock
        let receiver: RecordingServer
        let webhook: String

        /// Alice's reminders for these tasks.
        func sync(_ tasks: [Care.Task], owner: String = "alice") async throws {
            dispatcher.schedule(try await library.sync(tasks, owner: owner, now: clock.now()))
        }

        /// Attempts recorded so far (the receiver counts a request when it arrives, before the
        /// dispatcher has its answer and schedules the retry from its clock).
        func attempts() throws -> Int {
            try store.database.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM attempts") ?? 0 }
        }

        func states() throws -> [String: String] {
            try store.database.read { db in
                Dictionary(
                    uniqueKeysWithValues: try Row.fetchAll(db, sql: "SELECT taskID, state FROM reminders").map {
                        ($0["taskID"] as String, $0["state"] as String)
                    })
            }
        }
    }

    func withDispatcher(
        settings: DispatchSettings = .init(), preload: (ReminderLibrary) async throws -> Void = { _ in },
        _ body: (Setup) async throws -> Void
    ) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-remind-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        var logger = Logger(label: "test")
        logger.logLevel = .warning
        let store = try SQLiteReminderStore(path: directory.appendingPathComponent("remind.sqlite").path)
        let library = ReminderLibrary(store: store, allowedHosts: ["127.0.0.1", "127.0.0.2"])
        let receiver = RecordingServer()
        try await withRunning([receiver.application], logger: logger) {
            let webhook = try await receiver.url("/hooks/alice")
            let device = try library.register(.init(channel: .webhook, address: webhook, name: "phone", secret: Self.secret), owner: "alice")
            #expect(device.active)
            try await preload(library) // what the store held before the dispatcher started
            let clock = ManualClock(Self.start)
            let http = try notificationHTTP(allowedHosts: ["127.0.0.1", "127.0.0.2"])
            let dispatcher = Dispatcher(
                store: store, channels: [LogChannel(logger: logger), WebhookChannel(http: http, now: { clock.now() })],
                clock: clock, settings: settings, logger: logger)
            try await withRunning([dispatcher], logger: logger) {
                try await body(Setup(store: store, library: library, dispatcher: dispatcher, clock: clock, receiver: receiver, webhook: webhook))
            }
        }
    }

    // MARK: - Sync by difference

    @Test func syncKeepsChangesAndDropsByDifferenceAndNeverBringsBackWhatWasSent() async throws {
        try await withDispatcher { setup in
            let t = Self.start
            let library = setup.library
            #expect(try await library.sync([.water("p1", due: t + 3_600), .water("p2", due: t + 7_200)], owner: "bob").count == 2)
            #expect(try await library.sync([.water("p1", due: t + 3_600), .water("p2", due: t + 7_200)], owner: "bob").isEmpty, "unchanged: nothing new")
            // p2 vanished, p3 is new, p1's title changed, and p1 is snoozed (moved).
            var snoozed = Care.Task.water("p1", due: t + 3_600, name: "Big Monty")
            snoozed.snoozedUntil = t + 5_400
            let moved = try await library.sync([snoozed, .water("p3", due: t + 9_000)], owner: "bob")
            #expect(moved.map(\.fireAt).sorted() == [(t + 5_400).timeIntervalSince1970, (t + 9_000).timeIntervalSince1970])
            #expect(try library.pending(owner: "bob", limit: 10).map(\.title) == ["Water Big Monty", "Water p3"])
            // Once sent, the same occurrence never comes back as pending.
            try await setup.store.database.write { db in try db.execute(sql: "UPDATE reminders SET state = 'delivered' WHERE taskID = 'p1:water'") }
            #expect(try await library.sync([snoozed, .water("p3", due: t + 9_000)], owner: "bob").isEmpty)
            #expect(try library.pending(owner: "bob", limit: 10).map(\.taskID) == ["p3:water"])
            // Its next occurrence is a new reminder.
            #expect(try await library.sync([.water("p1", due: t + 90_000), .water("p3", due: t + 9_000)], owner: "bob").count == 1)
            #expect(try library.pending(owner: "alice", limit: 10).isEmpty, "someone else's window is their own")
        }
    }

    @Test func manySyncsNeitherDoubleNorDropAnything() async throws {
        try await withDispatcher { setup in
            var random = SystemRandomNumberGenerator()
            var delivered = Set<String>()
            for round in 0..<60 {
                let tasks = (0..<Int.random(in: 0...40, using: &random)).map { index in
                    Care.Task.water(
                        "p\(Int.random(in: 0..<30, using: &random))",
                        due: Self.start + Double(Int.random(in: 1...20, using: &random) * 3_600) + Double(index % 2))
                }
                _ = try await setup.library.sync(tasks, owner: "carol")
                let expected = Set(tasks.map { "\($0.id)@\($0.due.timeIntervalSince1970)" }).subtracting(delivered)
                let pending = try setup.library.pending(owner: "carol", limit: 256).map { "\($0.taskID)@\($0.due.timeIntervalSince1970)" }
                #expect(pending.count == Set(pending).count, "round \(round): nothing doubled")
                #expect(Set(pending) == expected, "round \(round): the window, less what was sent")
                // Now and then some are sent.
                if round % 7 == 3, let some = pending.first {
                    delivered.insert(some)
                    let parts = some.split(separator: "@")
                    try await setup.store.database.write { db in
                        try db.execute(
                            sql: "UPDATE reminders SET state = 'delivered' WHERE owner = 'carol' AND taskID = ? AND due = ?",
                            arguments: [String(parts[0]), Double(parts[1])!])
                    }
                }
            }
        }
    }

    // MARK: - On time, digested, signed

    @Test func remindersFireOnTimeDigestedAndSignedAsStandardWebhooksSay() async throws {
        try await withDispatcher { setup in
            let t = Self.start
            try await setup.sync([
                .water("p1", due: t + 60, name: "Monstera"), .water("p2", due: t + 300, name: "Pothos"), .water("p3", due: t + 2_000, name: "Fern"),
            ])
            setup.clock.advance(by: 59)
            #expect(try await !eventually(within: .milliseconds(300)) { !setup.receiver.received.isEmpty }, "nothing before its time")
            setup.clock.advance(by: 1)
            #expect(try await eventually { setup.receiver.received.count == 1 })
            let first = try #require(setup.receiver.received.first)
            let payload = try MessageCodec().decode(WebhookChannel.Payload.self, from: first.body)
            #expect(payload.data.title == "Water 2 plants: Monstera, Pothos", "p2, due within the digest window, comes along")
            #expect(payload.data.reminders.map(\.taskID) == ["p1:water", "p2:water"])
            #expect(first.headers["webhook-id"] == payload.data.id && first.headers["webhook-timestamp"] == "\(Int(t.timeIntervalSince1970) + 60)")
            #expect(try Self.verifiedIndependently(first, secret: Self.secret), "a verifier written from the specification accepts it")
            var tampered = first
            tampered.body[tampered.body.count / 2] ^= 1
            #expect(try !Self.verifiedIndependently(tampered, secret: Self.secret))
            #expect(try await eventually { try setup.states()["p1:water"] == "delivered" && setup.states()["p2:water"] == "delivered" })
            #expect(try setup.library.pending(owner: "alice", limit: 10).map(\.taskID) == ["p3:water"])

            setup.clock.advance(by: 2_000)
            #expect(try await eventually { setup.receiver.received.count == 2 })
            #expect(try MessageCodec().decode(WebhookChannel.Payload.self, from: setup.receiver.received[1].body).data.title == "Water Fern")
            // Nothing left to send (no send held, none running): nothing more can arrive.
            #expect(try await eventually { setup.dispatcher.held.sends == 0 })
            #expect(setup.receiver.received.count == 2, "each once")
        }
    }

    /// Standard Webhooks verification, written from the specification in Python's standard
    /// library (not with Canopy's code): the signed content is `id.timestamp.body`, the key the
    /// base64 after `whsec_`, the signature `v1,` and base64 of HMAC-SHA256.
    static func verifiedIndependently(_ request: RecordingServer.Received, secret: String) throws -> Bool {
        let script = """
            import base64, hashlib, hmac, sys
            secret, msg_id, timestamp, signatures = sys.argv[1:5]
            body = sys.stdin.buffer.read()
            key = base64.b64decode(secret.split("_", 1)[1])
            signed = msg_id.encode() + b"." + timestamp.encode() + b"." + body
            expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
            ok = any(hmac.compare_digest(part.split(",", 1)[1], expected) for part in signatures.split(" ") if part.startswith("v1,"))
            sys.exit(0 if ok else 1)
            """
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [
            "python3", "-c", script, secret, request.headers["webhook-id"] ?? "", request.headers["webhook-timestamp"] ?? "",
            request.headers["webhook-signature"] ?? "",
        ]
        let input = Pipe()
        process.standardInput = input
        try process.run()
        input.fileHandleForWriting.write(Data(request.body))
        try input.fileHandleForWriting.close()
        process.waitUntilExit()
        return process.terminationStatus == 0
    }

    // MARK: - Independent deliveries

    /// A due time handed over with milliseconds (as canopy-care sends it) goes out in the
    /// notification with the same milliseconds, at odd ones too: the wire's dates rounded down
    /// turned `.389` into `.388` on each hop.
    @Test func dueTimesKeepTheirMillisecondsFromTheSyncToTheNotification() async throws {
        var settings = DispatchSettings()
        settings.digestWindow = .zero // a notification each
        try await withDispatcher(settings: settings) { setup in
            struct Stamp: Codable { var at: Date }
            let codec = MessageCodec()
            // 2027-01-15T08:01:00.389Z and others: one a minute, each its own odd milliseconds.
            let texts = ["389", "001", "999", "577"].enumerated().map { index, milliseconds in
                String(decoding: try! codec.encode(Stamp(at: Self.start + Double(60 * (index + 1)))), as: UTF8.self)
                    .replacingOccurrences(of: ".000Z", with: ".\(milliseconds)Z")
            }
            let dues = try texts.map { try codec.decode(Stamp.self, from: Array($0.utf8)).at }
            try await setup.sync(dues.enumerated().map { .water("p\($0.offset)", due: $0.element) })
            #expect(try setup.library.pending(owner: "alice", limit: 10).map { String(decoding: try codec.encode(Stamp(at: $0.due)), as: UTF8.self) } == texts)
            for count in 1...texts.count {
                setup.clock.advance(by: count == 1 ? 61 : 60) // past each one's milliseconds
                #expect(try await eventually { setup.receiver.received.count == count })
            }
            let sent = try setup.receiver.received.map { try codec.decode(WebhookChannel.Payload.self, from: $0.body).data.reminders[0].due }
            #expect(sent.map { String(decoding: try! codec.encode(Stamp(at: $0)), as: UTF8.self) } == texts)
            #expect(
                zip(setup.receiver.received, texts).allSatisfy { received, text in
                    String(decoding: received.body, as: UTF8.self).contains(#""due":"\#(text.dropFirst(7).dropLast(2))""#)
                }, "the notification's own text")
        }
    }

    @Test func aReceiverThatNeverAnswersHoldsBackOnlyItsOwnReminders() async throws {
        var settings = DispatchSettings()
        settings.concurrency = 4
        settings.perDestination = 2
        try await withDispatcher(settings: settings) { setup in
            let t = Self.start
            // Mallory registers five devices at a receiver that hangs (anyone can).
            let hanging = RecordingServer(host: "127.0.0.2") // another host than Alice's receiver
            hanging.hold()
            try await withRunning([hanging.application], logger: Logger(label: "test")) {
                for index in 0..<5 {
                    let address = try await hanging.url("/hooks/mallory/\(index)")
                    _ = try setup.library.register(.init(channel: .webhook, address: address, name: "tablet \(index)", secret: Self.secret), owner: "mallory")
                }
                setup.dispatcher.schedule(try await setup.library.sync([.water("m1", due: t + 60)], owner: "mallory", now: setup.clock.now()))
                try await setup.sync([.water("a1", due: t + 61, name: "Monstera")])
                setup.clock.advance(by: 60)
                #expect(try await eventually { hanging.arrived == 2 }, "two of Mallory's five sends reach her host; three wait for it")
                setup.clock.advance(by: 1)
                #expect(try await eventually { setup.receiver.received.count == 1 }, "Alice's reminder goes while Mallory's host hangs")
                #expect(try await eventually { try setup.states()["a1:water"] == "delivered" })
                #expect(hanging.arrived == 2 && hanging.received.isEmpty, "still nothing answered there, and no more than its share in flight")
                hanging.release()
                #expect(try await eventually { hanging.received.count == 5 }, "then her own five arrive")
            }
        }
    }

    // MARK: - Retries and dead letters

    @Test func failuresAreRetriedWithBackoffThenGivenUpAsADeadLetter() async throws {
        var settings = DispatchSettings()
        settings.maximumAttempts = 4
        try await withDispatcher(settings: settings) { setup in
            let t = Self.start
            setup.receiver.answer([500, 503])
            try await setup.sync([.water("p1", due: t + 10)])
            setup.clock.advance(by: 10)
            #expect(try await eventually { try setup.attempts() == 1 })
            setup.clock.advance(by: 1.3) // the first pause: 1 s ± 20%
            #expect(try await eventually { try setup.attempts() == 2 })
            setup.clock.advance(by: 2.5) // the second: 2 s ± 20%
            #expect(try await eventually { setup.receiver.received.count == 3 })
            #expect(try await eventually { try setup.states()["p1:water"] == "delivered" })
            let keys = Set(setup.receiver.received.compactMap { $0.headers["webhook-id"] })
            #expect(keys.count == 1, "every try carries the same idempotency key")

            // Four failures in a row: a dead letter.
            setup.receiver.answer([500, 500, 500, 500])
            try await setup.sync([.water("p1", due: t + 10), .water("p2", due: t + 100)])
            setup.clock.advance(by: 100)
            for (count, pause) in [(4, 1.3), (5, 2.5), (6, 4.9)] {
                #expect(try await eventually { try setup.attempts() == count })
                setup.clock.advance(by: pause)
            }
            #expect(try await eventually { try setup.states()["p2:water"] == "failed" })
            let failures = try setup.library.failures(owner: "alice", limit: 10)
            #expect(failures.map(\.reminder.taskID) == ["p2:water"] && failures.first?.attempts == 4)
            #expect(failures.first?.lastError.contains("500") == true)
            #expect(setup.receiver.received.count == 7)
        }
    }

    @Test func aDeviceThatIsGoneIsDeactivatedAndGetsNothingMoreUntilItRegistersAgain() async throws {
        try await withDispatcher { setup in
            let t = Self.start
            setup.receiver.answer([410])
            try await setup.sync([.water("p1", due: t + 10)])
            setup.clock.advance(by: 10)
            #expect(try await eventually { try setup.library.devices(owner: "alice").first?.active == false })
            #expect(try setup.library.devices(owner: "alice").first?.deactivatedReason?.contains("410") == true)
            try await setup.sync([.water("p1", due: t + 10), .water("p2", due: t + 100)])
            setup.clock.advance(by: 100)
            #expect(try await eventually { try setup.states()["p2:water"] == "delivered" }, "with no active device a reminder counts as done")
            #expect(setup.receiver.received.count == 1)
            _ = try setup.library.register(.init(channel: .webhook, address: setup.webhook, secret: Self.secret), owner: "alice")
            #expect(try setup.library.devices(owner: "alice").first?.active == true)
        }
    }

    @Test func cancellingAPlantDropsItsReminders() async throws {
        try await withDispatcher { setup in
            let t = Self.start
            try await setup.sync([.water("p1", due: t + 60), .water("p2", due: t + 60)])
            try setup.library.cancel(plantID: "p1", owner: "alice")
            try setup.library.cancel(plantID: "p2", owner: "mallory") // not hers: nothing happens
            setup.clock.advance(by: 60)
            #expect(try await eventually { setup.receiver.received.count == 1 })
            let payload = try MessageCodec().decode(WebhookChannel.Payload.self, from: setup.receiver.received[0].body)
            #expect(payload.data.reminders.map(\.taskID) == ["p2:water"])
        }
    }

    @Test func afterAnOutageOverdueRemindersGoAtOnceAndVeryOldOnesAreRecordedStale() async throws {
        let t = Self.start
        try await withDispatcher(preload: { library in
            _ = try await library.sync([.water("old", due: t - 13 * 3_600), .water("recent", due: t - 3_600)], owner: "alice")
        }) { setup in
            #expect(try await eventually { setup.receiver.received.count == 1 })
            let payload = try MessageCodec().decode(WebhookChannel.Payload.self, from: setup.receiver.received[0].body)
            #expect(payload.data.reminders.map(\.taskID) == ["recent:water"])
            #expect(try setup.states()["old:water"] == "stale")
            #expect(try setup.library.failures(owner: "alice", limit: 10).map(\.reminder.taskID) == ["old:water"])
        }
    }

    @Test func ntfyGetsTheTitleTagsPriorityAndToken() async throws {
        try await withDispatcher { setup in
            let topic = try await setup.receiver.url("/plants-alice")
            let device = try setup.library.register(.init(channel: .ntfy, address: topic, accessToken: "tk_secret"), owner: "erin")
            let channel = NtfyChannel(http: try notificationHTTP(allowedHosts: ["127.0.0.1"]))
            let reminders = [
                Reminders.Reminder(taskID: "a:water", plantID: "a", kind: .water, title: "Water Monstera", due: Self.start, state: .sending),
                Reminders.Reminder(taskID: "b:water", plantID: "b", kind: .water, title: "Water Pothos", due: Self.start, state: .sending),
            ]
            let notification = ReminderNotification(
                id: ReminderNotification.key(deviceID: device.id, reminders: reminders.map { ($0.taskID, $0.due.timeIntervalSince1970) }),
                reminders: reminders)
            let record = try await setup.store.read { data in try data.device(owner: "erin", id: device.id) }
            #expect(await channel.deliver(notification, to: try #require(record)) == .accepted("HTTP 200"))
            let received = try #require(setup.receiver.received.last)
            #expect(received.path == "/plants-alice")
            #expect(received.headers["title"] == "Water 2 plants: Monstera, Pothos")
            #expect(received.headers["tags"] == "droplet" && received.headers["priority"] == "high")
            #expect(received.headers["authorization"] == "Bearer tk_secret")
            #expect(received.headers["x-canopy-id"] == notification.id)
            #expect(String(decoding: received.body, as: UTF8.self) == "Water Monstera\nWater Pothos")
            // The key is the same for the same reminders and device, and differs for another device.
            #expect(
                ReminderNotification.key(
                    deviceID: device.id, reminders: [("b:water", Self.start.timeIntervalSince1970), ("a:water", Self.start.timeIntervalSince1970)])
                    == notification.id)
            #expect(ReminderNotification.key(deviceID: "other", reminders: [("a:water", Self.start.timeIntervalSince1970)]) != notification.id)
        }
    }

    // MARK: - Bad input

    @Test func devicesAreCheckedWhenTheyRegister() async throws {
        try await withDispatcher { setup in
            let cases: [Reminders.RegisterDevice.Request] = [
                .init(channel: .apns, address: "not-a-token"),
                .init(channel: .webhook, address: "ftp://example.com/x", secret: Self.secret),
                .init(channel: .webhook, address: "https://example.com/hook"), // no secret
                .init(channel: .webhook, address: "https://example.com/hook", secret: "whsec_c2hvcnQ="),
            ]
            for request in cases {
                #expect(throws: CanopyError.self) { try request.validate() }
            }
            let library = ReminderLibrary(store: setup.store) // no host allowed
            for address in [
                "http://127.0.0.1:8080/x", "http://10.1.2.3/x", "http://[::1]/x", "http://localhost/x", "http://169.254.169.254/latest",
                "http://[::a9fe:a9fe]/", "http://[64:ff9b::a9fe:a9fe]/", "http://[2002:a9fe:a9fe::1]/", "http://[::ffff:10.0.0.1]/",
            ] {
                let error = #expect(throws: CanopyError.self) {
                    _ = try library.register(.init(channel: .webhook, address: address, secret: Self.secret), owner: "alice")
                }
                #expect(error?.message.contains("private") == true, "\(address)")
            }
            let unresolvable = #expect(throws: CanopyError.self) {
                _ = try library.register(.init(channel: .webhook, address: "https://no-such-host.invalid/hook", secret: Self.secret), owner: "alice")
            }
            #expect(unresolvable?.message.contains("does not resolve") == true)
            #expect(!PublicAddress.isInternal([93, 184, 216, 34]))
            #expect(PublicAddress.isInternal([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 192, 168, 1, 1]), "IPv4-mapped private")

            // Checked again where the delivery connects: a device registered while its host was
            // allowed goes nowhere once the connection's own check refuses the address.
            let device = try setup.library.register(.init(channel: .webhook, address: setup.webhook, name: "old", secret: Self.secret), owner: "frank")
            let strict = WebhookChannel(http: try notificationHTTP(allowedHosts: []))
            let outcome = await strict.deliver(
                ReminderNotification(id: "00000000-0000-0000-0000-000000000001", reminders: []),
                to: try #require(try await setup.store.read { data in try data.device(owner: "frank", id: device.id) }))
            guard case .rejected(let reason, deactivate: false) = outcome else {
                Issue.record("\(outcome)")
                return
            }
            #expect(reason.contains("internal"))
            #expect(setup.receiver.received.isEmpty, "nothing reached the internal address")
        }
    }
}
