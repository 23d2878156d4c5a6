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
        try a.write { (data: any CareWrites) throws in
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
        try a.write { (data: any CareWrites) throws in
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
}
