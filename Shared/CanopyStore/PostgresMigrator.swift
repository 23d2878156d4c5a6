import Logging
import PostgresNIO

/// A store's schema on PostgreSQL, as named, ordered migrations (what GRDB's
/// `DatabaseMigrator` is for the SQLite stores): each applied once, in its own transaction,
/// and recorded in `canopy_migrations` under the store's name, so several stores may share one
/// database and a migration that fails leaves nothing of itself.
///
/// Replicas that start together migrate once: each takes a transaction-scoped advisory lock
/// for the store first, so the second waits, then finds the work done. A database migrated
/// by a newer Canopy (a migration this one does not know) is refused, with a sentence.
public struct PostgresMigrator: Sendable {
    /// One step of the schema.
    public struct Migration: Sendable {
        public var name: String
        /// Run in order, in one transaction.
        public var statements: [String]
    }

    /// The store the migrations belong to (`care`, `remind`, …).
    public let store: String
    /// Names the store had before (`batch`, for canopy-api's): a database migrated under one
    /// has its records moved to ``store`` at the next migration.
    public let formerNames: [String]
    public private(set) var migrations: [Migration] = []

    /// A migration that cannot be applied, or a database this Canopy cannot use.
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    public init(store: String, formerNames: [String] = []) {
        self.store = store
        self.formerNames = formerNames
    }

    /// Adds the next migration (names are unique per store; a migration, once released, never
    /// changes: a new one follows it).
    public mutating func register(_ name: String, _ statements: String...) {
        register(name, statements)
    }

    /// ``register(_:_:)-(_,String...)`` with the statements in an array.
    public mutating func register(_ name: String, _ statements: [String]) {
        precondition(!migrations.contains { $0.name == name }, "the migration '\(name)' of \(store) is registered twice")
        migrations.append(Migration(name: name, statements: statements))
    }

    /// Applies the migrations `client`'s database has not had yet; returns their names.
    @discardableResult
    public func migrate(_ client: PostgresClient, logger: Logger) async throws -> [String] {
        try await client.withConnection { connection in try await migrate(connection, logger: logger) }
    }

    /// Applies the migrations the database `connection` is connected to has not had yet;
    /// returns their names.
    @discardableResult
    public func migrate(_ connection: PostgresConnection, logger: Logger) async throws -> [String] {
        // Under a lock too: two replicas creating the table at once collide in PostgreSQL's
        // catalog (CREATE TABLE IF NOT EXISTS is not safe against itself).
        try await connection.withTransaction(logger: logger) { connection in
            try await connection.query("SELECT pg_advisory_xact_lock(hashtext('canopy_migrations'))", logger: logger)
            try await connection.query(
                """
                CREATE TABLE IF NOT EXISTS canopy_migrations (
                    store TEXT NOT NULL,
                    name TEXT NOT NULL,
                    appliedAt TIMESTAMPTZ NOT NULL DEFAULT now(),
                    PRIMARY KEY (store, name))
                """, logger: logger)
            for former in formerNames {
                // The store's records under its former name become its own (once: a database
                // that has both keeps what it has under the present name).
                try await connection.query(
                    """
                    UPDATE canopy_migrations SET store = \(store)
                    WHERE store = \(former) AND NOT EXISTS (SELECT 1 FROM canopy_migrations WHERE store = \(store))
                    """, logger: logger)
                try await connection.query(
                    """
                    DO $$ BEGIN
                        IF to_regclass('canopy_imports') IS NOT NULL THEN
                            UPDATE canopy_imports SET store = '\(unescaped: store)' WHERE store = '\(unescaped: former)'
                              AND NOT EXISTS (SELECT 1 FROM canopy_imports WHERE store = '\(unescaped: store)');
                        END IF;
                    END $$
                    """, logger: logger)
            }
        }
        var applied: [String] = []
        for migration in migrations {
            let ran = try await Self.unwrapped {
                try await connection.withTransaction(logger: logger) { connection -> Bool in
                    // One replica at a time per store: the lock ends with the transaction.
                    try await connection.query("SELECT pg_advisory_xact_lock(hashtext(\(store)))", logger: logger)
                    let done = try await self.applied(connection, logger: logger)
                    if let unknown = done.first(where: { name in !migrations.contains { $0.name == name } }) {
                        throw Failure(
                            description:
                                "the \(store) store in this database was migrated by a newer Canopy (it has '\(unknown)', which this one does not know); run that version, or a newer one"
                        )
                    }
                    guard !done.contains(migration.name) else { return false }
                    for statement in migration.statements {
                        do {
                            try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                        } catch {
                            throw Failure(
                                description:
                                    "the \(store) migration '\(migration.name)' failed, and nothing of it was applied: \(String(reflecting: error).prefix(600))"
                            )
                        }
                    }
                    try await connection.query("INSERT INTO canopy_migrations (store, name) VALUES (\(store), \(migration.name))", logger: logger)
                    return true
                }
            }
            if ran { applied.append(migration.name) }
        }
        return applied
    }

    /// `body`, with a ``Failure`` thrown inside a transaction thrown as itself (postgres-nio
    /// wraps what a transaction's closure throws).
    private static func unwrapped<T>(_ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let error as PostgresTransactionError {
            if let failure = error.closureError as? Failure { throw failure }
            throw error
        }
    }

    /// The names already applied to this store, oldest first.
    public func applied(_ client: PostgresClient, logger: Logger) async throws -> [String] {
        try await client.withConnection { connection in try await applied(connection, logger: logger) }
    }

    private func applied(_ connection: PostgresConnection, logger: Logger) async throws -> [String] {
        var names: [String] = []
        // A database not migrated since the store was renamed has its records under a former name.
        let rows = try await connection.query(
            """
            SELECT name FROM canopy_migrations WHERE store = ANY(\([store] + formerNames))
            ORDER BY appliedAt, name
            """, logger: logger)
        for try await name in rows.decode(String.self) { names.append(name) }
        return names
    }
}
