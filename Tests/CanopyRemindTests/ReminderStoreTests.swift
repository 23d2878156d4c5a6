import CanopyMessages
import CanopyStore
import CanopyTesting
import Foundation
import Logging
import Testing

@testable import CanopyRemind

/// The store contract (``ReminderStoring``) on its own, without the library's or the
/// dispatcher's rules: what any implementation must do. It runs against each implementation:
/// SQLite, and PostgreSQL on a throwaway server the tests start (a fresh database each test).
struct ReminderStoreTests {
    static let contract = StoreContract<any ReminderStoring>("remind-store", sqlite: { try SQLiteReminderStore(path: $0.path("remind.sqlite")) }) { url, _ in
        let store = try await PostgresReminderStore.open(url: url, logger: Logger(label: "remind-store-test"))
        return (store, store.database.close)
    }

    static func open(_ backend: StoreBackend) async throws -> (any ReminderStoring, cleanup: () -> Void) {
        let opened = try await contract.open(backend)
        return (opened.store, opened.cleanup)
    }

    let now = Date(timeIntervalSince1970: 1_780_000_000)

    func task(_ id: String, plant: String = "p1", in seconds: TimeInterval) -> Care.Task {
        Care.Task(id: id, plantID: plant, kind: .water, title: "Water \(id)", due: now.addingTimeInterval(seconds))
    }

    func device(_ id: String) -> Reminders.Device {
        Reminders.Device(id: id, channel: .log, address: "log-\(id)", name: nil, active: true, registeredAt: now)
    }

