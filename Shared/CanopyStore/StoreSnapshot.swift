import Foundation
import GRDB

/// A SQLite store held as it stood at one moment, to be copied later: a read transaction
/// begun on it (cheap: no page is read), while the services go on writing (the stores are in
/// WAL mode, and a reader keeps its view until it ends). A snapshot begins one on every store
/// while the broker holds requests, lets them go, then copies each at leisure: the copies
/// are the stores at the cut, however long copying takes.
public final class PinnedStore {
    public let path: String
    private let queue: DatabaseQueue

    /// Opens the store at `path` (before the moment: opening takes milliseconds, pinning
    /// microseconds).
    public init(path: String) throws {
        self.path = path
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        // The transaction is left open between the accesses on purpose.
        configuration.allowsUnsafeTransactions = true
        queue = try DatabaseQueue(path: path, configuration: configuration)
    }

    /// Begins the read transaction: the store as it stands now is what ``copy(to:)`` copies.
    public func pin() throws {
        try queue.writeWithoutTransaction { db in
            try db.execute(sql: "BEGIN DEFERRED")
            // The first read fixes the view: what was committed by now, nothing after.
            _ = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM sqlite_master")
        }
    }

    /// Copies the store as it stood when pinned to a new file at `copy` (SQLite's online
    /// backup, in one step, reading through the open transaction), and ends the transaction.
    public func copy(to copy: String) throws {
        let destination = try DatabaseQueue(path: copy)
        defer { try? destination.close() }
        try queue.writeWithoutTransaction { db in
            defer { try? db.execute(sql: "COMMIT") }
            try destination.writeWithoutTransaction { target in try db.backup(to: target) }
        }
    }

    /// Ends the transaction without copying.
    public func close() {
        try? queue.writeWithoutTransaction { db in if db.isInsideTransaction { try db.execute(sql: "COMMIT") } }
        try? queue.close()
    }
}

/// Who owns what in a store: every store names the person a row belongs to in a column
/// called `owner` (plants, tasks, devices, reminders, photos, identifications…).
public enum StoreOwners {
    /// Renames every owner in the SQLite store at `path` by `rename` (a snapshot taken with a
    /// pseudonymized capture names people by the capture's pseudonyms), in one transaction.
    /// Returns the rows changed.
    @discardableResult
    public static func rename(inStoreAt path: String, _ rename: @escaping @Sendable (String) -> String) throws -> Int {
        let queue = try DatabaseQueue(path: path)
        defer { try? queue.close() }
        return try queue.write { db in
            db.add(
                function: DatabaseFunction("canopy_owner", argumentCount: 1, pure: true) { values in
                    String.fromDatabaseValue(values[0]).map(rename)
                })
            var changed = 0
            let tables = try String.fetchAll(
                db, sql: "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name NOT LIKE 'grdb_%'")
            for table in tables where try db.columns(in: table).contains(where: { $0.name == "owner" }) {
                try db.execute(sql: "UPDATE \(table.quotedDatabaseIdentifier) SET owner = canopy_owner(owner)")
                changed += db.changesCount
            }
            return changed
        }
    }
}
