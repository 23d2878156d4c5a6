import CanopyMessages
import Dispatch
import Foundation
import Logging
import PostgresNIO
import Synchronization

/// How every Canopy store reaches PostgreSQL (what ``SQLiteStore`` is for the embedded
/// default): a bounded pool of connections and transactions run synchronously, so a store's
/// rules read and write inside one transaction on either backend without turning async.
///
/// Callers are Dispatch threads (handlers run off Swift's cooperative pool, see
/// `offThePool`): a statement waits for postgres-nio's event loop, never on it.
///
/// - Writes are `SERIALIZABLE` unless the store asks for `READ COMMITTED` (and orders its
///   work itself with advisory locks taken before it reads, as canopy-remind and
///   canopy-images do): replicas writing at once behave as if one wrote after the other, as
///   SQLite's single writer does. A transaction PostgreSQL aborts for a conflict
///   (serialization failure, deadlock) is run again from the start, up to ``retries``
///   times, so a body must only read and write through its session.
/// - Reads are `REPEATABLE READ READ ONLY`: one snapshot for the whole body.
/// - A connection that fails is closed and replaced by the next caller; at most ``size``
///   are open, and a caller that finds all busy for ``acquireTimeout`` gets an error that
///   says so.
/// - Each open store is present (``presence``): a connection of its own holds an advisory
///   lock named by its ``holder`` id for as long as the process lives, so what it leases
///   (a follow-up, a send, a submission) is free for another replica as soon as the process
///   is gone (``holderIsGone(_:)``), not only when the lease ends.
public final class PostgresStore: Sendable {
    public let url: DatabaseURL
    /// This store's id in leases it takes (``holderIsGone(_:)``): random, positive, its own.
    public let holder = Int64(Int32.random(in: 1...Int32.max))
    private let presence = Mutex<Task<Void, Never>?>(nil)
    /// Connections at most (`--database-pool`): replicas × size is what the server must allow.
    public let size: Int
    /// How many times a transaction aborted by a conflict with another is run again (within
    /// ``conflictLimit``); then the caller gets ``Failure`` (`busy`: try again).
    public static let retries = 20
    /// How long one attempt to connect may take in all (TCP within ``DatabaseURL/connectTimeout``,
    /// then TLS and signing in).
    public static let attemptLimit: Duration = .seconds(5)
    /// How long a caller waits for a free connection.
    public static let acquireTimeout: Double = 30
    private let configuration: PostgresConnection.Configuration
    private let logger: Logger
    private let idle = Mutex<[PostgresConnection]>([])
    private let slots: DispatchSemaphore
    private let opened = Atomic<Int>(0)
    private let closed = Atomic<Bool>(false)
    /// Connections being made, by id (``beginShutdown()`` fails them).
    private let connecting = Mutex<[Int: EventLoopPromise<PostgresConnection>]>([:])
    /// Set by ``beginShutdown()``; with ``gaveUp`` (a connect failed since), connects fail at once.
    private let shuttingDown = Atomic<Bool>(false)
    private let gaveUp = Atomic<Bool>(false)
    /// Whether a ``vacuumSoon(_:)`` runs, and whether another was asked for meanwhile.
    private let vacuum = Mutex((running: false, again: false))

    /// The store could not be reached or refused what was asked, with a sentence.
    ///
    /// What a caller of a service is told for it (``CanopyErrorConvertible``): `busy` (HTTP
    /// 503, try again) when it may pass by itself (the server unreachable, every connection
    /// busy, writes at once that kept conflicting), else `internal`.
    public struct Failure: Error, CustomStringConvertible, CanopyErrorConvertible {
        public let description: String
        /// Whether trying again later may succeed.
        public var passes = false

        public init(description: String, passes: Bool = false) {
            self.description = description
            self.passes = passes
        }

        /// What the caller is told: no more than that (the database's address and what it
        /// answered are the service log's, not every caller's).
        public var canopyError: CanopyError {
            passes
                ? CanopyError(.busy, "the service's database cannot do this now; try again in a moment")
                : CanopyError(.internal, "the service's database refused this; the service log has the details")
        }
    }

