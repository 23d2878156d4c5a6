import CanopyMessages
import CanopyStore
import CanopyTesting
import Foundation
import Logging
import Synchronization
import Testing

@testable import CanopyCare

/// The store contract (``CareStoring``) on its own, without the library's rules: what any
/// implementation must do. It runs on each backend through ``StoreContract``: SQLite, and
/// PostgreSQL on a throwaway server the tests start (a fresh database each test).
struct CareStoreTests {
    static let contract = StoreContract<any CareStoring>("care-store", sqlite: { try SQLiteCareStore(path: $0.path("care.sqlite")) }) { url, _ in
        let store = try await PostgresCareStore.open(url: url, logger: Logger(label: "care-store-test"))
        return (store, store.database.close)
    }

    static func open(_ backend: StoreBackend) async throws -> (any CareStoring, cleanup: () -> Void) {
        let opened = try await contract.open(backend)
        return (opened.store, opened.cleanup)
    }

    let start = Date(timeIntervalSince1970: 1_780_000_000)

    func task(_ id: String, plant: String, owner: String, due: TimeInterval, kind: Care.TaskKind = .water) -> StoredTask {
        StoredTask(
            task: Care.Task(id: id, plantID: plant, kind: kind, title: id, due: start.addingTimeInterval(due)), owner: owner,
            anchor: start, everyDays: kind == .custom ? 3 : nil)
    }

    /// Alice's plant p1 with a water task due in a day, and whatever `more` writes.
    func aliceWithAPlant(_ store: any CareStoring, _ more: (any CareWrites) throws -> Void) throws {
        try store.write(owner: "alice") { (data: any CareWrites) throws in
            try data.save(Care.Plant(id: "p1", scientificName: "Ficus lyrata", dateAdded: start), owner: "alice", override: nil)
            try data.saveTask(task("p1:water", plant: "p1", owner: "alice", due: 86_400))
            try more(data)
        }
    }

