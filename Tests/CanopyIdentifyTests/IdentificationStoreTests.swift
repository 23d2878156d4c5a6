import CanopyImaging
import CanopyMessages
import CanopyStore
import CanopyTesting
import Foundation
import GRDB
import Logging
import Testing

@testable import CanopyIdentify

/// The store contract (``IdentificationStoring``) on its own: what any implementation must
/// do. It runs against SQLite, and PostgreSQL on a throwaway server the tests start.
struct IdentificationStoreTests {
    static let contract = StoreContract<any IdentificationStoring>(
        "identify-store",
        sqlite: { try SQLiteIdentificationStore(path: $0.path("identify.sqlite")) }
    ) { url, _ in
        let store = try await PostgresIdentificationStore.open(url: url, logger: Logger(label: "identify-store-test"))
        return (store, store.database.close)
    }

    static func open(_ backend: StoreBackend) async throws -> (any IdentificationStoring, cleanup: () -> Void) {
        let opened = try await contract.open(backend)
        return (opened.store, opened.cleanup)
    }

    let now = Date(timeIntervalSince1970: 1_780_000_000)

    func record(_ id: String, owner: String = "alice", photos: [String], plant: String, at offset: TimeInterval = 0) -> Identification.Record {
        Identification.Record(
            id: id, owner: owner, createdAt: now.addingTimeInterval(offset), provider: .reference, organs: photos.map { _ in .leaf },
            photoIDs: photos, location: nil, exactLocation: false,
            results: [.init(rank: 1, score: 0.9, scientificName: "Ficus lyrata", scientificNameWithoutAuthor: "Ficus lyrata", provider: .reference)],
            plantID: plant)
    }

    func features(_ seed: Float) -> PhotoFeatures {
        PhotoFeatures(values: (0..<PhotoFeatures.count).map { Float($0 % 7) * seed / 100 })
    }

