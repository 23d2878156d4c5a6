import Foundation
import GRDB
import PostgresNIO

/// The people a store holds data of: every distinct value of an `owner` or `person` column,
/// in any table (every Canopy store names a row's person so). What `canopy erasures apply`
/// looks through for people whose accounts were deleted after a backup was taken.
extension StoreOwners {
    /// The columns that name a row's person.
    static let columns: Set<String> = ["owner", "person"]

    /// Everyone the SQLite store at `path` holds data of (read in one transaction).
    public static func people(inStoreAt path: String) throws -> Set<String> {
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        let queue = try DatabaseQueue(path: path, configuration: configuration)
        defer { try? queue.close() }
        return try queue.read { db in
            var people: Set<String> = []
            for table in try String.fetchAll(
                db, sql: "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name NOT LIKE 'grdb_%'")
            {
                for column in try db.columns(in: table) where columns.contains(column.name.lowercased()) {
                    let (name, quoted) = (column.name.quotedDatabaseIdentifier, table.quotedDatabaseIdentifier)
                    people.formUnion(try String.fetchAll(db, sql: "SELECT DISTINCT \(name) FROM \(quoted) WHERE \(name) IS NOT NULL"))
                }
            }
            return people
        }
    }

    /// Everyone the PostgreSQL `store` connects to holds data of, in every table of its
    /// schema (the stack's stores share one database).
    public static func people(in store: PostgresStore) throws -> Set<String> {
        try store.read { session in
            let found = try session.rows(
                """
                SELECT table_name, column_name FROM information_schema.columns
                WHERE table_schema = current_schema() AND lower(column_name) IN ('owner', 'person') AND data_type = 'text'
                """)
            var people: Set<String> = []
            for row in found {
                let (table, column) = (try row.column("table_name").decode(String.self), try row.column("column_name").decode(String.self))
                let name = { (identifier: String) in "\"\(identifier.replacingOccurrences(of: "\"", with: "\"\""))\"" }
                for person in try session.rows(
                    PostgresQuery(unsafeSQL: "SELECT DISTINCT \(name(column)) FROM \(name(table)) WHERE \(name(column)) IS NOT NULL"))
                {
                    people.insert(try person[0].decode(String.self))
                }
            }
            return people
        }
    }
}
