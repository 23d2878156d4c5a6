import CanopyStore
import CanopyTesting
import Foundation
import GRDB
import Testing

/// A snapshot's two steps on one store: pinned at the cut, copied later (``PinnedStore``); and
/// a pseudonymized snapshot's renaming of people (``StoreOwners``).
struct StoreSnapshotTests {
    @Test func aPinnedStoreIsCopiedAsItStoodWhenPinnedWhileWritesGoOn() async throws {
        let directory = try TemporaryDirectory("pinned-store")
        defer { directory.remove() }
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in try db.execute(sql: "CREATE TABLE plants (id INTEGER PRIMARY KEY, owner TEXT NOT NULL)") }
        let pool = try SQLiteStore.open(path: directory.path("care.sqlite"), migrator: migrator)
        try await pool.write { db in for id in 1...3 { try db.execute(sql: "INSERT INTO plants VALUES (?, 'ann')", arguments: [id]) } }

        // Opened ahead of the moment: a write before the pin is in the copy.
        let pinned = try PinnedStore(path: directory.path("care.sqlite"))
        try await pool.write { db in try db.execute(sql: "INSERT INTO plants VALUES (4, 'ann')") }
        try pinned.pin()
        // The services go on writing, unblocked, and a checkpoint runs meanwhile.
        try await pool.write { db in for id in 5...500 { try db.execute(sql: "INSERT INTO plants VALUES (?, 'bob')", arguments: [id]) } }
        try await pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA wal_checkpoint(PASSIVE)") }
        try await pool.write { db in try db.execute(sql: "DELETE FROM plants WHERE id = 1") }
        try pinned.copy(to: directory.path("copy.sqlite"))

        let copy = try DatabaseQueue(path: directory.path("copy.sqlite"))
        let copied = try await copy.read { db in try Int.fetchAll(db, sql: "SELECT id FROM plants ORDER BY id") }
        #expect(copied == [1, 2, 3, 4], "the store at the pin, nothing after")
        let live = try await pool.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM plants") }
        #expect(live == 499, "the live store kept every write")
        try copy.close()
        // Ended: the store's log can be checkpointed whole again.
        try await pool.write { db in try db.execute(sql: "INSERT INTO plants VALUES (1000, 'cy')") }
        let checkpoint = try await pool.writeWithoutTransaction { db in try Row.fetchOne(db, sql: "PRAGMA wal_checkpoint(TRUNCATE)") }
        #expect(checkpoint?[0] as Int? == 0, "no reader holds the log back any more")
    }

    @Test func everyOwnerIsRenamedInEveryTableThatNamesOne() throws {
        let directory = try TemporaryDirectory("store-owners")
        defer { directory.remove() }
        let database = try DatabaseQueue(path: directory.path("remind.sqlite"))
        try database.write { db in
            try db.execute(
                sql: """
                    CREATE TABLE devices (id TEXT PRIMARY KEY, owner TEXT NOT NULL, UNIQUE (owner, id));
                    CREATE TABLE reminders (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, title TEXT NOT NULL);
                    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                    INSERT INTO devices VALUES ('d1', 'ann'), ('d2', 'bob');
                    INSERT INTO reminders VALUES (1, 'ann', 'Water ann''s fern'), (2, 'ann', 'Mist');
                    INSERT INTO meta VALUES ('owner', 'ann');
                    """)
        }
        try database.close()
        let changed = try StoreOwners.rename(inStoreAt: directory.path("remind.sqlite")) { "p-" + String($0.reversed()) }
        #expect(changed == 4)
        let after = try DatabaseQueue(path: directory.path("remind.sqlite"))
        let (devices, owners, titles, meta) = try after.read { db in
            (
                try String.fetchAll(db, sql: "SELECT owner FROM devices ORDER BY id"), try String.fetchAll(db, sql: "SELECT owner FROM reminders ORDER BY id"),
                try String.fetchAll(db, sql: "SELECT title FROM reminders ORDER BY id"), try String.fetchOne(db, sql: "SELECT value FROM meta")
            )
        }
        #expect(devices == ["p-nna", "p-bob"])
        #expect(owners == ["p-nna", "p-nna"])
        #expect(titles == ["Water ann's fern", "Mist"], "only owner columns change")
        #expect(meta == "ann", "a table without an owner column is left alone")
        try after.close()
    }
}