    private init(url: DatabaseURL, size: Int, logger: Logger) throws {
        precondition(size >= 1, "a pool of \(size) connections")
        self.url = url
        self.size = size
        self.logger = logger
        configuration = try url.connectionConfiguration()
        slots = DispatchSemaphore(value: size)
    }

    /// Connects to `url` and applies `migrator`'s migrations (one replica at a time).
    ///
    /// - Parameters:
    ///   - wait: how long a server that cannot be reached yet is waited for (a service that
    ///     starts before its database): tried again every second or two, a log line each
    ///     time saying so, then the sentence of ``Failure``. Zero (operator commands) fails at once.
    ///     Cancelling the task (SIGTERM while waiting) ends the wait with `CancellationError`.
    public static func open(
        url: DatabaseURL, migrator: PostgresMigrator, size: Int = 8, waitingUpTo wait: Duration = .zero,
        logger: Logger
    ) async throws -> PostgresStore {
        let store = try PostgresStore(url: url, size: size, logger: logger)
        let connection = try await store.firstConnection(waitingUpTo: wait)
        do {
            try await migrator.migrate(connection, logger: logger)
        } catch {
            try? await connection.close().get()
            throw error
        }
        store.idle.withLock { $0.append(connection) }
        await store.beginPresence()
        return store
    }

    /// Connects to `url` to look, changing nothing (no migration, no presence): what an
    /// operator command reads before it decides to write (`canopy migrate`'s checks).
    public static func inspect(url: DatabaseURL, logger: Logger) async throws -> PostgresStore {
        let store = try PostgresStore(url: url, size: 1, logger: logger)
        let connection = try await store.firstConnection(waitingUpTo: .zero)
        store.idle.withLock { $0.append(connection) }
        return store
    }

    deinit {
        close()
    }

    /// The first connection, waiting up to `wait` for a server that cannot be reached yet.
    private func firstConnection(waitingUpTo wait: Duration) async throws -> PostgresConnection {
        let start = ContinuousClock.now
        var pause: Duration = .milliseconds(500)
        while true {
            do {
                // SIGTERM while waiting (the task cancelled) ends the attempt at once.
                return try await withTaskCancellationHandler {
                    try await connect().get()
                } onCancel: {
                    beginShutdown()
                }
            } catch {
                let waited = ContinuousClock.now - start
                guard waited + pause <= wait, Self.isWorthWaitingFor(error) else { throw unreachable(error) }
                try Task.checkCancellation()
                logger.warning(
                    "store.database.waiting",
                    metadata: [
                        "store.database": "\(url)",
                        "store.reason":
                            "cannot reach PostgreSQL at \(url) yet (\(Self.cause(of: error))); trying again in \(pause.components.seconds == 0 ? "0.5" : "\(pause.components.seconds)") s, \(waited.components.seconds) s of \(wait.components.seconds) s waited",
                    ])
                try await Task.sleep(for: pause)
                pause = min(pause * 2, .seconds(2))
            }
        }
    }

    /// Stops waiting on connections that are not made yet: each attempt in progress fails at
    /// once, and once one attempt fails afterwards (the server is gone) so does every later
    /// one. Connections already open go on serving, so a shutdown still finishes the work
    /// in flight when the server is there. Called when graceful shutdown begins: a worker
    /// draining its requests against a server that went away first (compose stopping
    /// PostgreSQL) never waits on connects past its stop grace.
    public func beginShutdown() {
        shuttingDown.store(true, ordering: .relaxed)
        let failed = Failure(description: "stopped waiting for PostgreSQL at \(url): this process is shutting down", passes: true)
        for promise in connecting.withLock({ connecting in
            defer { connecting.removeAll() }
            return Array(connecting.values)
        }) {
            promise.fail(failed)
        }
    }

