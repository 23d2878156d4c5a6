import CanopyMessages
import CanopyServiceKit
import CanopyStore
import CanopyTesting
import Foundation
import Logging
import Synchronization
import Testing

@testable import CanopyImages

/// canopy-images replicas: the index in one PostgreSQL, the originals in one directory both
/// mount, a cache each. A photo is stored once whichever replica took it, a purge on one is
/// honoured by the other at once, and a row never outlives its file nor a file its row.
@Suite(.serialized)
struct ImageReplicaTests {
    struct Replica {
        let store: PostgresImageStore
        let library: ImageLibrary
    }

    /// `count` replicas on a fresh database, sharing `originals`, each with its own cache.
    func replicas(_ count: Int, in directory: TemporaryDirectory) async throws -> [Replica] {
        let url = try await PostgresServer.shared().database()
        var replicas: [Replica] = []
        for index in 0..<count {
            let store = try await PostgresImageStore.open(
                url: url, poolSize: 4, originals: directory.url.appendingPathComponent("shared-originals"),
                logger: Logger(label: "images-replica-\(index)"))
            let library = try ImageLibrary(store: store, directory: directory.url.appendingPathComponent("replica-\(index)"))
            replicas.append(Replica(store: store, library: library))
        }
        return replicas
    }

    @Test func aPhotoIsStoredOnceAndAPurgeOnOneReplicaIsHonouredByTheOther() async throws {
        let directory = try TemporaryDirectory("images-replicas")
        defer { directory.remove() }
        let replicas = try await replicas(2, in: directory)
        defer { replicas.forEach { $0.store.database.close() } }
        let (a, b) = (replicas[0], replicas[1])
        let bytes = Fixture.image {
            $0.width = 640
            $0.height = 480
        }
        let alice = try await a.library.put(bytes, owner: "alice", plantID: "p1")
        let bob = try await b.library.put(bytes, owner: "bob", plantID: "p9")
        #expect(alice.sha256 == bob.sha256)
        #expect(try a.store.originalTotals().count == 1, "stored once, whichever replica took it")
        #expect(try a.store.files.entries().map(\.name) == [alice.sha256], "one file in the shared directory")
        // b serves alice's photo (the file a wrote) and caches its variants.
        let request = Images.GetVariant.Request(sha256: alice.sha256, variant: .small)
        #expect(try await b.library.variant(request, owner: "alice").source == "made")
        #expect(try await b.library.variant(request, owner: "alice").source != "made", "from b's cache")

        // b hears of deletions a makes, as serve wires it.
        let deletions = DeletedIDs()
        let watch = await b.store.observeDeletedOriginals { ids in deletions.add(ids) }
        defer { watch.stop() }
        let evictions = await DeletedOriginalsWatch.start(store: b.store, library: b.library)
        defer { evictions.listening.stop() }
        // Alice purges on a: b refuses her at once, though its cache still has the bytes, and
        // goes on serving bob, who still holds the photo.
        _ = try await a.library.purge(owner: "alice", plantID: "p1")
        await #expect(throws: CanopyError.self) { try await b.library.variant(request, owner: "alice") }
        #expect(try await b.library.variant(request, owner: "bob").sha256 == alice.sha256)
        #expect(try a.store.originalTotals().count == 1 && a.store.files.exists(alice.sha256))
        // Bob purges on a too: the original goes, and b drops it from its cache.
        _ = try await a.library.purge(owner: "bob", plantID: "p9")
        #expect(try !a.store.files.exists(alice.sha256) && b.store.originalTotals().count == 0)
        #expect(try await eventually { deletions.ids.contains(alice.sha256) })
        let tiersDropped = try await eventually {
            await !b.library.cache.contains(VariantCache.Key(sha256: alice.sha256, variant: .small, format: .jpeg))
        }
        #expect(tiersDropped, "b's memory and disk tiers no longer hold it")
    }

    @Test func uploadsAndPurgesOfOnePhotoOnTwoReplicasAtOnceNeverLoseAFileOrKeepAnOrphan() async throws {
        let directory = try TemporaryDirectory("images-replicas-race")
        defer { directory.remove() }
        let replicas = try await replicas(2, in: directory)
        defer { replicas.forEach { $0.store.database.close() } }
        let bytes = Fixture.image {
            $0.width = 320
            $0.height = 240
        }
        let sha256 = ImageLibrary.sha256(bytes)
        for round in 0..<20 {
            // Alice uploads on one replica while bob, the only other holder, lets go on the other.
            _ = try await replicas[1].library.put(bytes, owner: "bob", plantID: "b")
            async let upload = replicas[0].library.put(bytes, owner: "alice", plantID: "a")
            async let purge = replicas[1].library.purge(owner: "bob", plantID: "b")
            _ = try await (upload, purge)
            let counted = try replicas[0].store.hasOriginal(sha256)
            #expect(counted && replicas[0].store.files.exists(sha256), "round \(round): alice holds it, so its row and its file are there")
            #expect(try await replicas[1].library.variant(.init(sha256: sha256, variant: .thumbnail), owner: "alice").sha256 == sha256)
            _ = try await replicas[0].library.purge(owner: "alice", plantID: "a")
            #expect(try !replicas[0].store.hasOriginal(sha256) && !replicas[0].store.files.exists(sha256), "round \(round): nobody holds it: neither is left")
        }
    }

