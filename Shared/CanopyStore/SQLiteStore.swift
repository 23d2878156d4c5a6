import Dispatch
import GRDB
import Synchronization

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
/// - `secure_delete` on: deleted content is overwritten with zeros in the database file, and
///   after an erasure the write-ahead log is checkpointed and truncated to nothing
///   (``eraseResidue(_:)``), so no byte of a deleted person stays in either file.
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
            try db.execute(sql: "PRAGMA secure_delete = ON")
            if !db.configuration.readonly { try db.execute(sql: "PRAGMA wal_autocheckpoint = \(fallbackCheckpointPages)") }
        }
        let database = try DatabasePool(path: path, configuration: configuration)
        try migrator.migrate(database)
        try Checkpointer.start(for: database, path: path)
        return database
    }

    /// Has `pool`'s write-ahead log copied into the database file and truncated to zero bytes
    /// at the background checkpointer's next tick (within ``checkpointInterval``; again at each
    /// tick while a reader holds an older snapshot): what an erasure calls once its deletions
    /// are committed, since the log keeps the pages a transaction changed (the person's rows
    /// among them) until they are overwritten, long after `secure_delete` cleared them from the
    /// database file. Returns at once: the caller's thread (often one of Swift's cooperative
    /// pool) never waits on a checkpoint.
    public static func eraseResidue(_ pool: DatabasePool) {
        Checkpointer.truncateSoon(pool)
    }

    /// `wal_checkpoint(TRUNCATE)`; whether it completed (false: a reader held on).
    static func truncateLog(_ db: Database) throws -> Bool {
        try Row.fetchOne(db, sql: "PRAGMA wal_checkpoint(TRUNCATE)")?[0] as Int? == 0
    }

    /// Checkpoints `pool`'s log in the background (`PASSIVE`: never waiting for, nor making
    /// wait, a reader or a writer) until the pool is released.
    final class Checkpointer: @unchecked Sendable { // its timer is touched at start, then only by its own handler
        private let connection: DatabaseQueue
        private let timer: DispatchSourceTimer
        /// Open pools whose log is to be truncated at their checkpointer's next ticks (an
        /// erasure's), until it was: the one place the process's checkpointers share, since a
        /// store holds its pool and not its checkpointer. A pool's entry goes with the pool.
        private static let truncating = Mutex<Set<ObjectIdentifier>>([])

        /// Asks the checkpointer of `pool` to truncate its log (``eraseResidue(_:)``).
        static func truncateSoon(_ pool: DatabasePool) {
            _ = truncating.withLock { $0.insert(ObjectIdentifier(pool)) }
        }

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
            let key = ObjectIdentifier(pool)
            timer.setEventHandler { [weak pool] in
                guard pool != nil else {
                    checkpointer.timer.cancel()
                    _ = truncating.withLock { $0.remove(key) } // the identifier may be another pool's next
                    return
                }
                guard truncating.withLock({ $0.contains(key) }) else {
                    _ = try? checkpointer.connection.writeWithoutTransaction { db in try db.checkpoint(.passive) }
                    return
                }
                // TRUNCATE: the whole log copied, and the file cut to nothing (a reader still in
                // an older snapshot makes it busy: the next tick tries again).
                let done = (try? checkpointer.connection.writeWithoutTransaction { db in try truncateLog(db) }) ?? false
                if done { _ = truncating.withLock { $0.remove(key) } }
            }
            timer.resume()
        }
    }
}
