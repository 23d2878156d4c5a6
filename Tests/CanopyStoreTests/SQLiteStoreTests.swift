import CanopyStore
import CanopyTesting
import Foundation
import GRDB
import Testing

/// How every SQLite store is opened (``SQLiteStore``).
struct SQLiteStoreTests {
    @Test func theLogIsCheckpointedInTheBackgroundNotByACommit() async throws {
        let directory = try TemporaryDirectory("sqlite-store")
        defer { directory.remove() }
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in try db.execute(sql: "CREATE TABLE blobs (id INTEGER PRIMARY KEY, data BLOB NOT NULL)") }
        let path = directory.path("store.sqlite")
        let pool = try SQLiteStore.open(path: path, migrator: migrator)
        func size(_ file: String) -> Int { ((try? FileManager.default.attributesOfItem(atPath: file))?[.size] as? Int) ?? 0 }
        // A commit checkpoints only past 20,000 pages (SQLite's default: 1,000)...
        #expect(try await pool.write { db in try Int.fetchOne(db, sql: "PRAGMA wal_autocheckpoint") } == SQLiteStore.fallbackCheckpointPages)
        // ...and about 2,500 pages (10 MB) written reach the database file without another commit.
        let before = size(path)
        try await pool.write { db in
            for row in 0..<2_500 { try db.execute(sql: "INSERT INTO blobs (id, data) VALUES (?, zeroblob(4000))", arguments: [row]) }
        }
        #expect(try await eventually(within: .seconds(30)) { size(path) > before + 8_000_000 }, "the background copied the log into the database")
        #expect(try await pool.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM blobs") } == 2_500)
    }
}
