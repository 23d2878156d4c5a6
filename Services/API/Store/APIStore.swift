import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation
import GRDB
import Logging
import PostgresNIO
import ServiceLifecycle
import Synchronization

/// canopy-api's own small store, in SQLite (`<data-dir>/api/api.sqlite`) or in the
/// PostgreSQL the stack shares: revocations (``RevocationStoring``) and idempotency keys
/// (``IdempotencyStoring``).
public protocol APIStoring: RevocationStoring, IdempotencyStoring {
    /// Clears what an erasure (a person's account deleted) left beyond its deleted rows: the
    /// write-ahead log's copies of them (SQLite, at once), the dead rows (PostgreSQL, a
    /// `VACUUM` soon after).
    func eraseResidue()
}

/// Revoked tokens and people signed out everywhere (`canopy-api token revoke`). Every
/// change bumps a generation, which each edge watches.
public protocol RevocationStoring: Sendable {
    /// Revokes the token `id` until `until` (after which it would have ended anyway).
    func revoke(id: String, until: Date) throws
    /// Revokes every token issued before `before` (whole seconds, as `iat` has them: a token
    /// issued in the second of the sign-out, after it, is taken) to the person whose
    /// ``SignOutDigest/record(_:)`` is `digest`; an `erasure` (the account deleted) is also
    /// listed among the erasures (``erasures()``), in the same transaction.
    func signOut(digest: String, before: Date, erasure: Bool) throws
    /// Every account deletion recorded, oldest first: what `canopy erasures` lists and applies
    /// again to a store restored from a backup taken before them.
    func erasures() throws -> [Erasure]
    /// Replaces sign-outs recorded under a person's id (before digests) with their digest.
    func digestLegacySignOuts(_ digest: SignOutDigest) throws
    /// Everything in force at `now` (revoked tokens past their end are forgotten).
    func load(now: Date) throws -> Revocations
    /// Bumped by every change.
    func generation() throws -> Int64
}

/// An account deletion as canopy-api keeps it: the person's sign-out digest (one per token
/// key, ``SignOutDigest/candidates(_:)``), never their id, and when it was.
public struct Erasure: Sendable, Equatable {
    public var digest: String
    public var at: Date

    public init(digest: String, at: Date) {
        self.digest = digest
        self.at = at
    }
}

/// The most tokens revoked by id at once (a bound on the store and on every edge's memory).
let maximumRevokedTokens = 1_000_000

/// canopy-api's store in SQLite.
final class SQLiteAPIStore: APIStoring {
    let database: DatabasePool
    let sweep = SweepClock()
    /// Claims and answers of keys, many requests' in one transaction.
    let keyWrites = GroupCommit<KeyWrite, KeyWritten>()
    let idempotencyLimits: IdempotencyLimits

    func eraseResidue() {
        SQLiteStore.eraseResidue(database)
    }

