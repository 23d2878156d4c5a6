import CanopyStore
import CanopyTesting
import Foundation
import GRDB
import Testing

/// A store kept under a service's former name is moved into its present place once, whole.
struct StoreFileTests {
    @Test func aStoreUnderItsFormerNameIsMovedOnceWithItsLog() throws {
        let data = try TemporaryDirectory("store-adopt")
        defer { data.remove() }
        let old = data.url.appendingPathComponent("batch")
        try FileManager.default.createDirectory(at: old, withIntermediateDirectories: true)
        // A store with a committed row still in its write-ahead log.
        let queue = try DatabasePool(path: old.appendingPathComponent("batch.sqlite").path)
        try queue.write { db in
            try db.execute(sql: "CREATE TABLE signedOut (principal TEXT PRIMARY KEY)")
            try db.execute(sql: "INSERT INTO signedOut VALUES ('d1')")
        }
        #expect(FileManager.default.fileExists(atPath: old.appendingPathComponent("batch.sqlite-wal").path))
        try queue.close()

        #expect(try StoreFile.adopt(formerName: "batch", as: "api", in: data.url))
        #expect(!FileManager.default.fileExists(atPath: old.path), "the former folder goes once empty")
        let moved = try DatabaseQueue(path: data.path("api/api.sqlite"))
        #expect(try moved.read { db in try String.fetchAll(db, sql: "SELECT principal FROM signedOut") } == ["d1"])
        try moved.close()
        #expect(try !StoreFile.adopt(formerName: "batch", as: "api", in: data.url), "once")

        // A present store is never replaced by a former one.
        try FileManager.default.createDirectory(at: old, withIntermediateDirectories: true)
        try Data("other".utf8).write(to: old.appendingPathComponent("batch.sqlite"))
        #expect(try !StoreFile.adopt(formerName: "batch", as: "api", in: data.url))
        #expect(FileManager.default.fileExists(atPath: old.appendingPathComponent("batch.sqlite").path))
    }
}