    @Test(arguments: StoreBackend.allCases)
    func everythingIsScopedToItsOwner(_ backend: StoreBackend) async throws {
        let (store, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        try aliceWithAPlant(store) { data in
            try data.logCare(owner: "alice", plantID: "p1", kind: .water, at: start)
        }
        try store.read { (data: any CareReads) throws in
            #expect(try data.plant(owner: "alice", id: "p1")?.profile != nil, "the catalog's profile")
            #expect(try data.plant(owner: "bob", id: "p1") == nil)
            #expect(try !data.hasPlant(owner: "bob", id: "p1"))
            #expect(try data.plantIDTaken("p1"))
            #expect(try data.task(owner: "bob", id: "p1:water") == nil)
            #expect(try data.tasks(owner: "bob", plantID: "p1").isEmpty)
            #expect(try data.careLog(owner: "bob", plantID: "p1", limit: 10).isEmpty)
            #expect(try data.careLog(owner: "alice", plantID: "p1", limit: 10).count == 1)
            #expect(try data.plants(owner: "bob", matching: .init()).total == 0)
            #expect(try data.plantCountAndPreferences(owner: "bob") == (0, Care.Preferences()), "nothing, and the defaults")
        }
        var preferences = Care.Preferences()
        preferences.wateringFactor = 1.5
        try store.write(owner: "alice") { data in try data.savePreferences(preferences, owner: "alice") }
        #expect(try store.read { data in try data.plantCountAndPreferences(owner: "alice") } == (1, preferences))
        // Bob's delete and snooze change nothing of alice's.
        try store.write(owner: "bob") { (data: any CareWrites) throws in
            try data.deletePlant(owner: "bob", id: "p1")
            try data.snoozeTask(owner: "bob", id: "p1:water", until: start)
            try data.deleteTask(owner: "bob", id: "p1:water")
        }
        #expect(try store.read { data in try data.task(owner: "alice", id: "p1:water")?.task.snoozedUntil } == nil)
        // Deleting a plant takes its tasks and log with it.
        try store.write(owner: "alice") { data in try data.deletePlant(owner: "alice", id: "p1") }
        try store.read { (data: any CareReads) throws in
            #expect(try data.task(owner: "alice", id: "p1:water") == nil)
            #expect(try data.careLog(owner: "alice", plantID: "p1", limit: 10).isEmpty)
        }
    }

    @Test(arguments: StoreBackend.allCases)
    func tasksShowInOrderAndASnoozeMovesOnlyWhenOneShows(_ backend: StoreBackend) async throws {
        let (store, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        try aliceWithAPlant(store) { data in
            try data.saveTask(task("p1:custom:a", plant: "p1", owner: "alice", due: 2 * 86_400, kind: .custom))
            try data.snoozeTask(owner: "alice", id: "p1:water", until: start.addingTimeInterval(3 * 86_400))
        }
        try store.read { (data: any CareReads) throws in
            #expect(try data.nextTask(owner: "alice", plantID: "p1")?.task.id == "p1:custom:a", "the snoozed one shows later")
            #expect(try data.tasks(owner: "alice", showingBefore: nil, limit: 10).map(\.task.id) == ["p1:custom:a", "p1:water"])
            #expect(try data.tasks(owner: "alice", showingBefore: start.addingTimeInterval(2.5 * 86_400), limit: 10).map(\.task.id) == ["p1:custom:a"])
            #expect(try data.customTaskCount(owner: "alice", plantID: "p1") == 1)
            #expect(try data.task(owner: "alice", id: "p1:custom:a")?.everyDays == 3)
        }
        // Saving a task again clears its snooze.
        try store.write(owner: "alice") { data in try data.saveTask(task("p1:water", plant: "p1", owner: "alice", due: 86_400)) }
        #expect(try store.read { data in try data.nextTask(owner: "alice", plantID: "p1")?.task.id } == "p1:water")
    }

    @Test(arguments: StoreBackend.allCases)
    func aWriteThatThrowsChangesNothing(_ backend: StoreBackend) async throws {
        let (store, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        struct Refused: Error {}
        #expect(throws: Refused.self) {
            try store.write(owner: "alice") { (data: any CareWrites) throws in
                try data.save(Care.Plant(id: "p1", scientificName: "Ficus lyrata", dateAdded: start), owner: "alice", override: nil)
                try data.enqueueReminderSync(owner: "alice", now: start)
                throw Refused()
            }
        }
        #expect(try store.read { data in try data.plantCount(owner: "alice") } == 0)
        #expect(try await store.nextFollowUpDue(after: .distantPast) == nil)
    }

    @Test(arguments: StoreBackend.allCases)
    func followUpsWaitInLanesAndBackOff(_ backend: StoreBackend) async throws {
        let (store, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        let commits = Atomic<Int>(0)
        let observation = await store.observeFollowUps { commits.add(1, ordering: .relaxed) }
        defer { observation.stop() }
        try store.write(owner: "alice") { (data: any CareWrites) throws in
            try data.enqueue(owner: "alice", service: "images", operation: "images.purge", body: [1], now: start)
            try data.enqueue(owner: "alice", service: "images", operation: "images.purge", body: [2], now: start)
            try data.enqueue(owner: "bob", service: "images", operation: "images.purge", body: [3], now: start)
        }
        #expect(try await eventually { commits.load(ordering: .relaxed) >= 1 })
        #expect(commits.load(ordering: .relaxed) == 1, "one commit, one wake-up")
        let due = try await store.dueFollowUps(now: start, limit: 10)
        #expect(due.map(\.body) == [[1], [2], [3]])
        // Alice's first fails: her second waits behind it; bob's is confirmed.
        try await store.settle(
            [
                .failed(id: due[0].id, attempts: 0, error: "down"), .returned(id: due[1].id),
                .confirmed(id: due[2].id, generation: due[2].generation),
            ], now: start)
        #expect(try await store.dueFollowUps(now: start, limit: 10).isEmpty, "alice's lane waits for its retry")
        // The next time anything can go is the retry, not the second one already due behind it
        // (an outbox sleeping until then does not turn without pause).
        #expect(try await store.nextFollowUpDue(after: start) == start.addingTimeInterval(1))
        let retried = try await store.dueFollowUps(now: start.addingTimeInterval(1), limit: 10)
        #expect(retried.map(\.body) == [[1], [2]] && retried[0].attempts == 1)
        #expect(try await store.pendingFollowUps().count == 2)
        #expect(try await store.pendingFollowUps().oldest == start)
    }

    @Test(arguments: StoreBackend.allCases)
    func aReminderSyncAskedAgainIsOneRowWithANewGeneration(_ backend: StoreBackend) async throws {
        let (store, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        try store.write(owner: "alice") { data in try data.enqueueReminderSync(owner: "alice", now: start) }
        let sent = try #require(try await store.dueFollowUps(now: start, limit: 10).first)
        try store.write(owner: "alice") { data in try data.enqueueReminderSync(owner: "alice", now: start) } // while it is on its way
        // Confirmed with the generation it was read at: it stays, for the newer window.
        try await store.settle([.confirmed(id: sent.id, generation: sent.generation)], now: start)
        let again = try await store.dueFollowUps(now: start, limit: 10)
        #expect(again.count == 1 && again[0].id == sent.id && again[0].generation == sent.generation + 1)
        try await store.settle([.confirmed(id: again[0].id, generation: again[0].generation)], now: start)
        #expect(try await store.pendingFollowUps().count == 0)
    }

    /// A keyed `tasks.complete` or `tasks.skip` is done once per owner and key for a day: a
    /// repeat logs nothing and moves nothing; another owner's key, a new key or a day later
    /// is new work; deleting the account forgets the keys.
    @Test(arguments: StoreBackend.allCases)
    func aKeyedCompletionOrSkipIsDoneOnce(_ backend: StoreBackend) async throws {
        let (store, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        let library = CareLibrary(store: store)
        let plant = try library.add(Care.Plant(scientificName: "Monstera deliciosa"), owner: "alice", now: start)
        let water = try #require(try library.upcoming(.init(days: 30), owner: "alice", now: start).upcoming.first { $0.kind == .water })
        let done = try library.complete(water.id, at: nil, key: "k1", owner: "alice", now: start.addingTimeInterval(86_400))
        let again = try library.complete(water.id, at: nil, key: "k1", owner: "alice", now: start.addingTimeInterval(90_000))
        #expect(again == done, "the task as it is: nothing moved")
        #expect(try library.log(plantID: plant.id, owner: "alice").count == 1, "logged once")
        let skipped = try library.skip(water.id, key: "k2", owner: "alice", now: start.addingTimeInterval(90_000))
        #expect(skipped.due > done.due)
        #expect(try library.skip(water.id, key: "k2", owner: "alice", now: start.addingTimeInterval(90_001)) == skipped)
        #expect(
            try library.skip(water.id, key: "k1", owner: "alice", now: start.addingTimeInterval(90_001)) == skipped,
            "k1 was used: a key is done once, whatever the operation")
        // A repeat changes nothing, so the reminders are not told again.
        let syncs = try await store.dueFollowUps(now: start.addingTimeInterval(90_001), limit: 10)
        #expect(syncs.count == 1, "the completion and the skip asked for one sync")
        try await store.settle(syncs.map { .confirmed(id: $0.id, generation: $0.generation) }, now: start.addingTimeInterval(90_001))
        _ = try library.complete(water.id, at: nil, key: "k1", owner: "alice", now: start.addingTimeInterval(90_002))
        _ = try library.skip(water.id, key: "k2", owner: "alice", now: start.addingTimeInterval(90_002))
        #expect(try await store.pendingFollowUps().count == 0, "a repeat asked for a reminder sync")
        // A day later the key is forgotten: new work.
        _ = try library.complete(water.id, at: nil, key: "k1", owner: "alice", now: start.addingTimeInterval(86_400 * 2 + 10))
        #expect(try library.log(plantID: plant.id, owner: "alice").count == 2)

        // Bob's key of the same name is his own.
        let bobs = try library.add(Care.Plant(scientificName: "Ficus lyrata"), owner: "bob", now: start)
        let bobWater = try #require(try library.upcoming(.init(days: 30), owner: "bob", now: start).upcoming.first { $0.kind == .water })
        _ = try library.complete(bobWater.id, at: nil, key: "k2", owner: "bob", now: start.addingTimeInterval(86_400))
        #expect(try library.log(plantID: bobs.id, owner: "bob").count == 1)

        // Deleting the account forgets the keys.
        _ = try library.deleteAccount(owner: "bob", now: start.addingTimeInterval(86_400))
        try store.write(owner: "alice") { (data: any CareWrites) throws in
            #expect(try data.useRequestKey(owner: "bob", key: "k2", now: start.addingTimeInterval(86_401)), "forgotten with the account")
            #expect(try !data.useRequestKey(owner: "alice", key: "k2", now: start.addingTimeInterval(86_401)))
        }
    }

    /// An account's deletion schedules its second pass for a minute later, in the same
    /// transaction: it deletes what a late request added meanwhile (a plant), has the other
    /// services forget again, and schedules no third.
    @Test(arguments: StoreBackend.allCases)
    func anAccountsDeletionRunsASecondPassThatErasesWhatCameLate(_ backend: StoreBackend) async throws {
        let (store, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        let library = CareLibrary(store: store, erasureSecondPass: .seconds(60))
        _ = try library.add(Care.Plant(scientificName: "Monstera deliciosa"), owner: "bob", now: start)
        _ = try library.add(Care.Plant(scientificName: "Ficus lyrata"), owner: "alice", now: start)
        let deleted = start.addingTimeInterval(3_600)
        #expect(try library.deleteAccount(owner: "bob", now: deleted) == 1)
        let first = try await store.dueFollowUps(now: deleted, limit: 20)
        let forgets = Set(first.filter { $0.owner == "bob" && Outbox.erasures.contains($0.operation) }.map(\.service))
        #expect(forgets == [Reminders.service, Identification.service, Images.service])
        try await store.settle(first.map { .confirmed(id: $0.id, generation: $0.generation) }, now: deleted)
        #expect(try await store.dueFollowUps(now: deleted.addingTimeInterval(59), limit: 20).isEmpty, "the second pass waits its minute")

        // A plant a late request added after the deletion.
        _ = try library.add(Care.Plant(scientificName: "Ficus lyrata"), owner: "bob", now: deleted.addingTimeInterval(1))
        let due = try await store.dueFollowUps(now: deleted.addingTimeInterval(60), limit: 20)
        let passes = due.filter { $0.service == Care.service }
        #expect(passes.count == 1)
        let second = try #require(passes.first)
        #expect(second.operation == Care.DeleteAccount.name && second.owner == "bob")
        let request = try MessageCodec().decode(Care.DeleteAccount.Request.self, from: second.body)
        #expect(request.secondPass == true)
        try await store.settle(due.map { .confirmed(id: $0.id, generation: $0.generation) }, now: deleted.addingTimeInterval(60))
        #expect(try library.deleteAccount(owner: "bob", secondPass: true, now: deleted.addingTimeInterval(60)) == 1, "the late plant goes")
        let again = try await store.dueFollowUps(now: deleted.addingTimeInterval(3_600), limit: 20)
        #expect(
            Set(again.filter { Outbox.erasures.contains($0.operation) }.map(\.service)) == forgets && !again.contains { $0.service == Care.service },
            "the others forget again; no third pass")
        #expect(try library.list(.init(), owner: "bob").plants.isEmpty)
        #expect(try library.list(.init(), owner: "alice").plants.count == 1)
    }
}