    init(path: String, idempotencyLimits: IdempotencyLimits = IdempotencyLimits()) throws {
        self.idempotencyLimits = idempotencyLimits
        try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        database = try SQLiteStore.open(path: path, migrator: Self.migrator)
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(
                sql: """
                    CREATE TABLE revokedTokens (jti TEXT PRIMARY KEY, until DOUBLE NOT NULL);
                    CREATE TABLE signedOut (principal TEXT PRIMARY KEY, before DOUBLE NOT NULL);
                    CREATE TABLE revocationMeta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
                    INSERT INTO revocationMeta VALUES ('generation', 0);
                    """)
        }
        migrator.registerMigration("v2") { db in try db.execute(sql: IdempotencyTable.sqlite) }
        // Sign-outs name a digest of the person, not the person (rows before it: 0 until digested).
        migrator.registerMigration("v3-digests") { db in try db.execute(sql: "ALTER TABLE signedOut ADD COLUMN digested INTEGER NOT NULL DEFAULT 0") }
        migrator.registerMigration("v4-erasures") { db in try db.execute(sql: Erasure.sqliteTable) }
        migrator.registerMigration("v5-idempotency-owners") { db in try db.execute(sql: IdempotencyTable.sqliteOwners) }
        return migrator
    }

    func revoke(id: String, until: Date) throws {
        try database.tracedWrite { db in
            try db.execute(sql: "DELETE FROM revokedTokens WHERE until < ?", arguments: [Date().timeIntervalSince1970])
            guard try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM revokedTokens") ?? 0 < maximumRevokedTokens else {
                throw CanopyError(.tooLarge, "\(maximumRevokedTokens) tokens are revoked already; sign people out everywhere instead (--user)")
            }
            try db.execute(
                sql: "INSERT INTO revokedTokens VALUES (?, ?) ON CONFLICT (jti) DO UPDATE SET until = max(until, excluded.until)",
                arguments: [id, until.timeIntervalSince1970])
            try db.execute(sql: "UPDATE revocationMeta SET value = value + 1 WHERE key = 'generation'")
        }
    }

    func signOut(digest: String, before: Date, erasure: Bool) throws {
        let at = before.timeIntervalSince1970.rounded(.down)
        try database.tracedWrite { db in
            try db.execute(
                sql: "INSERT INTO signedOut VALUES (?, ?, 1) ON CONFLICT (principal) DO UPDATE SET before = max(before, excluded.before)",
                arguments: [digest, at])
            if erasure { try db.execute(sql: "INSERT INTO erasures VALUES (?, ?) ON CONFLICT (digest) DO NOTHING", arguments: [digest, at]) }
            try db.execute(sql: "UPDATE revocationMeta SET value = value + 1 WHERE key = 'generation'")
        }
    }

    func erasures() throws -> [Erasure] {
        try database.tracedRead { db in
            try Row.fetchAll(db, sql: "SELECT digest, at FROM erasures ORDER BY at, digest").map {
                Erasure(digest: $0["digest"], at: Date(timeIntervalSince1970: $0["at"]))
            }
        }
    }

    func digestLegacySignOuts(_ digest: SignOutDigest) throws {
        guard try database.tracedRead({ db in try Bool.fetchOne(db, sql: "SELECT EXISTS (SELECT 1 FROM signedOut WHERE digested = 0)") ?? false }) else {
            return
        }
        try database.tracedWrite { db in
            let legacy = try Row.fetchAll(db, sql: "SELECT principal, before FROM signedOut WHERE digested = 0")
            guard !legacy.isEmpty else { return }
            for row in legacy {
                let person: String = row["principal"]
                try db.execute(sql: "DELETE FROM signedOut WHERE principal = ?", arguments: [person])
                try db.execute(
                    sql: "INSERT INTO signedOut VALUES (?, ?, 1) ON CONFLICT (principal) DO UPDATE SET before = max(before, excluded.before)",
                    arguments: [digest.record(person), row["before"] as Double])
            }
            try db.execute(sql: "UPDATE revocationMeta SET value = value + 1 WHERE key = 'generation'")
        }
        eraseResidue()
    }

    func load(now: Date) throws -> Revocations {
        try database.tracedRead { db in
            var revocations = Revocations()
            for row in try Row.fetchAll(db, sql: "SELECT jti, until FROM revokedTokens WHERE until >= ?", arguments: [now.timeIntervalSince1970]) {
                revocations.tokens[row["jti"]] = Date(timeIntervalSince1970: row["until"])
            }
            for row in try Row.fetchAll(db, sql: "SELECT principal, before FROM signedOut") {
                revocations.signedOut[row["principal"]] = Date(timeIntervalSince1970: row["before"])
            }
            return revocations
        }
    }

    func generation() throws -> Int64 {
        try database.tracedRead { db in try Int64.fetchOne(db, sql: "SELECT value FROM revocationMeta WHERE key = 'generation'") ?? 0 }
    }
}

/// canopy-api's store in PostgreSQL, shared by every edge of the stack.
final class PostgresAPIStore: APIStoring {
    let database: PostgresStore
    let sweep = SweepClock()
    /// Claims and answers of keys, many requests' in one round trip or two.
    let keyWrites = GroupCommit<KeyWrite, KeyWritten>()
    let idempotencyLimits: IdempotencyLimits

    func eraseResidue() {
        database.vacuumSoon(apiStoreImport.tables.map(\.name))
    }

    /// Where batches of keys say what failed after their writes committed.
    let logger: Logger

    private init(database: PostgresStore, idempotencyLimits: IdempotencyLimits, logger: Logger) {
        self.database = database
        self.idempotencyLimits = idempotencyLimits
        self.logger = logger
    }