    @Test(arguments: StoreBackend.allCases)
    func aSubmissionIsRecordedOnceAndOnlyItsOwnerSeesIt(_ backend: StoreBackend) async throws {
        let (store, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        let first = try store.insert(record("i1", photos: ["a"], plant: "p1"), submissionKey: "k1")
        let again = try store.insert(record("i2", photos: ["a"], plant: "p2"), submissionKey: "k1")
        #expect(again.record.id == "i1" && again.dropped.isEmpty, "the same submission answers the first")
        #expect(try await store.identification(owner: "alice", submissionKey: "k1") == first.record)
        #expect(try await store.identification(owner: "bob", id: "i1") == nil)
        #expect(try store.history(owner: "bob", plantID: nil, limit: 10, after: nil).isEmpty)
        // Accepted, its photos are filed under the plant; forgetting the plant forgets both.
        try store.saveFeatures(features(1), sha256: "a")
        try await store.accept(first.record, plantID: "plant-1", candidate: first.record.results[0])
        #expect(try store.plantPhotos(owner: "alice").map(\.candidate.plantID) == ["plant-1"])
        #expect(try store.plantPhotos(owner: "bob").isEmpty)
        #expect(try store.forget(owner: "bob", plantID: "plant-1") == 0)
        #expect(try store.forget(owner: "alice", plantID: "plant-1") == 1)
        #expect(try store.features(["a"]).isEmpty, "nothing else has the photo: its features go")
    }

    @Test(arguments: StoreBackend.allCases)
    func plantPhotosWithoutFeaturesAreListedUntilComputedAgainAndFeaturesAreReplaced(_ backend: StoreBackend) async throws {
        let (store, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        let first = try store.insert(record("i1", photos: ["a", "b"], plant: "p1"), submissionKey: "k1")
        try store.saveFeatures(features(1), sha256: "a")
        try await store.accept(first.record, plantID: "plant-1", candidate: first.record.results[0])
        // "b" has no features (as after the matcher's format changed): left out, and listed.
        #expect(try store.plantPhotos(owner: "alice").count == 1)
        #expect(try store.plantPhotosWithoutFeatures(owner: "alice", limit: 10) == ["b"])
        #expect(try store.plantPhotosWithoutFeatures(owner: "bob", limit: 10).isEmpty)
        try store.saveFeatures(features(2), sha256: "b")
        #expect(try store.plantPhotosWithoutFeatures(owner: "alice", limit: 10).isEmpty)
        #expect(try store.plantPhotos(owner: "alice").count == 2)
        // Saving again replaces: features computed anew win over what was stored.
        try store.saveFeatures(features(3), sha256: "a")
        #expect(try store.features(["a"])["a"] == features(3))
    }

    /// A store of the first matcher's days: its features (192 bytes, no version) go when the
    /// store opens; the plant photo they were of is listed to be described again.
    @Test func featuresOfTheFirstFormatAreDeletedByTheMigration() throws {
        let directory = try TemporaryDirectory("identify-store-v3")
        defer { directory.remove() }
        let path = directory.path("identify.sqlite")
        let queue = try DatabaseQueue(path: path)
        try SQLiteIdentificationStore.migrator.migrate(queue, upTo: "v3-submission-holders")
        try queue.write { db in
            try db.execute(
                sql: "INSERT INTO photoFeatures (sha256, features) VALUES ('old', ?), ('new', ?)",
                arguments: [Data(repeating: 1, count: 192), features(1).packed])
            try db.execute(sql: "INSERT INTO plantPhotos (owner, plantID, sha256, candidate) VALUES ('alice', 'p1', 'old', x'')")
        }
        try queue.close()
        let store = try SQLiteIdentificationStore(path: path)
        #expect(try store.features(["old", "new"]) == ["new": features(1)])
        #expect(try store.plantPhotosWithoutFeatures(owner: "alice", limit: 8) == ["old"])
    }

    @Test func packedFeaturesRoundTripAndRefuseOtherFormatsAndNonNumbers() {
        let original = features(1.5)
        #expect(PhotoFeatures(packed: original.packed) == original)
        #expect(original.packed.count == 1 + PhotoFeatures.count * 4)
        // The first format: 46 floats and a 64-bit hash, no version byte.
        #expect(PhotoFeatures(packed: Data(repeating: 0, count: 192)) == nil)
        var corrupt = original.packed
        corrupt.replaceSubrange(1..<5, with: withUnsafeBytes(of: Float.nan.bitPattern.littleEndian) { Data($0) })
        #expect(PhotoFeatures(packed: corrupt) == nil, "a NaN would poison every distance")
        var otherVersion = original.packed
        otherVersion[0] = 9
        #expect(PhotoFeatures(packed: otherVersion) == nil)
    }

    @Test(arguments: StoreBackend.allCases)
    func historyPagesNewestFirst(_ backend: StoreBackend) async throws {
        let (store, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        for index in 0..<5 {
            _ = try store.insert(
                record("i\(index)", photos: ["p\(index)"], plant: index == 2 ? "fern" : "plant-\(index)", at: Double(index)), submissionKey: "k\(index)")
        }
        let page = try store.history(owner: "alice", plantID: nil, limit: 2, after: nil)
        #expect(page.map(\.id) == ["i4", "i3"])
        let next = try store.history(owner: "alice", plantID: nil, limit: 2, after: (page[1].createdAt.timeIntervalSince1970, page[1].id))
        #expect(next.map(\.id) == ["i2", "i1"])
        #expect(try store.history(owner: "alice", plantID: "fern", limit: 10, after: nil).map(\.id) == ["i2"])
    }

    @Test(arguments: StoreBackend.allCases)
    func aSubmissionIsClaimedByOneUntilReleasedOrItsClaimEnds(_ backend: StoreBackend) async throws {
        let (store, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        #expect(try store.claimSubmission(owner: "alice", key: "k", plantID: "p1", now: now, until: now + 60) == "p1")
        #expect(try store.claimSubmission(owner: "alice", key: "k", plantID: "p2", now: now + 1, until: now + 61) == nil, "held")
        #expect(try store.claimSubmission(owner: "bob", key: "k", plantID: "p3", now: now + 1, until: now + 61) == "p3", "someone else's is their own")
        try store.releaseSubmission(owner: "alice", key: "k")
        #expect(try store.claimSubmission(owner: "alice", key: "k", plantID: "p4", now: now + 2, until: now + 62) == "p4", "released")
        #expect(
            try store.claimSubmission(owner: "alice", key: "k", plantID: "p5", now: now + 62, until: now + 122) == "p4",
            "its claim ended: taken over, with the plant id its photos are under")
        #expect(try store.takeAbandonedSubmissions(now: now + 60, until: now + 180, limit: 10).isEmpty, "every claim is held")
        #expect(
            try store.takeAbandonedSubmissions(now: now + 200, until: now + 320, limit: 10).map(\.key).sorted() == ["k", "k"],
            "both claims ended: the sweep takes them")
    }

    /// A store whose process ended holds no claim: another takes it over at once, with the
    /// plant id the first stored photos under, or its sweep clears it.
    @Test(arguments: StoreBackend.allCases)
    func aClaimOfAProcessThatEndedIsFreeAtOnce(_ backend: StoreBackend) async throws {
        let place = try await Self.contract.place(backend)
        defer { place.directory.remove() }
        func open() async throws -> (any IdentificationStoring, close: () -> Void) { try await Self.contract.open(at: place) }
        let (first, closeFirst) = try await open()
        #expect(try first.claimSubmission(owner: "alice", key: "k1", plantID: "p1", now: now, until: now + 120) == "p1")
        #expect(try first.claimSubmission(owner: "alice", key: "k2", plantID: "p2", now: now, until: now + 120) == "p2")
        let (second, closeSecond) = try await open()
        defer { closeSecond() }
        if backend == .postgres {
            #expect(try second.claimSubmission(owner: "alice", key: "k1", plantID: "p3", now: now + 1, until: now + 121) == nil, "its process is there")
            #expect(try second.takeAbandonedSubmissions(now: now + 1, until: now + 121, limit: 10).isEmpty)
        }
        closeFirst() // as a killed process's connections end
        var taken: String?
        #expect(
            try await eventually {
                taken = try second.claimSubmission(owner: "alice", key: "k1", plantID: "p3", now: now + 2, until: now + 122)
                return taken != nil
            })
        #expect(taken == "p1", "taken over long before its time, with the first plant id")
        let abandoned = try second.takeAbandonedSubmissions(now: now + 2, until: now + 122, limit: 10)
        #expect(abandoned == [AbandonedSubmission(owner: "alice", key: "k2", plantID: "p2")])
        #expect(try second.takeAbandonedSubmissions(now: now + 3, until: now + 123, limit: 10).isEmpty, "held by the sweep now")
        try second.releaseSubmission(owner: "alice", key: "k2")
        #expect(try second.claimSubmission(owner: "alice", key: "k2", plantID: "p4", now: now + 4, until: now + 124) == "p4", "cleared")
    }

    @Test(arguments: StoreBackend.allCases)
    func referencesBumpTheGenerationAndQuotaIsKept(_ backend: StoreBackend) async throws {
        let (store, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        let generation = try store.referenceGeneration()
        let fern = ReferenceSpecies(
            scientificName: "Nephrolepis exaltata (L.) Schott", withoutAuthor: "Nephrolepis exaltata", authorship: "(L.) Schott",
            genus: "Nephrolepis", family: "Nephrolepidaceae", commonNames: ["Boston fern"], gbifID: 42)
        try store.addReferences(fern, photos: [("r1", features(2)), ("r2", features(3))], now: now)
        #expect(try store.referenceGeneration() == generation + 1)
        #expect(try store.referenceSpecies().map { ($0.species, $0.photos) }.first.map { $0.0 == fern && $0.1 == 2 } == true)
        #expect(try store.referenceSet().entries.count == 2)
        #expect(try store.removeReferences(scientificName: "Nephrolepis exaltata"))
        #expect(try !store.removeReferences(scientificName: "Nephrolepis exaltata"))
        #expect(try store.referenceGeneration() == generation + 2)
        #expect(try store.quota(provider: "plantnet") == ProviderQuota())
        try store.saveQuota(ProviderQuota(remaining: 12, resetsAt: now), provider: "plantnet", now: now)
        #expect(try store.quota(provider: "plantnet") == ProviderQuota(remaining: 12, resetsAt: now))
    }
}
