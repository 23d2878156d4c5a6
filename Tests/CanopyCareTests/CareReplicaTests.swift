import CanopyMessages
import CanopyServiceKit
import CanopyStore
import CanopyTesting
import Foundation
import Logging
import Synchronization
import Testing

@testable import CanopyCare

/// Several canopy-care replicas on one PostgreSQL database: what one writes, the others see;
/// writes at once behave as one after the other; the outbox hands each follow-up to one
/// replica, in order per lane, and a replica that dies mid-pass leaves its follow-ups to the
/// others at once (one that hangs, once their lease ends).
struct CareReplicaTests {
    let start = Date(timeIntervalSince1970: 1_780_000_000)

    /// `count` stores (replicas) on one fresh database.
    func replicas(_ count: Int) async throws -> [PostgresCareStore] {
        let url = try await PostgresServer.shared().database()
        var stores: [PostgresCareStore] = []
        for replica in 0..<count {
            stores.append(try await PostgresCareStore.open(url: url, poolSize: 4, logger: Logger(label: "care-replica-\(replica)")))
        }
        return stores
    }

    @Test func theOutboxHandsEachFollowUpToOneReplicaInLaneOrder() async throws {
        let stores = try await replicas(2)
        defer { stores.forEach { $0.database.close() } }
        let (a, b) = (stores[0], stores[1])
        // b hears a's commit.
        let wakes = Atomic<Int>(0)
        let observation = await b.observeFollowUps { wakes.add(1, ordering: .relaxed) }
        defer { observation.stop() }
        try a.write(owner: "alice") { (data: any CareWrites) throws in
            try data.enqueue(owner: "alice", service: "images", operation: "images.purge", body: [1], now: start)
            try data.enqueue(owner: "alice", service: "images", operation: "images.purge", body: [2], now: start)
            try data.enqueue(owner: "bob", service: "images", operation: "images.purge", body: [3], now: start)
        }
        #expect(try await eventually { wakes.load(ordering: .relaxed) >= 1 }, "a commit on one replica wakes the others' outboxes")

        let first = try await a.dueFollowUps(now: start, limit: 1)
        #expect(first.map(\.body) == [[1]])
        // Alice's second waits behind her first, on its way from a; bob's is free.
        let second = try await b.dueFollowUps(now: start, limit: 10)
        #expect(second.map(\.body) == [[3]])
        #expect(try await a.dueFollowUps(now: start, limit: 10).isEmpty, "nothing is handed out twice")
        try await a.settle([.confirmed(id: first[0].id, generation: first[0].generation)], now: start)
        #expect(try await b.dueFollowUps(now: start, limit: 10).map(\.body) == [[2]])

        // b dies holding bob's and alice's second: nobody takes them until the lease ends,
        // then a does, and they are confirmed once.
        #expect(try await a.dueFollowUps(now: start.addingTimeInterval(FollowUp.lease - 1), limit: 10).isEmpty)
        #expect(try await a.nextFollowUpDue(after: start) == start.addingTimeInterval(FollowUp.lease), "a wakes when the lease ends")
        let taken = try await a.dueFollowUps(now: start.addingTimeInterval(FollowUp.lease), limit: 10)
        #expect(taken.map(\.body) == [[2], [3]])
        try await a.settle(taken.map { .confirmed(id: $0.id, generation: $0.generation) }, now: start.addingTimeInterval(FollowUp.lease))
        #expect(try await b.pendingFollowUps().count == 0)

        // A replica whose process is gone holds nothing: c reads a follow-up, then its
        // connections end (as a killed process's do); a sends it at once, not after the lease.
        let c = try await PostgresCareStore.open(url: a.database.url, poolSize: 2, logger: Logger(label: "care-replica-c"))
        let later = start.addingTimeInterval(FollowUp.lease + 1)
        try a.write(owner: "carol") { (data: any CareWrites) throws in
            try data.enqueue(owner: "carol", service: "images", operation: "images.purge", body: [4], now: later)
        }
        #expect(try await c.dueFollowUps(now: later, limit: 10).map(\.body) == [[4]])
        #expect(try await a.dueFollowUps(now: later, limit: 10).isEmpty, "c is there: its lease holds")
        c.database.close()
        var after: [FollowUp] = []
        #expect(
            try await eventually {
                after = try await a.dueFollowUps(now: later, limit: 10)
                return !after.isEmpty
            }, "c is gone")
        #expect(after.map(\.body) == [[4]])
    }

    @Test func replicasAddingAtOnceNeverPassTheLimit() async throws {
        let stores = try await replicas(2)
        defer { stores.forEach { $0.database.close() } }
        let libraries = stores.map { CareLibrary(store: $0, maximumPlants: 5) }
        // Sixteen adds at once, half through each replica: serializable writes let five in.
        let outcomes = try await withThrowingTaskGroup(of: Bool.self) { group in
            for index in 0..<16 {
                let library = libraries[index % 2]
                group.addTask {
                    do {
                        _ = try await offThePool { try library.add(Care.Plant(scientificName: "Ficus lyrata"), owner: "alice") }
                        return true
                    } catch let error as CanopyError where error.code == .tooLarge {
                        return false
                    }
                }
            }
            return try await group.reduce(into: [Bool]()) { $0.append($1) }
        }
        #expect(outcomes.filter { $0 }.count == 5)
        #expect(try stores[1].read { data in try data.plantCount(owner: "alice") } == 5)
        // One pending reminder sync for alice, however many replicas asked.
        #expect(try await stores[0].pendingFollowUps().count == 1)
    }

    @Test func anEditAgainstAVersionChangedOnAnotherReplicaIsRefusedStale() async throws {
        let stores = try await replicas(2)
        defer { stores.forEach { $0.database.close() } }
        let (a, b) = (CareLibrary(store: stores[0]), CareLibrary(store: stores[1]))
        let added = try a.add(Care.Plant(scientificName: "Ficus lyrata"), owner: "alice")
        #expect(added.version == 1)
        var kitchen = added
        kitchen.customName = "Kitchen"
        var hall = added
        hall.customName = "Hall"
        // Both phones read version 1; the first write wins on one replica, the second is
        // refused on the other, and the first edit stands.
        #expect(try b.update(kitchen, owner: "alice").version == 2)
        let stale = #expect(throws: CanopyError.self) { try a.update(hall, owner: "alice") }
        #expect(stale?.code == .stale)
        #expect(try a.get(added.id, owner: "alice").customName == "Kitchen")
        // Without a version, an edit goes in whatever the version.
        hall.version = nil
        #expect(try a.update(hall, owner: "alice").version == 3)
        // Someone else cannot edit it, with or without its version.
        kitchen.version = 3
        #expect(#expect(throws: CanopyError.self) { try b.update(kitchen, owner: "bob") }?.code == .notFound)
    }

    /// Runs `count` calls at once, alternating between `libraries`, and returns each one's
    /// outcome: its result, or the error it ended with.
    func atOnce<T: Sendable>(_ count: Int, _ libraries: [CareLibrary], _ call: @escaping @Sendable (CareLibrary, Int) throws -> T) async -> [Result<
        T, any Error
    >] {
        await withTaskGroup(of: Result<T, any Error>.self) { group in
            for index in 0..<count {
                let library = libraries[index % libraries.count]
                group.addTask {
                    do { return .success(try await offThePool { try call(library, index) }) } catch { return .failure(error) }
                }
            }
            return await group.reduce(into: []) { $0.append($1) }
        }
    }

    @Test func sixtyFourWritesAtOnceToOnePlantAndOneTaskAllGetAClearAnswer() async throws {
        let stores = try await replicas(2)
        defer { stores.forEach { $0.database.close() } }
        let libraries = stores.map { CareLibrary(store: $0) }
        let plant = try libraries[0].add(Care.Plant(scientificName: "Ficus lyrata"), owner: "alice")
        let task = try #require(try stores[0].read { data in try data.tasks(owner: "alice", plantID: plant.id) }.first).task

        // Snoozes of one task, half through each replica: every one is done (under
        // SERIALIZABLE they conflicted until their retries ran out, and answered 500), and the
        // task shows at one of their times.
        let times = (0..<64).map { start.addingTimeInterval(Double(3_600 + $0)) }
        let snoozes = await atOnce(64, libraries) { library, index in try library.snooze(task.id, until: times[index], owner: "alice") }
        #expect(
            snoozes.filter { (try? $0.get()) == nil }.isEmpty, "\(snoozes.compactMap { if case .failure(let error) = $0 { error } else { nil } }.prefix(3))")
        let snoozed = try #require(try stores[1].read { data in try data.task(owner: "alice", id: task.id) }).task.snoozedUntil
        #expect(snoozed.map(times.contains) == true)

        // Edits of one plant against the version both phones read: one wins, every other is
        // refused as stale (412), nothing else.
        let edits = await atOnce(64, libraries) { library, index in
            var edit = plant
            edit.customName = "Edit \(index)"
            return try library.update(edit, owner: "alice")
        }
        let won = edits.compactMap { try? $0.get() }
        #expect(won.count == 1)
        let refused = edits.compactMap { result -> CanopyError.Code? in
            guard case .failure(let error) = result else { return nil }
            return (error as? CanopyError)?.code
        }
        #expect(refused.count == 63 && refused.allSatisfy { $0 == .stale }, "\(Set(refused))")
        // Without a version each edit goes in after the one before: 64 more versions.
        let blind = await atOnce(64, libraries) { library, index in
            var edit = plant
            edit.version = nil
            edit.customName = "Blind \(index)"
            return try library.update(edit, owner: "alice")
        }
        #expect(blind.allSatisfy { (try? $0.get()) != nil })
        let stored = try libraries[1].get(plant.id, owner: "alice")
        #expect(stored.version == 2 + 64)
        #expect(Set(blind.compactMap { try? $0.get().customName }).contains(stored.customName))

        // Completions with their own keys each count once; retried with the same key, none again.
        let keys = (0..<32).map { "key-\($0)" }
        let completions = await atOnce(64, libraries) { library, index in
            try library.complete(task.id, at: nil, key: keys[index % 32], owner: "alice", now: start.addingTimeInterval(Double(index)))
        }
        #expect(completions.allSatisfy { (try? $0.get()) != nil })
        #expect(try stores[0].read { data in try data.careLog(owner: "alice", plantID: plant.id, limit: 1_000) }.count == 32)
    }
}