    /// Closes every idle connection; calls after this fail.
    public func close() {
        closed.store(true, ordering: .relaxed)
        beginShutdown()
        presence.withLock { $0?.cancel() }
        for connection in idle.withLock({ idle in
            defer { idle.removeAll() }
            return idle
        }) {
            Self.close(connection)
        }
    }

    /// Why a connection could not be made, as a sentence (postgres-nio's own description
    /// hides the cause; its reflection names it, never the password).
    private func unreachable(_ error: any Error) -> Failure {
        Failure(
            description: "cannot reach PostgreSQL at \(url): \(String(reflecting: error).prefix(400)); is it running, and does it let this user in?",
            passes: true)
    }

    /// Closes `connection` without waiting; it lives until closed (postgres-nio requires it).
    private static func close(_ connection: PostgresConnection) {
        connection.close().whenComplete { _ in withExtendedLifetime(connection) {} }
    }

    /// Whether a failed connect may succeed later by itself: no server answered (refused,
    /// timed out, a name not resolved yet), or it answered that it is starting up. A server
    /// that refused these credentials or this database is not waited for.
    private static func isWorthWaitingFor(_ error: any Error) -> Bool {
        guard let error = error as? PSQLError, let state = error.serverInfo?[.sqlState] else { return true }
        return state == "57P03" // cannot_connect_now: the database system is starting up
    }

    /// postgres-nio's error as a short cause ("connection refused", "timed out").
    private static func cause(of error: any Error) -> String {
        String(String(reflecting: error).prefix(200))
    }

    /// A new connection; ``beginShutdown()`` fails it while it is being made. Whoever takes
    /// the promise out of ``connecting`` completes it (the connect, or the shutdown); a
    /// connection made after the shutdown took it is closed again.
    private func connect() -> EventLoopFuture<PostgresConnection> {
        let id = opened.add(1, ordering: .relaxed).newValue
        let loop = MultiThreadedEventLoopGroup.singleton.any()
        if shuttingDown.load(ordering: .relaxed) && gaveUp.load(ordering: .relaxed) {
            return loop.makeFailedFuture(Failure(description: "PostgreSQL at \(url) could not be reached while this process shuts down", passes: true))
        }
        let promise = loop.makePromise(of: PostgresConnection.self)
        connecting.withLock { $0[id] = promise }
        // The whole attempt is bounded, not only its TCP connect: a server that takes the
        // connection and never answers (a hung host, a proxy in front of a dead one) fails it too.
        loop.scheduleTask(in: .seconds(Self.attemptLimit.components.seconds)) { [self] in
            guard let promise = connecting.withLock({ $0.removeValue(forKey: id) }) else { return }
            if shuttingDown.load(ordering: .relaxed) { gaveUp.store(true, ordering: .relaxed) }
            promise.fail(Failure(description: "PostgreSQL at \(url) did not answer within \(Self.attemptLimit.components.seconds) s", passes: true))
        }
        PostgresConnection.connect(on: loop, configuration: configuration, id: id, logger: logger).whenComplete { [self] result in
            guard let promise = connecting.withLock({ $0.removeValue(forKey: id) }) else {
                if case .success(let connection) = result { Self.close(connection) }
                return
            }
            if case .failure = result, shuttingDown.load(ordering: .relaxed) { gaveUp.store(true, ordering: .relaxed) }
            promise.completeWith(result)
        }
        return promise.futureResult
    }

    // MARK: - Transactions

    /// Runs `body` in a read-only transaction that sees one snapshot.
    public func read<T>(function: String = #function, _ body: (PostgresSession) throws -> T) throws -> T {
        try traced("store read", function: function) { try transaction(begin: "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", body) }
    }

    /// Runs `body`, which makes one statement, outside a transaction: a statement is atomic
    /// and sees one snapshot on its own, so a one-statement read (or write) costs one round
    /// trip instead of three (`BEGIN`, the statement, `COMMIT`). A body of more than one
    /// statement belongs in ``read(_:)`` or ``write(isolation:_:)``.
    public func statement<T>(function: String = #function, _ body: (PostgresSession) throws -> T) throws -> T {
        try traced("store statement", function: function) { try withConnection(body) }
    }