    @Test func manyHoldersComingAndGoingOnTwoReplicasNeverLeaveAHolderWithoutTheFile() async throws {
        let directory = try TemporaryDirectory("images-replicas-stress")
        defer { directory.remove() }
        let replicas = try await replicas(2, in: directory)
        defer { replicas.forEach { $0.store.database.close() } }
        let bytes = Fixture.image {
            $0.width = 200
            $0.height = 150
        }
        let sha256 = ImageLibrary.sha256(bytes)
        // Eight people take and let go of the same photo, forty times each, half on each
        // replica, straight on the stores (no decode in between: the windows overlap often),
        // while the second replica sweeps for orphaned files all the while (as one opening does).
        let sweeping = Atomic<Bool>(true)
        let sweeper = Task {
            while sweeping.load(ordering: .relaxed) {
                try await offThePool { try replicas[1].store.sweepOrphans(now: Date()) }
            }
        }
        let broken = try await withThrowingTaskGroup(of: Int.self) { group in
            for person in 0..<8 {
                let store = replicas[person % 2].store
                group.addTask {
                    var broken = 0
                    for _ in 0..<40 {
                        _ = try await offThePool {
                            try store.add(
                                sha256: sha256, owner: "person-\(person)", plantID: "p", format: "jpeg",
                                normalized: { (bytes, 200, 150) }, now: Date())
                        }
                        // While this person holds it, its row and its file are there.
                        if try !store.hasOriginal(sha256) || !store.files.exists(sha256) { broken += 1 }
                        _ = try await offThePool { try store.purge(owner: "person-\(person)", plantID: "p", sha256: nil) }
                    }
                    return broken
                }
            }
            return try await group.reduce(0, +)
        }
        sweeping.store(false, ordering: .relaxed)
        try await sweeper.value
        #expect(broken == 0, "\(broken) time(s) a holder found no file or no row")
        #expect(try !replicas[0].store.hasOriginal(sha256) && !replicas[0].store.files.exists(sha256), "nobody holds it: nothing is left")
    }

    /// What a replica killed mid-upload or mid-purge leaves (a file no row counts, a
    /// temporary file) is cleared when a replica opens; what someone holds stays.
    @Test func aReplicaOpeningClearsTheFilesAKilledOneLeft() async throws {
        let directory = try TemporaryDirectory("images-sweep")
        defer { directory.remove() }
        let first = try await replicas(1, in: directory)[0]
        let held = try await first.library.put(
            Fixture.image {
                $0.width = 320
                $0.height = 240
            }, owner: "alice", plantID: "p1")
        let files = first.store.files
        // Killed between the file and its row (or between a purge's commit and the file's removal).
        let orphan = String(repeating: "ab", count: 32)
        try files.write([1, 2, 3], as: orphan)
        // Killed while writing: a temporary file an hour old, and one being written now.
        let (stale, fresh) = (
            files.directory.appendingPathComponent(PhotoFiles.temporaryPrefix + "stale"),
            files.directory.appendingPathComponent(PhotoFiles.temporaryPrefix + "fresh")
        )
        try Data([1]).write(to: stale)
        try Data([2]).write(to: fresh)
        try FileManager.default.setAttributes([.modificationDate: Date(timeIntervalSinceNow: -3_600)], ofItemAtPath: stale.path)
        first.store.database.close()

        let again = try await PostgresImageStore.open(
            url: first.store.database.url, poolSize: 2, originals: files.directory, logger: Logger(label: "images-sweep"))
        defer { again.database.close() }
        #expect(try Set(files.entries().map(\.name)) == [held.sha256, PhotoFiles.temporaryPrefix + "fresh"], "the orphan and the stale temporary file went")
        #expect(try again.hasOriginal(held.sha256) && files.exists(held.sha256))
    }
}

/// Ids a watch was told of.
final class DeletedIDs: Sendable {
    private let value = Mutex<Set<String>>([])
    func add(_ ids: [String]) { value.withLock { $0.formUnion(ids) } }
    var ids: Set<String> { value.withLock { $0 } }
}
