import Dispatch
import GRDB

/// How every Canopy store opens its SQLite file, so that all of them agree on the pragmas:
///
/// - WAL, through a `DatabasePool`: readers never wait for the writer.
/// - `synchronous = NORMAL` (what GRDB sets for WAL): every commit survives the process
///   crashing; only losing power can roll back the last moments. Commits cost no fsync each.
///   What a store's last writes mean when lost is written beside the store.
/// - Checkpoints (copying the write-ahead log into the database file, with an fsync) run in
///   the background, twice a second, on a connection of their own (``Checkpointer``), not in
///   the commit that happens to fill the log: that commit took 3–4 ms longer, the slowest 1%
///   of canopy-care's saves. A commit checkpoints itself only when the log has grown past
///   ``fallbackCheckpointPages`` (the background far behind).
/// - Foreign keys enforced.
/// - A writer that finds the file locked waits up to ``busyTimeout`` instead of failing.
/// - The store's migrations run before anything else touches it.
public enum SQLiteStore {
    /// How long a writer waits, in seconds, for a lock another connection holds.
    public static let busyTimeout: Double = 5

    /// The log's size, in pages, past which a commit checkpoints itself (SQLite's default is
    /// 1,000; the background keeps it far below).
    public static let fallbackCheckpointPages = 20_000
    /// How often the background checkpoints.
    public static let checkpointInterval: DispatchTimeInterval = .milliseconds(500)

    /// Opens (creating) the database at `path` and migrates it.
    public static func open(path: String, migrator: DatabaseMigrator) throws -> DatabasePool {
        var configuration = Configuration()
        configuration.foreignKeysEnabled = true
        configuration.busyMode = .timeout(busyTimeout)
        configuration.prepareDatabase { db in
            if !db.configuration.readonly { try db.execute(sql: "PRAGMA wal_autocheckpoint = \(fallbackCheckpointPages)") }
        }
        let database = try DatabasePool(path: path, configuration: configuration)
        try migrator.migrate(database)
        try Checkpointer.start(for: database, path: path)
        return database
    }

    /// Checkpoints `pool`'s log in the background (`PASSIVE`: never waiting for, nor making
    /// wait, a reader or a writer) until the pool is released.
    final class Checkpointer: @unchecked Sendable { // its timer is touched at start, then only by its own handler
        private let connection: DatabaseQueue
        private let timer: DispatchSourceTimer

        private init(connection: DatabaseQueue, timer: DispatchSourceTimer) {
            self.connection = connection
            self.timer = timer
        }

        static func start(for pool: DatabasePool, path: String) throws {
            var configuration = Configuration()
            configuration.busyMode = .timeout(busyTimeout)
            configuration.label = "checkpointer"
            let connection = try DatabaseQueue(path: path, configuration: configuration)
            let timer = DispatchSource.makeTimerSource(queue: .global(qos: .utility))
            let checkpointer = Checkpointer(connection: connection, timer: timer)
            timer.schedule(deadline: .now() + checkpointInterval, repeating: checkpointInterval, leeway: .milliseconds(100))
            // Holds the checkpointer (and its connection), not the pool: the first tick after
            // the pool is gone ends it.
            timer.setEventHandler { [weak pool] in
                guard pool != nil else {
                    checkpointer.timer.cancel()
                    return
                }
                _ = try? checkpointer.connection.writeWithoutTransaction { db in try db.checkpoint(.passive) }
            }
            timer.resume()
        }
    }
}