    static func open(
        url: DatabaseURL, poolSize: Int, waitingUpTo wait: Duration = .zero, logger: Logger, idempotencyLimits: IdempotencyLimits = IdempotencyLimits()
    ) async throws -> PostgresAPIStore {
        PostgresAPIStore(
            database: try await PostgresStore.open(url: url, migrator: migrator, size: poolSize, waitingUpTo: wait, logger: logger),
            idempotencyLimits: idempotencyLimits, logger: logger)
    }

    static var migrator: PostgresMigrator {
        var migrator = PostgresMigrator(store: CanopyAPIStore.directoryName, formerNames: [CanopyAPIStore.formerName])
        migrator.register(
            "v1",
            "CREATE TABLE revokedTokens (jti TEXT PRIMARY KEY, until DOUBLE PRECISION NOT NULL)",
            "CREATE TABLE signedOut (principal TEXT PRIMARY KEY, before DOUBLE PRECISION NOT NULL)",
            "CREATE TABLE revocationMeta (key TEXT PRIMARY KEY, value BIGINT NOT NULL)",
            "INSERT INTO revocationMeta VALUES ('generation', 0)")
        migrator.register("v2", IdempotencyTable.postgresTable, IdempotencyTable.postgresByExpiry, IdempotencyTable.postgresByPerson)
        // Sign-outs name a digest of the person, not the person (rows before it: 0 until digested).
        migrator.register("v3-digests", "ALTER TABLE signedOut ADD COLUMN digested INTEGER NOT NULL DEFAULT 0")
        migrator.register("v4-erasures", Erasure.postgresTable)
        migrator.register("v5-idempotency-owners", IdempotencyTable.postgresOwners)
        return migrator
    }

    func revoke(id: String, until: Date) throws {
        let (end, now) = (until.timeIntervalSince1970, Date().timeIntervalSince1970)
        try database.write(isolation: .readCommitted) { session in
            _ = try session.execute("DELETE FROM revokedTokens WHERE until < \(now)")
            guard try session.value(Int.self, "SELECT COUNT(*)::BIGINT FROM revokedTokens") ?? 0 < maximumRevokedTokens else {
                throw CanopyError(.tooLarge, "\(maximumRevokedTokens) tokens are revoked already; sign people out everywhere instead (--user)")
            }
            _ = try session.execute(
                "INSERT INTO revokedTokens VALUES (\(id), \(end)) ON CONFLICT (jti) DO UPDATE SET until = GREATEST(revokedTokens.until, EXCLUDED.until)")
            _ = try session.execute("UPDATE revocationMeta SET value = value + 1 WHERE key = 'generation'")
        }
    }

    func signOut(digest: String, before: Date, erasure: Bool) throws {
        let at = before.timeIntervalSince1970.rounded(.down)
        try database.write(isolation: .readCommitted) { session in
            _ = try session.execute(
                "INSERT INTO signedOut VALUES (\(digest), \(at), 1) ON CONFLICT (principal) DO UPDATE SET before = GREATEST(signedOut.before, EXCLUDED.before)")
            if erasure { _ = try session.execute("INSERT INTO erasures VALUES (\(digest), \(at)) ON CONFLICT (digest) DO NOTHING") }
            _ = try session.execute("UPDATE revocationMeta SET value = value + 1 WHERE key = 'generation'")
        }
    }

    func erasures() throws -> [Erasure] {
        try database.read { session in
            try session.rows("SELECT digest, at FROM erasures ORDER BY at, digest").map {
                Erasure(digest: try $0.column("digest").decode(String.self), at: Date(timeIntervalSince1970: try $0.column("at").decode(Double.self)))
            }
        }
    }

    func digestLegacySignOuts(_ digest: SignOutDigest) throws {
        guard try database.statement({ session in try session.value(Bool.self, "SELECT EXISTS (SELECT 1 FROM signedOut WHERE digested = 0)") ?? false }) else {
            return
        }
        try database.write(isolation: .readCommitted) { session in
            let legacy = try session.rows("SELECT principal, before FROM signedOut WHERE digested = 0 FOR UPDATE")
            guard !legacy.isEmpty else { return }
            for row in legacy {
                let person = try row.column("principal").decode(String.self), at = try row.column("before").decode(Double.self)
                _ = try session.execute("DELETE FROM signedOut WHERE principal = \(person)")
                _ = try session.execute(
                    "INSERT INTO signedOut VALUES (\(digest.record(person)), \(at), 1) ON CONFLICT (principal) DO UPDATE SET before = GREATEST(signedOut.before, EXCLUDED.before)"
                )
            }
            _ = try session.execute("UPDATE revocationMeta SET value = value + 1 WHERE key = 'generation'")
        }
        eraseResidue()
    }