    /// How a write transaction is isolated from others running at once.
    public enum Isolation: String, Sendable {
        /// As if the transactions ran one after the other (the default).
        case serializable = "SERIALIZABLE"
        /// Each statement sees what committed before it: for work that orders itself
        /// (an advisory lock, `FOR UPDATE`), such as claiming a queue's rows.
        case readCommitted = "READ COMMITTED"
    }

    /// Runs `body` in a write transaction, serializable unless told: all of it is
    /// committed, or nothing.
    public func write<T>(isolation: Isolation = .serializable, function: String = #function, _ body: (PostgresSession) throws -> T) throws -> T {
        try traced("store write", function: function) { try transaction(begin: "BEGIN ISOLATION LEVEL \(isolation.rawValue)", body) }
    }

    /// A store call as a span of the request that makes it (``StoreTracing``).
    private func traced<T>(_ name: String, function: String, _ body: () throws -> T) throws -> T {
        try StoreTracing.span(name, system: "postgresql", database: configuration.database ?? "", function: function, body)
    }

    private func transaction<T>(begin: String, _ body: (PostgresSession) throws -> T) throws -> T {
        var attempt = 0
        let started = ContinuousClock.now
        while true {
            attempt += 1
            do {
                return try withConnection { session in
                    try session.execute(PostgresQuery(unsafeSQL: begin))
                    do {
                        let result = try body(session)
                        try session.execute("COMMIT")
                        return result
                    } catch {
                        if !session.connection.isClosed { _ = try? session.execute("ROLLBACK") }
                        throw error
                    }
                }
            } catch let error as PSQLError where Self.isConflict(error) {
                // Another transaction won; run this one again on what it wrote, after a random
                // pause that grows with each try (up to 64 ms) so that the two do not meet again.
                guard attempt <= Self.retries, ContinuousClock.now - started < Self.conflictLimit else {
                    throw Failure(
                        description:
                            "the transaction conflicted with others writing the same rows at once \(attempt) times in \(ContinuousClock.now - started)",
                        passes: true)
                }
                usleep(useconds_t(Int.random(in: 0...(1_000 << min(attempt, 6)))))
                continue
            }
        }
    }

    /// How long a transaction that keeps conflicting with others is tried again, at most.
    public static let conflictLimit: Duration = .seconds(3)

    /// A serialization failure or a deadlock: the transaction may succeed when run again.
    static func isConflict(_ error: PSQLError) -> Bool {
        guard let state = error.serverInfo?[.sqlState] else { return false }
        return state == "40001" || state == "40P01"
    }

    /// The server shutting down or restarting, a connection it broke, or a server out of room
    /// (SQLSTATE classes 08, 53, 57): trying again later may succeed.
    static func isUnavailable(_ error: PSQLError) -> Bool {
        guard let state = error.serverInfo?[.sqlState] else { return false }
        return state.hasPrefix("08") || state.hasPrefix("53") || state.hasPrefix("57")
    }

    /// Runs `body` with a connection of the pool (no transaction of its own).
    private func withConnection<T>(_ body: (PostgresSession) throws -> T) throws -> T {
        guard !closed.load(ordering: .relaxed) else { throw Failure(description: "the store at \(url) is closed", passes: true) }
        guard slots.wait(timeout: .now() + Self.acquireTimeout) == .success else {
            throw Failure(
                description:
                    "all \(size) connections to \(url) were busy for \(Int(Self.acquireTimeout)) s; raise --database-pool or the server's max_connections, or add replicas of the database",
                passes: true)
        }
        defer { slots.signal() }
        var connection = idle.withLock { $0.popLast() }
        if let open = connection, open.isClosed { connection = nil }
        let session: PostgresSession
        do {
            session = PostgresSession(connection: try connection ?? connect().wait(), logger: logger)
        } catch {
            throw unreachable(error)
        }
        do {
            let result = try body(session)
            if !session.connection.isClosed { idle.withLock { $0.append(session.connection) } }
            return result
        } catch let error as PSQLError where !Self.isConflict(error) && error.serverInfo == nil {
            // Not an answer of the server's (the connection broke): it may be in any state.
            Self.close(session.connection)
            throw Failure(description: "lost the connection to PostgreSQL at \(url): \(Self.cause(of: error))", passes: true)
        } catch let error as PSQLError where Self.isUnavailable(error) {
            // The server is going away, or out of room: this connection may not serve again.
            Self.close(session.connection)
            throw Failure(description: "PostgreSQL at \(url) cannot serve now: \(error.serverInfo?[.message] ?? "")", passes: true)
        } catch {
            if !session.connection.isClosed { idle.withLock { $0.append(session.connection) } }
            throw error
        }
    }
}