    @Test(arguments: StoreBackend.allCases)
    func devicesAndRemindersAreScopedToTheirOwner(_ backend: StoreBackend) async throws {
        let (store, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        try await store.write { (data: any ReminderWrites) throws in
            try data.insertDevice(device("d1"), owner: "alice", secret: "whsec_x", accessToken: nil)
            _ = try data.apply(SyncPlan(window: [task("t1", in: 60)], known: []), owner: "alice", now: now)
        }
        try await store.read { (data: any ReminderReads) throws in
            #expect(try data.device(owner: "alice", id: "d1")?.secret == "whsec_x")
            #expect(try data.device(owner: "bob", id: "d1") == nil)
            #expect(try data.devices(owner: "bob", activeOnly: false).isEmpty)
            #expect(try data.deviceID(owner: "alice", channel: .log, address: "log-d1") == "d1")
            #expect(try data.knownReminders(owner: "bob").isEmpty)
            #expect(try data.upcoming(owner: "alice", limit: 10).map(\.taskID) == ["t1"])
        }
        try await store.write { (data: any ReminderWrites) throws in
            try data.removeDevice(owner: "bob", id: "d1")
            try data.cancelPlant("p1", owner: "bob")
        }
        #expect(try await store.read { data in try data.deviceCount(owner: "alice") } == 1)
        #expect(try await store.read { data in try data.pendingSummary(owner: "alice").count } == 1)
    }

    @Test(arguments: StoreBackend.allCases)
    func aSyncPlanAppliedIsWhatTheNextSyncCompares(_ backend: StoreBackend) async throws {
        let (store, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        let first = [task("t1", in: 60), task("t2", in: 120)]
        let scheduled = try await store.write { data in try data.apply(SyncPlan(window: first, known: []), owner: "alice", now: now) }
        #expect(scheduled.map(\.fireAt) == first.map { $0.due.timeIntervalSince1970 })
        let known = try await store.read { data in try data.knownReminders(owner: "alice") }
        #expect(SyncPlan(window: first, known: known).isEmpty, "the same window again changes nothing")
        var moved = first
        moved[0].snoozedUntil = now.addingTimeInterval(600)
        let second = SyncPlan(window: [moved[0]], known: known)
        let rescheduled = try await store.write { data in try data.apply(second, owner: "alice", now: now) }
        #expect(rescheduled.map(\.fireAt) == [now.addingTimeInterval(600).timeIntervalSince1970])
        try await store.read { (data: any ReminderReads) throws in
            #expect(try data.upcoming(owner: "alice", limit: 10).map(\.taskID) == ["t1"], "t2 left the window")
            #expect(try data.pendingSummary(owner: "alice").lastFireAt == now.addingTimeInterval(600))
            #expect(try data.pendingReminders(owner: "alice", firingAfter: now, through: now.addingTimeInterval(600)).count == 1)
        }
        #expect(try store.pendingSends().isEmpty)
    }

    @Test(arguments: StoreBackend.allCases)
    func aSendIsRecordedOnceAndSettlesItsReminders(_ backend: StoreBackend) async throws {
        let (store, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        let ids = try await store.write { (data: any ReminderWrites) throws -> [Int64] in
            try data.insertDevice(device("d1"), owner: "alice", secret: nil, accessToken: nil)
            return try data.apply(SyncPlan(window: [task("t1", in: 0), task("t2", plant: "p2", in: 0)], known: []), owner: "alice", now: now).map(\.id)
        }
        let rows = try await store.read { data in try data.pendingReminders(ids: ids) }
        let notification = ReminderNotification(
            id: ReminderNotification.key(deviceID: "d1", reminders: rows.map { ($0.reminder.taskID, $0.reminder.due.timeIntervalSince1970) }),
            reminders: rows.map(\.reminder))
        let send = try await store.write { (data: any ReminderWrites) throws -> Int64? in
            try data.setState(.sending, ofReminders: ids, at: now)
            let send = try data.insertSend(owner: "alice", deviceID: "d1", notification: notification, reminderIDs: ids, at: now)
            #expect(try data.insertSend(owner: "alice", deviceID: "d1", notification: notification, reminderIDs: ids, at: now) == nil, "the same key twice")
            return send
        }
        let sendID = try #require(send)
        let pending = try await #require(try store.read { data in try data.pendingSend(id: sendID) })
        #expect(pending.send.notification == notification && pending.send.attempts == 0 && pending.device?.device.id == "d1")
        // A retry keeps it pending; delivered, it settles both reminders.
        let attempt = Dispatcher.Attempt(sendID: sendID, attempt: 1, deviceID: "d1", outcome: .retry("503"), due: now)
        try await store.write { data in try data.record(attempt, update: .retry(at: now.timeIntervalSince1970 + 1, reason: "503"), at: now) }
        #expect(try store.pendingSends().map(\.nextAttempt) == [now.timeIntervalSince1970 + 1])
        try await store.write { (data: any ReminderWrites) throws in
            var delivered = attempt
            delivered.attempt = 2
            delivered.outcome = .accepted("200")
            try data.record(delivered, update: .delivered, at: now)
            try data.settleReminders(ofSend: sendID, at: now)
        }
        #expect(try store.pendingSends().isEmpty)
        #expect(try await store.read { data in try data.pendingSend(id: sendID) } == nil)
        #expect(try await store.read { data in try data.upcoming(owner: "alice", limit: 10) }.isEmpty, "both delivered")
        // Cancelling one plant keeps the digest that also named the other.
        try await store.write { data in try data.cancelPlant("p1", owner: "alice") }
        #expect(try await store.read { data in try data.sendExists(id: sendID) })
        try await store.write { data in try data.cancelPlant("p2", owner: "alice") }
        #expect(try await !store.read { data in try data.sendExists(id: sendID) }, "nothing of its plants is left")
    }

    /// The dispatcher's batches do for many people what the one-at-a-time calls do for one:
    /// PostgreSQL answers each with a statement or two, SQLite one call at a time.
    @Test(arguments: StoreBackend.allCases)
    func theDispatchersBatchesDoWhatTheSingleCallsDo(_ backend: StoreBackend) async throws {
        let (store, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        let people = ["alice", "bob", "carol"]
        let scheduled = try await store.write { (data: any ReminderWrites) throws -> [String: [Int64]] in
            var scheduled: [String: [Int64]] = [:]
            for person in people {
                try data.insertDevice(device("d-\(person)"), owner: person, secret: nil, accessToken: nil)
                scheduled[person] = try data.apply(
                    SyncPlan(window: [task("t1", in: 0), task("t2", plant: "p2", in: 300), task("t3", plant: "p3", in: 3_600)], known: []), owner: person,
                    now: now
                ).map(\.id)
            }
            try data.deactivateDevice(id: "d-carol", reason: "410 Unregistered")
            return scheduled
        }
        try await store.read { (data: any ReminderReads) throws in
            let companions = try data.pendingReminders(owners: ["alice", "bob"], firingAfter: now, through: now.addingTimeInterval(600))
            #expect(Set(companions.map { "\($0.owner):\($0.reminder.taskID)" }) == ["alice:t2", "bob:t2"])
            let devices = try data.activeDevices(owners: people)
            #expect(devices["alice"]?.map(\.device.id) == ["d-alice"] && devices["bob"]?.map(\.device.id) == ["d-bob"])
            #expect(devices["carol"] ?? [] == [], "an inactive device is not one to send to")
        }
        let made = try await store.write { (data: any ReminderWrites) throws -> [Int64?] in
            #expect(try data.lockOwners(people) == Set(people))
            let sends = try ["alice", "bob"].map { person in
                let rows = try data.pendingReminders(ids: scheduled[person]!).filter { $0.reminder.taskID == "t1" }
                return NewSend(
                    owner: person, deviceID: "d-\(person)",
                    notification: ReminderNotification(
                        id: ReminderNotification.key(
                            deviceID: "d-\(person)", reminders: rows.map { ($0.reminder.taskID, $0.reminder.due.timeIntervalSince1970) }),
                        reminders: rows.map(\.reminder)), reminderIDs: rows.map(\.id))
            }
            try data.setState(.sending, ofReminders: sends.flatMap(\.reminderIDs), at: now)
            let made = try data.insertSends(sends, at: now, leasedUntil: now.addingTimeInterval(120))
            #expect(try data.insertSends([sends[0]], at: now, leasedUntil: now.addingTimeInterval(120)) == [nil], "the same key twice")
            return made
        }
        let ids = made.compactMap { $0 }
        #expect(ids.count == 2)
        #expect(try await store.read { data in try data.existingSends(ids: ids + [999_999]) } == Set(ids))
        let alice = try await #require(try store.read { data in try data.pendingSend(id: ids[0]) })
        #expect(alice.send.owner == "alice" && alice.send.notification.reminders.map(\.taskID) == ["t1"])
        // One delivered, one to try again: only the delivered one's reminder is settled.
        try await store.write { (data: any ReminderWrites) throws in
            #expect(try data.lockForRecording(sendIDs: ids + [999_999]) == Set(ids), "a send that is gone is not recorded")
            try data.record(
                [
                    (Dispatcher.Attempt(sendID: ids[0], attempt: 1, deviceID: "d-alice", outcome: .accepted("200"), due: now), .delivered),
                    (
                        Dispatcher.Attempt(sendID: ids[1], attempt: 1, deviceID: "d-bob", outcome: .retry("503"), due: now),
                        .retry(at: now.timeIntervalSince1970 + 2, reason: "503")
                    ),
                ], at: now)
            try data.settleReminders(ofSends: [ids[0]], at: now)
        }
        #expect(try store.pendingSends().map(\.id) == [ids[1]] && store.pendingSends().map(\.nextAttempt) == [now.timeIntervalSince1970 + 2])
        try await store.read { (data: any ReminderReads) throws in
            #expect(try data.upcoming(owner: "alice", limit: 10).map(\.taskID) == ["t2", "t3"], "alice's t1 went")
            #expect(try data.upcoming(owner: "bob", limit: 10).map(\.taskID) == ["t1", "t2", "t3"], "bob's t1 is still on its way")
            let summaries = try data.pendingSummaries(owners: people + ["nobody"])
            #expect(summaries.mapValues(\.count) == ["alice": 2, "bob": 2, "carol": 3], "what a refill check reads, for many at once")
            #expect(summaries["alice"]?.lastFireAt == now.addingTimeInterval(3_600))
        }
    }

    @Test(arguments: StoreBackend.allCases)
    func aGoneDeviceIsDeactivatedWithTheReason(_ backend: StoreBackend) async throws {
        let (store, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        try await store.write { (data: any ReminderWrites) throws in
            try data.insertDevice(device("d1"), owner: "alice", secret: nil, accessToken: nil)
            try data.deactivateDevice(id: "d1", reason: "410 Unregistered")
        }
        let gone = try await #require(try store.read { data in try data.device(owner: "alice", id: "d1") })
        #expect(!gone.device.active && gone.device.deactivatedReason == "410 Unregistered")
        #expect(try await store.read { data in try data.devices(owner: "alice", activeOnly: true) }.isEmpty)
        try await store.write { data in try data.reactivateDevice(id: "d1", name: "Phone", secret: nil, accessToken: nil) }
        #expect(try await store.read { data in try data.devices(owner: "alice", activeOnly: true) }.map(\.device.name) == ["Phone"])
    }
}