    func load(now: Date) throws -> Revocations {
        let at = now.timeIntervalSince1970
        return try database.read { session in
            var revocations = Revocations()
            for row in try session.rows("SELECT jti, until FROM revokedTokens WHERE until >= \(at)") {
                revocations.tokens[try row.column("jti").decode(String.self)] = Date(timeIntervalSince1970: try row.column("until").decode(Double.self))
            }
            for row in try session.rows("SELECT principal, before FROM signedOut") {
                revocations.signedOut[try row.column("principal").decode(String.self)] = Date(
                    timeIntervalSince1970: try row.column("before").decode(Double.self))
            }
            return revocations
        }
    }

    func generation() throws -> Int64 {
        try database.statement { session in try session.value(Int64.self, "SELECT value FROM revocationMeta WHERE key = 'generation'") ?? 0 }
    }
}

/// Opens canopy-api's store: PostgreSQL when `postgres` names one, else SQLite in `directory`.
/// `idempotencyLimits` bounds what each person's keys hold.
public func openAPIStore(
    directory: URL, postgres: PostgresSettings?, logger: Logger,
    idempotencyLimits: IdempotencyLimits = IdempotencyLimits()
) async throws -> any APIStoring {
    if let postgres {
        return try await PostgresAPIStore.open(
            url: postgres.url, poolSize: min(postgres.poolSize, 2), waitingUpTo: postgres.wait, logger: logger, idempotencyLimits: idempotencyLimits)
    }
    if directory.lastPathComponent == CanopyAPIStore.directoryName {
        try CanopyAPIStore.adoptFormerStore(in: directory.deletingLastPathComponent())
    }
    return try SQLiteAPIStore(path: directory.appendingPathComponent(CanopyAPIStore.fileName).path, idempotencyLimits: idempotencyLimits)
}

/// Where canopy-api keeps its SQLite store in a data directory: `<data-dir>/api/api.sqlite`.
public enum CanopyAPIStore {
    /// Its folder in a data directory.
    public static let directoryName = "api"
    /// The name the edge had before it was `api` (`canopy-batch`, `<data-dir>/batch/batch.sqlite`,
    /// the PostgreSQL store `batch`).
    public static let formerName = "batch"
    /// The store's file in its folder.
    public static let fileName = "\(directoryName).sqlite"
    /// Where a data directory or a backup made before the rename has it.
    public static let formerPath = "\(formerName)/\(formerName).sqlite"

    /// Moves a store kept under the former name into place, once (``StoreFile/adopt(formerName:as:in:)``).
    public static func adoptFormerStore(in dataDirectory: URL) throws {
        try StoreFile.adopt(formerName: formerName, as: directoryName, in: dataDirectory)
    }
}

/// Everyone the stack's PostgreSQL holds data of, when `store` is canopy-api's store in it
/// (every store of the stack shares the database), or nil for SQLite (each store a file).
public func peopleInSharedDatabase(_ store: any APIStoring) throws -> Set<String>? {
    guard let postgres = store as? PostgresAPIStore else { return nil }
    return try StoreOwners.people(in: postgres.database)
}

/// What `canopy migrate` moves of canopy-api's store.
public let apiStoreImport = StoreImport(
    store: CanopyAPIStore.directoryName, migrator: PostgresAPIStore.migrator,
    tables: [
        .init("revokedTokens", key: ["jti"]), .init("signedOut", key: ["principal"]), .init("erasures", key: ["digest"]),
        .init("revocationMeta", key: ["key"], seeded: true),
        .init("idempotencyKeys", key: ["person", "route", "key"]), .init("idempotencyOwners", key: ["person"]),
    ])

extension Erasure {
    /// The erasures table: a digest per account deleted, the second of its deletion.
    static let sqliteTable = "CREATE TABLE erasures (digest TEXT PRIMARY KEY, at DOUBLE NOT NULL)"
    static let postgresTable = "CREATE TABLE erasures (digest TEXT PRIMARY KEY, at DOUBLE PRECISION NOT NULL)"
}
