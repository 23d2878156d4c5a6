import GRDB

/// How every Canopy store opens its SQLite file, so that all of them agree on the pragmas:
///
/// - WAL, through a `DatabasePool`: readers never wait for the writer.
/// - `synchronous = NORMAL` (what GRDB sets for WAL): every commit survives the process
///   crashing; only losing power can roll back the last moments. Commits cost no fsync each.
///   What a store's last writes mean when lost is written beside the store.
/// - Foreign keys enforced.
/// - A writer that finds the file locked waits up to ``busyTimeout`` instead of failing.
/// - The store's migrations run before anything else touches it.
public enum SQLiteStore {
    /// How long a writer waits, in seconds, for a lock another connection holds.
    public static let busyTimeout: Double = 5

    /// Opens (creating) the database at `path` and migrates it.
    public static func open(path: String, migrator: DatabaseMigrator) throws -> DatabasePool {
        var configuration = Configuration()
        configuration.foreignKeysEnabled = true
        configuration.busyMode = .timeout(busyTimeout)
        let database = try DatabasePool(path: path, configuration: configuration)
        try migrator.migrate(database)
        return database
    }
}
