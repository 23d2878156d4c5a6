import CanopyStore
import CanopyTesting
import Foundation
import GRDB
import Logging
import PostgresNIO
import Testing

/// What an import decides before it writes: a target with none of the store's rows (its
/// tables absent, or some of them made by a migrate killed between two migrations) takes it;
/// the same install's import, unchanged, is there already; another install's is refused.
@Suite(.serialized)
struct StoreImportTests {
    let logger = Logger(label: "canopy-test-import")

    /// A store of two tables in two migrations (as care's `requestKeys` came in v3).
    static var notes: StoreImport {
        var migrator = PostgresMigrator(store: "notes")
        migrator.register("v1", "CREATE TABLE notes (id TEXT PRIMARY KEY, owner TEXT NOT NULL)")
        migrator.register("v2", "CREATE TABLE tags (id TEXT PRIMARY KEY, owner TEXT NOT NULL)")
        return StoreImport(store: "notes", migrator: migrator, tables: [.init("notes", key: ["id"]), .init("tags", key: ["id"])])
    }

    @Test func aPartSchemaIsEmptyTheSameInstallIsThereAndAnotherIsRefused() async throws {
        guard PostgresServer.isAvailable else {
            Issue.record("PostgreSQL is not installed; scripts/setup installs Debian's postgresql package")
            return
        }
        let directory = try TemporaryDirectory("store-import")
        defer { directory.remove() }
        let source = directory.path("notes.sqlite")
        let queue = try DatabaseQueue(path: source)
        try await queue.write { db in
            try db.execute(sql: "CREATE TABLE notes (id TEXT PRIMARY KEY, owner TEXT NOT NULL); CREATE TABLE tags (id TEXT PRIMARY KEY, owner TEXT NOT NULL)")
            try db.execute(sql: "INSERT INTO notes VALUES ('n1', 'alice'), ('n2', 'bob'); INSERT INTO tags VALUES ('t1', 'alice')")
        }
        try queue.close()
        try await withPostgres { server in
            let url = try await server.database()
            // Killed between the two migrations: v1's table made, v2's not.
            var first = PostgresMigrator(store: "notes")
            first.register("v1", "CREATE TABLE notes (id TEXT PRIMARY KEY, owner TEXT NOT NULL)")
            let partial = try await PostgresStore.open(url: url, migrator: first, size: 1, logger: logger)
            partial.close()
            let target = try await PostgresStore.inspect(url: url, logger: logger)
            defer { target.close() }
            #expect(try Self.notes.check(from: source, into: target, install: "install-a") == .empty)

            let imported = try await Self.notes.run(from: source, into: url, source: directory.path(""), install: "install-a", logger: logger)
            #expect(imported.outcome == .imported && imported.tables.map(\.rows) == [2, 1])
            if case .imported = try Self.notes.check(from: source, into: target, install: "install-a") {
            } else {
                Issue.record("this install's import is there")
            }
            #expect(try await Self.notes.run(from: source, into: url, source: directory.path(""), install: "install-a", logger: logger).outcome == .unchanged)

            // Another install: refused before and inside the import, the rows kept.
            let refused = #expect(throws: StoreImport.Refused.self) { try Self.notes.check(from: source, into: target, install: "install-b") }
            #expect(refused?.description.contains("migrated from another install") == true, "\(refused?.description ?? "")")
            await #expect(throws: StoreImport.Refused.self) {
                _ = try await Self.notes.run(from: source, into: url, source: "elsewhere", install: "install-b", logger: logger)
            }
            #expect(try await PostgresServer.query(url, "SELECT 1 FROM notes") == 2)

            // Rows nobody imported: refused for every install.
            try await PostgresServer.query(url, "DELETE FROM canopy_imports")
            #expect(throws: StoreImport.Refused.self) { try Self.notes.check(from: source, into: target, install: "install-a") }
        }
    }
}
