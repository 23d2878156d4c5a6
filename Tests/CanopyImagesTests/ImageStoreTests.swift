import CanopyMessages
import CanopyStore
import CanopyTesting
import Foundation
import Logging
import Testing

@testable import CanopyImages

/// The store contract (``ImageStoring``) on its own: what any implementation must do. It
/// runs against SQLite with originals in its directory, and PostgreSQL with originals in a
/// directory replicas would share.
struct ImageStoreTests {
    static let contract = StoreContract<any ImageStoring>("image-store", sqlite: { try SQLiteImageStore(directory: $0.url) }) { url, directory in
        let store = try await PostgresImageStore.open(
            url: url, originals: directory.url.appendingPathComponent("originals"), logger: Logger(label: "image-store-test"))
        return (store, store.database.close)
    }

    /// The store, whether it holds an original's file (by its SHA-256), and its cleanup.
    static func open(_ backend: StoreBackend) async throws -> (any ImageStoring, exists: (String) -> Bool, cleanup: () -> Void) {
        let (store, _, cleanup) = try await contract.open(backend)
        let exists: (String) -> Bool =
            switch store {
            case let sqlite as SQLiteImageStore: { FileManager.default.fileExists(atPath: sqlite.originalURL($0).path) }
            case let postgres as PostgresImageStore: postgres.files.exists
            default: { _ in false }
            }
        return (store, exists, cleanup)
    }

    let now = Date(timeIntervalSince1970: 1_780_000_000)
    let sha = String(repeating: "ab", count: 32)

    @Test(arguments: StoreBackend.allCases)
    func aPhotoIsStoredOnceScopedToItsHoldersAndGoesWithTheLast(_ backend: StoreBackend) async throws {
        let (store, exists, cleanup) = try await Self.open(backend)
        defer { cleanup() }
        var normalizations = 0
        func normalize() -> (bytes: [UInt8], width: Int, height: Int) {
            normalizations += 1
            return ([1, 2, 3, 4], 40, 30)
        }
        let first = try store.add(
            sha256: sha, owner: "alice", plantID: "p1", format: "jpeg",
            normalized: normalize, now: now)
        _ = try store.add(
            sha256: sha, owner: "alice", plantID: "p1", format: "jpeg",
            normalized: normalize, now: now)
        _ = try store.add(
            sha256: sha, owner: "bob", plantID: "b1", format: "jpeg",
            normalized: normalize, now: now)
        #expect(normalizations == 1, "made once, whoever adds it")
        #expect(first.width == 40 && first.height == 30 && first.bytes == 4 && first.plantID == "p1")
        #expect(try store.original(sha) == [1, 2, 3, 4] && exists(sha))
        #expect(try store.owns("alice", sha) && !store.owns("carol", sha))
        #expect(try store.photos(owner: "alice", plantID: "p1").map(\.sha256) == [sha])
        #expect(try store.photos(owner: "carol", plantID: "p1").isEmpty)
        #expect(try store.usage(owner: "alice") == (1, 4))
        #expect(try store.originalTotals() == (1, 4))
        try store.savePalette([.init(role: "vibrant", hex: "#336633", population: 1, oklab: [0.5, -0.1, 0.1])], for: sha, now: now)
        #expect(try store.palette(sha, maximumAge: 60, now: now)?.count == 1)
        #expect(try store.palette(sha, maximumAge: 60, now: now + 61) == nil, "too old")
        // Carol's purge changes nothing; alice's leaves bob's; bob's takes the original.
        #expect(try store.purge(owner: "carol", plantID: "p1", sha256: nil).photos == 0)
        let alices = try store.purge(owner: "alice", plantID: "p1", sha256: sha)
        #expect(alices.photos == 1 && alices.deleted.isEmpty && exists(sha))
        let bobs = try store.purge(owner: "bob", plantID: "b1", sha256: nil)
        #expect(bobs.photos == 1 && bobs.deleted == [sha])
        #expect(try !exists(sha) && !store.hasOriginal(sha) && store.paletteCount() == 0 && store.originalTotals() == (0, 0))
    }
}