/// One connection of a ``PostgresStore`` while a transaction (or a caller) holds it.
public struct PostgresSession {
    public let connection: PostgresConnection
    let logger: Logger

    /// Every row `query` answers, read by column name.
    public func rows(_ query: PostgresQuery) throws -> [PostgresRandomAccessRow] {
        try connection.query(query, logger: logger).wait().rows.map { $0.makeRandomAccess() }
    }

    /// The first row `query` answers, if any.
    public func row(_ query: PostgresQuery) throws -> PostgresRandomAccessRow? {
        try rows(query).first
    }

    /// The first column of the first row, if there is one and it is not NULL.
    public func value<T: PostgresDecodable>(_ type: T.Type = T.self, _ query: PostgresQuery) throws -> T? {
        guard let row = try connection.query(query, logger: logger).wait().rows.first, let cell = row.first, cell.bytes != nil else { return nil }
        return try cell.decode(T.self)
    }

    /// Runs `query`; returns how many rows it changed.
    @discardableResult
    public func execute(_ query: PostgresQuery) throws -> Int {
        try connection.query(query, logger: logger).wait().metadata.rows ?? 0
    }
}

// MARK: - Erasure

extension PostgresStore {
    /// After an erasure: `VACUUM` of `tables`, on a Dispatch thread, so the pages that held the
    /// deleted rows (dead tuples PostgreSQL keeps for snapshots that might still see them) are
    /// cleared and reused. What PostgreSQL keeps even then: the write-ahead log's segments
    /// until they are recycled (after the next checkpoints), and whatever replicas, WAL
    /// archives and backups took before (docs/operations/data.md, "Erasure").
    ///
    /// One `VACUUM` of a store runs at a time: erasures that come while one runs ask for one
    /// more after it, not one each (two of one table would wait for each other, each holding
    /// a connection of the pool).
    public func vacuumSoon(_ tables: [String]) {
        // The tables were made with unquoted names, which PostgreSQL folds to lower case.
        let statement = "VACUUM " + tables.map { $0.lowercased() }.joined(separator: ", ")
        let start = vacuum.withLock { state -> Bool in
            if state.running {
                state.again = true
                return false
            }
            state.running = true
            return true
        }
        guard start else { return }
        DispatchQueue.global(qos: .utility).async { [self] in
            repeat {
                do {
                    try self.statement { session in try session.execute(PostgresQuery(unsafeSQL: statement)) }
                } catch {
                    logger.warning("store.vacuum.failed", metadata: ["store.error": "\(String(reflecting: error).prefix(400))"])
                }
            } while vacuum.withLock { state -> Bool in
                if state.again {
                    state.again = false
                    return true
                }
                state.running = false
                return false
            }
        }
    }
}

// MARK: - Presence

extension PostgresStore {
    /// The advisory lock class of presence locks (`pg_advisory_lock(class, holder)`): "CANO".
    static let presenceClass: Int32 = 0x4341_4E4F

