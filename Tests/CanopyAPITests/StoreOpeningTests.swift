import CanopyTesting
import Foundation
import GRDB
import Testing

@testable import CanopyCare
@testable import CanopyIdentify
@testable import CanopyImages
@testable import CanopyRemind

/// Every service's store opens its SQLite file one way (`SQLiteStore.open`): WAL, foreign
/// keys enforced, a 5 s busy timeout, synchronous NORMAL. (Here because this
/// target links all four services.)
struct StoreOpeningTests {
    struct Pragmas: Equatable {
        var journal: String, foreignKeys: Int, busyMilliseconds: Int, synchronous: Int
    }

    static func pragmas(_ database: DatabasePool) throws -> Pragmas {
        try database.write { db in
            Pragmas(
                journal: try String.fetchOne(db, sql: "PRAGMA journal_mode") ?? "",
                foreignKeys: try Int.fetchOne(db, sql: "PRAGMA foreign_keys") ?? -1,
                busyMilliseconds: try Int.fetchOne(db, sql: "PRAGMA busy_timeout") ?? -1,
                synchronous: try Int.fetchOne(db, sql: "PRAGMA synchronous") ?? -1)
        }
    }

    @Test func everyStoreOpensWithTheSamePragmas() throws {
        let directory = try TemporaryDirectory("stores")
        defer { directory.remove() }
        func path(_ name: String) -> String { directory.path(name) }
        // synchronous NORMAL (1): with WAL, every commit survives the process crashing.
        let expected = Pragmas(journal: "wal", foreignKeys: 1, busyMilliseconds: 5_000, synchronous: 1)
        let opened = [
            try Self.pragmas(SQLiteCareStore(path: path("care.sqlite")).database),
            try Self.pragmas(SQLiteIdentificationStore(path: path("identify.sqlite")).database),
            try Self.pragmas(SQLiteImageStore(directory: directory.url.appendingPathComponent("images")).database),
            try Self.pragmas(SQLiteReminderStore(path: path("remind.sqlite")).database),
        ]
        #expect(opened == Array(repeating: expected, count: 4), "\(opened)")
    }

    @Test func aForeignKeyIsEnforcedInTheImageIndexToo() throws {
        let directory = try TemporaryDirectory("stores")
        defer { directory.remove() }
        let store = try SQLiteImageStore(directory: directory.url)
        #expect(throws: DatabaseError.self) {
            try store.database.write { db in
                try db.execute(sql: "INSERT INTO photos (owner, plantID, sha256, addedAt) VALUES ('alice', 'p', 'no-such-original', 0)")
            }
        }
    }
}
