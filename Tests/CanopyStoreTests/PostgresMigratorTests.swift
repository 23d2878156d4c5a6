import CanopyStore
import CanopyTesting
import Logging
import PostgresNIO
import Testing

/// A store's schema on PostgreSQL: applied once, in order, all of a migration or none of it,
/// once when replicas start together, and a newer database refused.
@Suite(.serialized)
struct PostgresMigratorTests {
    let logger = Logger(label: "canopy-test-migrations")

    static var plants: PostgresMigrator {
        var migrator = PostgresMigrator(store: "care")
        migrator.register("v1", "CREATE TABLE plants (id TEXT PRIMARY KEY, owner TEXT NOT NULL)")
        migrator.register("v2-version", "ALTER TABLE plants ADD COLUMN version INTEGER NOT NULL DEFAULT 1")
        return migrator
    }

    /// A running client of a fresh database on a throwaway server.
    func withDatabase(_ body: (PostgresClient, DatabaseURL) async throws -> Void) async throws {
        guard PostgresServer.isAvailable else {
            Issue.record("PostgreSQL is not installed; scripts/setup installs Debian's postgresql package")
            return
        }
        try await withPostgres { server in
            let url = try await server.database()
            let client = PostgresClient(configuration: url.clientConfiguration())
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { await client.run() }
                defer { group.cancelAll() }
                try await body(client, url)
            }
        }
    }

    /// A store renamed keeps its schema: the records under its former name become its own, and
    /// nothing is applied twice.
    @Test func aRenamedStoreFindsWhatItsFormerNameApplied() async throws {
        try await withDatabase { client, url in
            #expect(try await Self.plants.migrate(client, logger: logger) == ["v1", "v2-version"])
            var renamed = PostgresMigrator(store: "garden", formerNames: ["care"])
            renamed.register("v1", "CREATE TABLE plants (id TEXT PRIMARY KEY, owner TEXT NOT NULL)")
            renamed.register("v2-version", "ALTER TABLE plants ADD COLUMN version INTEGER NOT NULL DEFAULT 1")
            #expect(try await renamed.applied(client, logger: logger) == ["v1", "v2-version"], "read under the former name before any migration")
            renamed.register("v3-notes", "ALTER TABLE plants ADD COLUMN notes TEXT")
            #expect(try await renamed.migrate(client, logger: logger) == ["v3-notes"])
            let stores = try await client.query("SELECT DISTINCT store FROM canopy_migrations", logger: logger)
            var names: [String] = []
            for try await name in stores.decode(String.self) { names.append(name) }
            #expect(names == ["garden"], "every record moved to the present name")
        }
    }

    @Test func migrationsApplyOnceInOrder() async throws {
        try await withDatabase { client, url in
            #expect(try await Self.plants.migrate(client, logger: logger) == ["v1", "v2-version"])
            #expect(try await Self.plants.migrate(client, logger: logger).isEmpty, "the second time, nothing to do")
            #expect(try await Self.plants.applied(client, logger: logger) == ["v1", "v2-version"])
            try await client.query("INSERT INTO plants (id, owner) VALUES ('p1', 'alice')", logger: logger)
            #expect(try await PostgresServer.query(url, "SELECT version FROM plants WHERE version = 1") == 1)
            // Another store in the same database keeps its own list.
            var remind = PostgresMigrator(store: "remind")
            remind.register("v1", "CREATE TABLE reminders (id BIGSERIAL PRIMARY KEY)")
            #expect(try await remind.migrate(client, logger: logger) == ["v1"])
        }
    }

    @Test func aMigrationThatFailsLeavesNothingOfItself() async throws {
        let broken = {
            var migrator = Self.plants
            migrator.register("v3-broken", "CREATE TABLE photos (id TEXT PRIMARY KEY)", "ALTER TABLE nowhere ADD COLUMN x INTEGER")
            return migrator
        }()
        try await withDatabase { (client: PostgresClient, url: DatabaseURL) async throws in
            let failure = await #expect(throws: PostgresMigrator.Failure.self) { try await broken.migrate(client, logger: logger) }
            #expect(failure?.description.contains("'v3-broken' failed, and nothing of it was applied") == true, "\(failure?.description ?? "")")
            #expect(try await broken.applied(client, logger: logger) == ["v1", "v2-version"], "the ones before it stand")
            #expect(try await PostgresServer.query(url, "SELECT 1 FROM pg_tables WHERE tablename = 'photos'") == 0, "its first statement was rolled back")
        }
    }

    @Test func replicasStartingTogetherMigrateOnce() async throws {
        try await withDatabase { client, url in
            // Eight replicas at once, each with a client of its own; the first migration takes
            // 200 ms, so that they overlap (without the lock, all eight would apply it).
            var slow = PostgresMigrator(store: "care")
            slow.register("v1", "CREATE TABLE plants (id TEXT PRIMARY KEY, owner TEXT NOT NULL)", "SELECT pg_sleep(0.2)")
            slow.register("v2-version", "ALTER TABLE plants ADD COLUMN version INTEGER NOT NULL DEFAULT 1")
            let migrator = slow
            let outcomes = try await withThrowingTaskGroup(of: [String].self) { group in
                for _ in 0..<8 {
                    group.addTask {
                        let replica = PostgresClient(configuration: url.clientConfiguration())
                        return try await withThrowingTaskGroup(of: [String].self) { inner in
                            inner.addTask {
                                await replica.run()
                                return []
                            }
                            defer { inner.cancelAll() } // also when migrating throws
                            return try await migrator.migrate(replica, logger: Logger(label: "replica"))
                        }
                    }
                }
                return try await group.reduce(into: [[String]]()) { $0.append($1) }
            }
            #expect(outcomes.flatMap { $0 }.sorted() == ["v1", "v2-version"], "each migration applied by exactly one replica: \(outcomes)")
            #expect(try await PostgresServer.query(url, "SELECT * FROM canopy_migrations") == 2)
        }
    }

    @Test func aDatabaseMigratedByANewerCanopyIsRefused() async throws {
        let newer = {
            var migrator = Self.plants
            migrator.register("v3-photos", "CREATE TABLE photos (id TEXT PRIMARY KEY)")
            return migrator
        }()
        try await withDatabase { (client: PostgresClient, _: DatabaseURL) async throws in
            try await newer.migrate(client, logger: logger)
            let refused = await #expect(throws: PostgresMigrator.Failure.self) { try await Self.plants.migrate(client, logger: logger) }
            #expect(refused?.description.contains("migrated by a newer Canopy") == true && refused?.description.contains("v3-photos") == true)
        }
    }
}