    /// A condition that is true when the store whose ``holder`` id `column` holds is not
    /// connected any more (its process ended, or lost the server): what it leased is free
    /// before its lease ends. NULL (a lease of unknown holder) waits for its end. One look at
    /// `pg_locks` per statement.
    public static func holderIsGone(_ column: String) -> String {
        """
        (\(column) IS NOT NULL AND \(column) NOT IN (SELECT objid::BIGINT FROM pg_locks WHERE locktype = 'advisory' AND classid = \(presenceClass)::OID \
        AND objsubid = 2 AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())))
        """
    }

    /// Holds this store's presence lock on a connection of its own until ``close()``,
    /// connecting again a second after losing it; returns once it is held (or after 5 s
    /// without, trying on in the background).
    fileprivate func beginPresence() async {
        let (logger, holder, configuration) = (self.logger, self.holder, self.configuration)
        let (held, heldNow) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        // Not holding the store: its deinit is what ends this.
        let task = Task.detached {
            while !Task.isCancelled {
                do {
                    let connection = try await PostgresConnection.connect(
                        on: MultiThreadedEventLoopGroup.singleton.any(), configuration: configuration,
                        id: 0, logger: logger
                    ).get()
                    do {
                        _ = try await connection.query("SELECT pg_advisory_lock(\(Self.presenceClass), \(Int32(holder)))", logger: logger).get()
                        heldNow.yield()
                        // Held while the connection lives: wait for its end, or for close().
                        await withTaskCancellationHandler {
                            _ = try? await connection.closeFuture.get()
                        } onCancel: {
                            connection.close().whenComplete { _ in }
                        }
                    } catch {
                        if !Task.isCancelled { logger.warning("store.presence.lost", metadata: ["error": "\(error)"]) }
                    }
                    try? await connection.close().get()
                } catch {
                    logger.warning("store.presence.connect.failed", metadata: ["error": "\(error)"])
                }
                try? await Task.sleep(for: .seconds(1))
            }
            heldNow.finish()
        }
        presence.withLock { $0 = task }
        await withTaskGroup(of: Void.self) { group in
            group.addTask { for await _ in held { return } }
            group.addTask { try? await Task.sleep(for: .seconds(5)) }
            await group.next()
            group.cancelAll()
        }
    }
}

// MARK: - Notifications

extension PostgresStore {
    /// Calls `onNotification` with the payload of every `NOTIFY` on `channel` (sent by any
    /// replica, on commit), until the returned listening is stopped; returns once the server
    /// listens (or after 5 s without it, listening on in the background). It holds a
    /// connection of its own, outside the pool, and connects again a second after losing it;
    /// each time it listens again it calls `onNotification` with an empty payload, for
    /// whatever was sent meanwhile.
    public func listen(_ channel: String, _ onNotification: @escaping @Sendable (String) -> Void) async -> PostgresListening {
        let logger = self.logger
        let (listening, listeningNow) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        let task = Task.detached { [self] in
            var first = true
            while !Task.isCancelled {
                do {
                    let connection = try await connect().get()
                    do {
                        try await connection.listen(on: channel) { notifications in
                            listeningNow.yield()
                            if !first { onNotification("") }
                            first = false
                            for try await notification in notifications { onNotification(notification.payload) }
                        }
                    } catch {
                        if !Task.isCancelled { logger.warning("store.listen.lost", metadata: ["channel": "\(channel)", "error": "\(error)"]) }
                    }
                    try? await connection.close().get()
                } catch {
                    logger.warning("store.listen.connect.failed", metadata: ["channel": "\(channel)", "error": "\(error)"])
                }
                try? await Task.sleep(for: .seconds(1))
            }
            listeningNow.finish()
        }
        await withTaskGroup(of: Void.self) { group in
            group.addTask { for await _ in listening { return } }
            group.addTask { try? await Task.sleep(for: .seconds(5)) }
            await group.next()
            group.cancelAll()
        }
        return PostgresListening(task: task)
    }
}

/// A ``PostgresStore/listen(_:_:)`` in force.
public struct PostgresListening: Sendable {
    let task: Task<Void, Never>

    /// Stops listening and closes its connection.
    public func stop() { task.cancel() }
}
