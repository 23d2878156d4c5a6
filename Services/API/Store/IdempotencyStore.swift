import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation
import GRDB
import PostgresNIO
import Synchronization

/// The `idempotencyKeys` table of canopy-api's store (migration v2 of both), one row per
/// person, route and key. `answered` 0 is a request running, held by `holder` until
/// `leaseUntil`; 1 is done, with its answer (`status`, `headers` as JSON `[[name, value]]`,
/// `body`; no body when it was too large to keep). A row past `expiresAt` counts as gone
/// (a claim takes it over) and is deleted by the next sweep.
///
/// `idempotencyOwners` (migration v5) keeps each person's count of rows and bytes of kept
/// answers, changed in the same statement or transaction as their rows, so a claim knows
/// whether its person is at their bound without counting their keys.
enum IdempotencyTable {
    static let sqlite = """
        CREATE TABLE idempotencyKeys (
            person TEXT NOT NULL, route TEXT NOT NULL, key TEXT NOT NULL,
            fingerprint BLOB NOT NULL, holder TEXT, leaseUntil DOUBLE,
            answered INTEGER NOT NULL DEFAULT 0, status INTEGER, headers TEXT, body BLOB, bytes INTEGER NOT NULL DEFAULT 0,
            createdAt DOUBLE NOT NULL, expiresAt DOUBLE NOT NULL,
            PRIMARY KEY (person, route, key));
        CREATE INDEX idempotencyKeysByExpiry ON idempotencyKeys (expiresAt);
        CREATE INDEX idempotencyKeysByPerson ON idempotencyKeys (person, expiresAt, answered, bytes);
        """
    static let postgresTable = """
        CREATE TABLE idempotencyKeys (
            person TEXT NOT NULL, route TEXT NOT NULL, key TEXT NOT NULL,
            fingerprint BYTEA NOT NULL, holder TEXT, leaseUntil DOUBLE PRECISION,
            answered INTEGER NOT NULL DEFAULT 0, status INTEGER, headers TEXT, body BYTEA, bytes BIGINT NOT NULL DEFAULT 0,
            createdAt DOUBLE PRECISION NOT NULL, expiresAt DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (person, route, key))
        """
    static let postgresByExpiry = "CREATE INDEX idempotencyKeysByExpiry ON idempotencyKeys (expiresAt)"
    static let postgresByPerson = "CREATE INDEX idempotencyKeysByPerson ON idempotencyKeys (person, expiresAt, answered, bytes)"

    /// Migration v5: the per-person counts, filled from the keys already kept; the index of a
    /// person's done keys, oldest first (what goes when they are at their bound) in place of
    /// the index of all their keys (counting them is no longer done).
    static let sqliteOwners = """
        CREATE TABLE idempotencyOwners (person TEXT PRIMARY KEY, keys INTEGER NOT NULL, bytes INTEGER NOT NULL) WITHOUT ROWID;
        INSERT INTO idempotencyOwners SELECT person, COUNT(*), COALESCE(SUM(bytes), 0) FROM idempotencyKeys GROUP BY person;
        DROP INDEX idempotencyKeysByPerson;
        CREATE INDEX idempotencyKeysDone ON idempotencyKeys (person, expiresAt) WHERE answered = 1;
        """
    static let postgresOwners = [
        // Writers of keys wait for the counts to be filled (the migration's transaction).
        "LOCK TABLE idempotencyKeys IN SHARE ROW EXCLUSIVE MODE",
        "CREATE TABLE idempotencyOwners (person TEXT PRIMARY KEY, keys BIGINT NOT NULL, bytes BIGINT NOT NULL)",
        "INSERT INTO idempotencyOwners SELECT person, COUNT(*), COALESCE(SUM(bytes), 0) FROM idempotencyKeys GROUP BY person",
        "DROP INDEX idempotencyKeysByPerson",
        "CREATE INDEX idempotencyKeysDone ON idempotencyKeys (person, expiresAt) WHERE answered = 1",
    ]

    /// How often a store deletes every expired row (with the first batch of writes that long
    /// after the last sweep; until then an expired key counts as gone for a claim, and
    /// toward its person's bound).
    static let sweepInterval: TimeInterval = 60

    static let encoder = JSONEncoder()
    static let decoder = JSONDecoder()

    static func encode(_ headers: [[String]]) -> String {
        String(decoding: (try? encoder.encode(headers)) ?? Data("[]".utf8), as: UTF8.self)
    }

    static func decodeHeaders(_ text: String?) -> [[String]] {
        text.flatMap { try? decoder.decode([[String]].self, from: Data($0.utf8)) } ?? []
    }

    /// The record a row holds: none when it expired (`expiresAt` before `now`).
    static func record(
        fingerprint: Data, holder: String?, leaseUntil: Double?, answered: Bool, status: Int?, headers: String?, body: Data?, expiresAt: Double,
        now: Double
    ) -> IdempotencyRecord? {
        guard expiresAt >= now else { return nil }
        var answer: KeptAnswer?
        if answered, let status, let body { answer = KeptAnswer(status: status, headers: decodeHeaders(headers), body: Array(body)) }
        return IdempotencyRecord(
            fingerprint: Array(fingerprint), holder: holder, leaseUntil: leaseUntil.map(Date.init(timeIntervalSince1970:)),
            answer: answer, answered: answered)
    }

    /// The oldest done keys to drop so that a person keeps `limit` at most, given each done
    /// key's size, oldest first (`sizes`), and what they hold in all (`total`).
    static func oldestToDrop(_ sizes: [(route: String, key: String, bytes: Int)], total: Int, limit: Int) -> [(route: String, key: String)] {
        var total = total
        var dropped: [(route: String, key: String)] = []
        for entry in sizes where total > limit {
            total -= entry.bytes
            dropped.append((entry.route, entry.key))
        }
        return dropped
    }
}

/// When a store last deleted every expired key.
final class SweepClock: Sendable {
    private let last = Mutex<TimeInterval>(0)

    /// Whether a sweep is due at `now` (and, if so, counts it as made).
    func due(_ now: Date) -> Bool {
        last.withLock { last in
            guard now.timeIntervalSince1970 - last >= IdempotencyTable.sweepInterval else { return false }
            last = now.timeIntervalSince1970
            return true
        }
    }
}

/// A write of a key that waits for its batch (``GroupCommit``): claims and answers of many
/// requests go together, so under load a request's answer and other requests' claims share
/// one transaction (SQLite) or one round trip (PostgreSQL).
enum KeyWrite: Sendable {
    case claim(IdempotencyClaim, now: Date)
    case answer(IdempotencyClaim, KeptAnswer?, now: Date)

    var now: Date {
        switch self {
        case .claim(_, let now), .answer(_, _, let now): now
        }
    }
}

/// What a ``KeyWrite`` did: a claim's decision, or an answer kept.
enum KeyWritten: Sendable {
    case decided(IdempotencyDecision)
    case answered

    /// The claim's decision (an answer's write never asks).
    var decision: IdempotencyDecision {
        guard case .decided(let decision) = self else { return .running(retryAfter: 1) }
        return decision
    }
}

/// A store whose claims and answers of keys go in batches (``GroupCommit``): each writes a
/// batch its own way (``write(_:sweepingBefore:)``), the rest is this.
protocol KeyWriteBatches: IdempotencyStoring {
    var keyWrites: GroupCommit<KeyWrite, KeyWritten> { get }
    var sweep: SweepClock { get }
    /// Writes `batch`, first deleting every key expired before `sweep` when it is given.
    func write(_ batch: [KeyWrite], sweepingBefore sweep: Date?) async throws -> [Result<KeyWritten, any Error>]
}

extension KeyWriteBatches {
    func claim(_ claim: IdempotencyClaim, now: Date) async throws -> IdempotencyDecision {
        try await write(.claim(claim, now: now)).decision
    }

    func answer(_ claim: IdempotencyClaim, with answer: KeptAnswer?, now: Date) async throws {
        _ = try await write(.answer(claim, answer, now: now))
    }

    /// `key` in the next batch (with a sweep of expired keys when one is due).
    private func write(_ key: KeyWrite) async throws -> KeyWritten {
        try await keyWrites.submit(key) { [self] batch in
            let latest = batch.map(\.now).max() ?? key.now
            return try await write(batch, sweepingBefore: sweep.due(latest) ? latest : nil)
        }
    }
}

// MARK: - SQLite

// Claims and answers are written in batches (``GroupCommit``): what many requests at once
// ask for in one transaction. Every statement is prepared once per connection
// (`cachedStatement`): preparing one is most of what a statement this small costs. A claim of
// a new key is two statements (the key, its person's count), keeping its answer two more (the
// row, its person's bytes); what a person holds is read from their count, never counted.

extension SQLiteAPIStore: KeyWriteBatches {
    /// One transaction for the batch (a write that fails fails its batch, which changes
    /// nothing; its callers are told, and may send again).
    func write(_ batch: [KeyWrite], sweepingBefore sweep: Date?) async throws -> [Result<KeyWritten, any Error>] {
        try await database.tracedWrite { [idempotencyLimits] db in
            if let sweep { try Self.deleteExpired(db, before: sweep.timeIntervalSince1970) }
            return try batch.map { key -> Result<KeyWritten, any Error> in
                switch key {
                case .claim(let claim, let now): return .success(.decided(try Self.claim(claim, now: now, limits: idempotencyLimits, db)))
                case .answer(let claim, let answer, let now):
                    try Self.answer(claim, with: answer, now: now, limit: idempotencyLimits.bytesPerPerson, db)
                    return .success(.answered)
                }
            }
        }
    }

    /// One claim of a batch.
    private static func claim(_ claim: IdempotencyClaim, now: Date, limits: IdempotencyLimits, _ db: Database) throws -> IdempotencyDecision {
        let at = now.timeIntervalSince1970
        let (lease, expires) = (at + claim.lease, at + IdempotencyKeys.lifetime)
        try db.cachedStatement(
            sql: """
                INSERT INTO idempotencyKeys (person, route, key, fingerprint, holder, leaseUntil, answered, createdAt, expiresAt)
                VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?) ON CONFLICT (person, route, key) DO NOTHING
                """
        ).execute(arguments: [claim.person, claim.route, claim.key, Data(claim.fingerprint), claim.holder, lease, at, expires])
        if db.changesCount == 1 {
            let held =
                try Int.fetchOne(
                    db.cachedStatement(
                        sql: "INSERT INTO idempotencyOwners VALUES (?, 1, 0) ON CONFLICT (person) DO UPDATE SET keys = keys + 1 RETURNING keys"),
                    arguments: [claim.person]) ?? 1
            if held > limits.keysPerPerson { try dropOldest(db, person: claim.person, count: held - limits.keysPerPerson) }
            return .proceed
        }
        guard
            let row = try Row.fetchOne(
                db.cachedStatement(
                    sql: """
                        SELECT fingerprint, holder, leaseUntil, answered, status, headers, body, bytes, expiresAt FROM idempotencyKeys
                        WHERE person = ? AND route = ? AND key = ?
                        """), arguments: [claim.person, claim.route, claim.key])
        else { return .running(retryAfter: 1) }
        let record = IdempotencyTable.record(
            fingerprint: row["fingerprint"], holder: row["holder"], leaseUntil: row["leaseUntil"], answered: row["answered"] as Int != 0,
            status: row["status"], headers: row["headers"], body: row["body"], expiresAt: row["expiresAt"], now: at)
        let decision = IdempotencyDecision.decide(record, for: claim, now: now)
        guard decision == .proceed else { return decision }
        if record == nil {
            // Expired: the key starts again for this request (its count stays, its bytes go).
            try db.cachedStatement(
                sql: """
                    UPDATE idempotencyKeys SET fingerprint = ?, holder = ?, leaseUntil = ?, answered = 0, status = NULL, headers = NULL, body = NULL,
                        bytes = 0, createdAt = ?, expiresAt = ? WHERE person = ? AND route = ? AND key = ?
                    """
            ).execute(arguments: [Data(claim.fingerprint), claim.holder, lease, at, expires, claim.person, claim.route, claim.key])
            try db.cachedStatement(sql: "UPDATE idempotencyOwners SET bytes = bytes - ? WHERE person = ?").execute(arguments: [
                row["bytes"] as Int, claim.person,
            ])
        } else {
            try db.cachedStatement(sql: "UPDATE idempotencyKeys SET holder = ?, leaseUntil = ? WHERE person = ? AND route = ? AND key = ?")
                .execute(arguments: [claim.holder, lease, claim.person, claim.route, claim.key])
        }
        return decision
    }

    /// One answer of a batch.
    private static func answer(_ claim: IdempotencyClaim, with answer: KeptAnswer?, now: Date, limit: Int, _ db: Database) throws {
        let bytes = answer?.body.count ?? 0
        // A held row keeps no answer yet: its bytes are 0 (a claim clears them).
        try db.cachedStatement(
            sql: """
                UPDATE idempotencyKeys SET holder = NULL, leaseUntil = NULL, answered = 1, status = ?, headers = ?, body = ?, bytes = ?, expiresAt = ?
                WHERE person = ? AND route = ? AND key = ? AND holder = ?
                """
        ).execute(arguments: [
            answer?.status, answer.map { IdempotencyTable.encode($0.headers) }, answer.map { Data($0.body) }, bytes,
            now.timeIntervalSince1970 + IdempotencyKeys.lifetime, claim.person, claim.route, claim.key, claim.holder,
        ])
        guard db.changesCount == 1, bytes > 0 else { return }
        let total =
            try Int.fetchOne(
                db.cachedStatement(sql: "UPDATE idempotencyOwners SET bytes = bytes + ? WHERE person = ? RETURNING bytes"),
                arguments: [bytes, claim.person]) ?? 0
        guard total > limit else { return }
        // Past the person's bytes: their oldest kept answers go, as many as must.
        var sizes: [(route: String, key: String, bytes: Int)] = []
        var left = total
        let rows = try Row.fetchCursor(
            db.cachedStatement(
                sql: """
                    SELECT route, key, bytes FROM idempotencyKeys WHERE person = ? AND answered = 1 AND bytes > 0 AND NOT (route = ? AND key = ?)
                    ORDER BY expiresAt
                    """), arguments: [claim.person, claim.route, claim.key])
        while left > limit, let row = try rows.next() {
            sizes.append((row["route"], row["key"], row["bytes"]))
            left -= sizes[sizes.count - 1].bytes
        }
        for (route, key) in IdempotencyTable.oldestToDrop(sizes, total: total, limit: limit) {
            try db.cachedStatement(sql: "DELETE FROM idempotencyKeys WHERE person = ? AND route = ? AND key = ?").execute(arguments: [
                claim.person, route, key,
            ])
        }
        try db.cachedStatement(sql: "UPDATE idempotencyOwners SET keys = keys - ?, bytes = bytes - ? WHERE person = ?").execute(arguments: [
            sizes.count, total - left, claim.person,
        ])
    }

    func release(_ claim: IdempotencyClaim) async throws {
        try await database.tracedWrite { db in
            try db.cachedStatement(sql: "DELETE FROM idempotencyKeys WHERE person = ? AND route = ? AND key = ? AND holder = ?")
                .execute(arguments: [claim.person, claim.route, claim.key, claim.holder])
            guard db.changesCount == 1 else { return }
            try db.cachedStatement(sql: "UPDATE idempotencyOwners SET keys = keys - 1 WHERE person = ?").execute(arguments: [claim.person])
        }
    }

    func forgetKeys(of person: String) async throws {
        try await database.tracedWrite { db in
            try db.cachedStatement(sql: "DELETE FROM idempotencyKeys WHERE person = ?").execute(arguments: [person])
            try db.cachedStatement(sql: "DELETE FROM idempotencyOwners WHERE person = ?").execute(arguments: [person])
        }
    }

    /// The `count` oldest done keys of `person` go (they are past their bound of keys).
    private static func dropOldest(_ db: Database, person: String, count: Int) throws {
        let bytes = try Int.fetchAll(
            db.cachedStatement(
                sql: """
                    DELETE FROM idempotencyKeys WHERE rowid IN
                        (SELECT rowid FROM idempotencyKeys WHERE person = ? AND answered = 1 ORDER BY expiresAt LIMIT ?)
                    RETURNING bytes
                    """), arguments: [person, count])
        try db.cachedStatement(sql: "UPDATE idempotencyOwners SET keys = keys - ?, bytes = bytes - ? WHERE person = ?").execute(arguments: [
            bytes.count, bytes.reduce(0, +), person,
        ])
    }

    /// Every expired key goes, and its person's counts with it.
    private static func deleteExpired(_ db: Database, before at: Double) throws {
        try db.execute(
            sql: """
                UPDATE idempotencyOwners SET keys = keys - gone.count, bytes = bytes - gone.sum
                FROM (SELECT person, COUNT(*) AS count, COALESCE(SUM(bytes), 0) AS sum FROM idempotencyKeys WHERE expiresAt < ? GROUP BY person) AS gone
                WHERE idempotencyOwners.person = gone.person;
                DELETE FROM idempotencyKeys WHERE expiresAt < ?;
                DELETE FROM idempotencyOwners WHERE keys <= 0;
                """, arguments: [at, at])
    }
}

// MARK: - PostgreSQL

// Claims and answers are written in batches (``GroupCommit``), each batch one statement
// outside a transaction (arrays of every request's values, `unnest`): the keys' rows and their
// people's counts change together in one statement (data-modifying `WITH`). Where a claim
// acts on what it read (taking over a key whose holder died, or one that expired) it is made
// on its own and changes the row only as it read it, else it reads again. Run on Dispatch's
// threads (``PostgresStore`` blocks its caller).

extension PostgresAPIStore: KeyWriteBatches {
    /// The batch's answers in one statement, then its claims in another (``answerAll(_:)``,
    /// ``claimAll(_:)``).
    func write(_ batch: [KeyWrite], sweepingBefore sweep: Date?) async throws -> [Result<KeyWritten, any Error>] {
        try await offThePool { [self] in
            if let sweep {
                // Best effort: an expired key counts as gone whether or not it is deleted yet.
                do { try deleteExpired(before: sweep.timeIntervalSince1970) } catch {
                    logger.warning("api.idempotency.sweep.failed", metadata: ["api.error": "\(error)"])
                }
            }
            var claims: [(IdempotencyClaim, Date)] = []
            var answers: [(IdempotencyClaim, KeptAnswer?, Date)] = []
            for key in batch {
                switch key {
                case .claim(let claim, let now): claims.append((claim, now))
                case .answer(let claim, let answer, let now): answers.append((claim, answer, now))
                }
            }
            // Each statement's callers are told its own outcome: answers kept while claims
            // failed are kept.
            let answered = answers.isEmpty ? .success(()) : Result { try answerAll(answers) }
            var decisions: IndexingIterator<[Result<IdempotencyDecision, any Error>]>
            do {
                decisions = (claims.isEmpty ? [] : try claimAll(claims)).makeIterator()
            } catch {
                decisions = Array(repeating: .failure(error), count: claims.count).makeIterator()
            }
            return batch.map { key -> Result<KeyWritten, any Error> in
                guard case .claim = key else { return answered.map { .answered } }
                return decisions.next()?.map(KeyWritten.decided)
                    ?? .failure(PostgresStore.Failure(description: "a claim of the batch was not answered"))
            }
        }
    }

    /// A batch of claims: the new keys among them (most of them) in one statement, with
    /// their people's counts; each other one (a key known already, sent twice in the batch,
    /// or inserted by a claim still running) decided from what that statement read, or
    /// claimed on its own when it acts on the key (``claimAlone(_:now:)``).
    private func claimAll(_ batch: [(IdempotencyClaim, Date)]) throws -> [Result<IdempotencyDecision, any Error>] {
        var results = [Result<IdempotencyDecision, any Error>?](repeating: nil, count: batch.count)
        // Each key once, in one order (person, route, key) whoever writes: two batches at
        // once (two edges) lock the same rows in the same order, never waiting on each other
        // in a circle.
        var seen = Set<[String]>()
        var alone: [Int] = []
        var together: [Int] = []
        for (index, (claim, _)) in batch.enumerated() {
            if seen.insert([claim.person, claim.route, claim.key]).inserted { together.append(index) } else { alone.append(index) }
        }
        together.sort {
            [batch[$0].0.person, batch[$0].0.route, batch[$0].0.key].lexicographicallyPrecedes([batch[$1].0.person, batch[$1].0.route, batch[$1].0.key])
        }
        let claims = together.map { batch[$0] }
        let (persons, routes, keys) = (claims.map(\.0.person), claims.map(\.0.route), claims.map(\.0.key))
        let (fingerprints, holders) = (claims.map { ByteBuffer(bytes: $0.0.fingerprint) }, claims.map(\.0.holder))
        let ats = claims.map { $0.1.timeIntervalSince1970 }
        let leases = claims.map { $0.1.timeIntervalSince1970 + $0.0.lease }
        let expires = ats.map { $0 + IdempotencyKeys.lifetime }
        let rows = try database.statement { session in
            try session.rows(
                """
                WITH input AS (
                    SELECT * FROM unnest(\(persons), \(routes), \(keys), \(fingerprints), \(holders), \(leases), \(ats), \(expires)) WITH ORDINALITY
                        AS t(person, route, key, fingerprint, holder, leaseUntil, createdAt, expiresAt, n)),
                inserted AS (
                    INSERT INTO idempotencyKeys (person, route, key, fingerprint, holder, leaseUntil, answered, createdAt, expiresAt)
                    SELECT person, route, key, fingerprint, holder, leaseUntil, 0, createdAt, expiresAt FROM input ORDER BY n
                    ON CONFLICT (person, route, key) DO NOTHING RETURNING person, route, key),
                counted AS (
                    INSERT INTO idempotencyOwners SELECT person, COUNT(*), 0 FROM inserted GROUP BY person ORDER BY person
                    ON CONFLICT (person) DO UPDATE SET keys = idempotencyOwners.keys + EXCLUDED.keys RETURNING person, keys)
                SELECT input.n, inserted.key IS NOT NULL AS new, counted.keys AS held, k.fingerprint, k.holder, k.leaseUntil, k.answered, k.status,
                    k.headers, k.body, k.expiresAt
                FROM input
                LEFT JOIN inserted ON inserted.person = input.person AND inserted.route = input.route AND inserted.key = input.key
                LEFT JOIN counted ON counted.person = input.person
                LEFT JOIN idempotencyKeys k ON k.person = input.person AND k.route = input.route AND k.key = input.key
                """)
        }
        var held: [String: Int] = [:]
        for row in rows {
            let index = together[try row.column("n").decode(Int.self) - 1]
            let (claim, now) = batch[index]
            if try row.column("new").decode(Bool.self) {
                held[claim.person] = try row.column("held").decode(Int?.self)
                results[index] = .success(.proceed)
                continue
            }
            // Known already: decided here, unless it is this request's to take over (or the row
            // was inserted by a claim that had not committed when the statement began).
            guard let found = try row.column("fingerprint").decode(Data?.self) else {
                alone.append(index)
                continue
            }
            let record = IdempotencyTable.record(
                fingerprint: found, holder: try row.column("holder").decode(String?.self), leaseUntil: try row.column("leaseUntil").decode(Double?.self),
                answered: try row.column("answered").decode(Int.self) != 0, status: try row.column("status").decode(Int?.self),
                headers: try row.column("headers").decode(String?.self), body: try row.column("body").decode(Data?.self),
                expiresAt: try row.column("expiresAt").decode(Double.self), now: now.timeIntervalSince1970)
            let decision = IdempotencyDecision.decide(record, for: claim, now: now)
            if decision == .proceed { alone.append(index) } else { results[index] = .success(decision) }
        }
        // The claims are committed: a trim that fails is told to the log, not to them (the
        // person's next claim trims again).
        for (person, count) in held.sorted(by: { $0.key < $1.key }) where count > idempotencyLimits.keysPerPerson {
            do {
                try dropOldest(person: person, count: count - idempotencyLimits.keysPerPerson)
            } catch {
                logger.warning("api.idempotency.trim.failed", metadata: ["api.error": "\(error)"])
            }
        }
        for index in alone.sorted() {
            results[index] = Result { try claimAlone(batch[index].0, now: batch[index].1) }
        }
        return results.map { $0 ?? .failure(PostgresStore.Failure(description: "a claim of the batch was not answered")) }
    }

    /// One claim on its own, read again when another claim changed the key meanwhile.
    private func claimAlone(_ claim: IdempotencyClaim, now: Date) throws -> IdempotencyDecision {
        for _ in 0..<3 {
            if let decision = try claimOnce(claim, now: now) { return decision }
        }
        return .running(retryAfter: 1)
    }

    /// One attempt of ``claim(_:now:)``: nil when another claim changed the key first.
    private func claimOnce(_ claim: IdempotencyClaim, now: Date) throws -> IdempotencyDecision? {
        let at = now.timeIntervalSince1970
        let (person, route, key, holder) = (claim.person, claim.route, claim.key, claim.holder)
        let (fingerprint, lease, expires) = (Data(claim.fingerprint), at + claim.lease, at + IdempotencyKeys.lifetime)
        // The insert, and when it is new its person's count; else the row as it was (a row
        // inserted by a claim still running is seen by neither: nil, read again).
        guard
            let row = try database.statement({ session in
                try session.row(
                    """
                    WITH inserted AS (
                        INSERT INTO idempotencyKeys (person, route, key, fingerprint, holder, leaseUntil, answered, createdAt, expiresAt)
                        VALUES (\(person), \(route), \(key), \(fingerprint), \(holder), \(lease), 0, \(at), \(expires))
                        ON CONFLICT (person, route, key) DO NOTHING RETURNING person),
                    counted AS (
                        INSERT INTO idempotencyOwners SELECT person, 1, 0 FROM inserted
                        ON CONFLICT (person) DO UPDATE SET keys = idempotencyOwners.keys + 1 RETURNING keys)
                    SELECT (SELECT keys FROM counted) AS held, k.fingerprint, k.holder, k.leaseUntil, k.answered, k.status, k.headers, k.body, k.bytes,
                        k.expiresAt
                    FROM (SELECT 1) AS one LEFT JOIN idempotencyKeys k ON k.person = \(person) AND k.route = \(route) AND k.key = \(key)
                    """)
            })
        else { return nil }
        if let held = try row.column("held").decode(Int?.self) {
            if held > idempotencyLimits.keysPerPerson { try dropOldest(person: person, count: held - idempotencyLimits.keysPerPerson) }
            return .proceed
        }
        guard let found = try row.column("fingerprint").decode(Data?.self) else { return nil }
        let (oldHolder, oldLease) = (try row.column("holder").decode(String?.self), try row.column("leaseUntil").decode(Double?.self))
        let (oldBytes, oldExpires) = (try row.column("bytes").decode(Int.self), try row.column("expiresAt").decode(Double.self))
        let answered = try row.column("answered").decode(Int.self)
        let record = IdempotencyTable.record(
            fingerprint: found, holder: oldHolder, leaseUntil: oldLease, answered: answered != 0, status: try row.column("status").decode(Int?.self),
            headers: try row.column("headers").decode(String?.self), body: try row.column("body").decode(Data?.self), expiresAt: oldExpires, now: at)
        let decision = IdempotencyDecision.decide(record, for: claim, now: now)
        guard decision == .proceed else { return decision }
        let taken = try database.statement { session -> Int in
            if record == nil {
                // Expired: the key starts again for this request (its count stays, its bytes go).
                return try session.value(
                    Int.self,
                    """
                    WITH reset AS (
                        UPDATE idempotencyKeys SET fingerprint = \(fingerprint), holder = \(holder), leaseUntil = \(lease), answered = 0, status = NULL,
                            headers = NULL, body = NULL, bytes = 0, createdAt = \(at), expiresAt = \(expires)
                        WHERE person = \(person) AND route = \(route) AND key = \(key) AND expiresAt = \(oldExpires) AND answered = \(answered)
                            AND holder IS NOT DISTINCT FROM \(oldHolder) AND leaseUntil IS NOT DISTINCT FROM \(oldLease)
                        RETURNING person),
                    counted AS (UPDATE idempotencyOwners SET bytes = bytes - \(oldBytes) WHERE person IN (SELECT person FROM reset) RETURNING 1)
                    SELECT COUNT(*)::BIGINT FROM reset
                    """) ?? 0
            }
            // Its holder's lease ended (it died mid-request): this request holds it now.
            return try session.execute(
                """
                UPDATE idempotencyKeys SET holder = \(holder), leaseUntil = \(lease)
                WHERE person = \(person) AND route = \(route) AND key = \(key) AND answered = 0
                    AND holder IS NOT DISTINCT FROM \(oldHolder) AND leaseUntil IS NOT DISTINCT FROM \(oldLease)
                """)
        }
        return taken == 1 ? decision : nil
    }

    /// A batch of answers in one statement, with their people's bytes (a held row keeps no
    /// answer yet: its bytes are 0, a claim clears them); then, for each person past their
    /// bytes, their oldest kept answers go, as many as must (each goes when what is kept
    /// after it still passes the bound).
    private func answerAll(_ batch: [(IdempotencyClaim, KeptAnswer?, Date)]) throws {
        let (persons, routes, keys, holders) = (batch.map(\.0.person), batch.map(\.0.route), batch.map(\.0.key), batch.map(\.0.holder))
        let kept = batch.map { $0.1 != nil }
        let statuses = batch.map { $0.1?.status ?? 0 }
        let headers = batch.map { $0.1.map { IdempotencyTable.encode($0.headers) } ?? "" }
        let bodies = batch.map { ByteBuffer(bytes: $0.1?.body ?? []) }
        let bytes = batch.map { $0.1?.body.count ?? 0 }
        let expires = batch.map { $0.2.timeIntervalSince1970 + IdempotencyKeys.lifetime }
        let totals = try database.statement { session in
            try session.rows(
                """
                WITH input AS (
                    SELECT * FROM unnest(\(persons), \(routes), \(keys), \(holders), \(kept), \(statuses), \(headers), \(bodies), \(bytes), \(expires))
                        AS t(person, route, key, holder, kept, status, headers, body, bytes, expiresAt)),
                done AS (
                    UPDATE idempotencyKeys k SET holder = NULL, leaseUntil = NULL, answered = 1, status = CASE WHEN input.kept THEN input.status END,
                        headers = CASE WHEN input.kept THEN input.headers END, body = CASE WHEN input.kept THEN input.body END, bytes = input.bytes,
                        expiresAt = input.expiresAt
                    FROM input WHERE k.person = input.person AND k.route = input.route AND k.key = input.key AND k.holder = input.holder
                    RETURNING k.person, k.bytes)
                INSERT INTO idempotencyOwners SELECT person, 0, SUM(bytes) FROM done GROUP BY person HAVING SUM(bytes) > 0 ORDER BY person
                ON CONFLICT (person) DO UPDATE SET bytes = idempotencyOwners.bytes + EXCLUDED.bytes RETURNING person, bytes
                """)
        }
        let limit = idempotencyLimits.bytesPerPerson
        for row in totals {
            let (person, total) = (try row.column("person").decode(String.self), try row.column("bytes").decode(Int.self))
            guard total > limit else { continue }
            try database.statement { session in
                try session.execute(
                    """
                    WITH kept AS (
                        SELECT route, key, bytes, expiresAt, SUM(bytes) OVER (ORDER BY expiresAt, route, key) AS through FROM idempotencyKeys
                        WHERE person = \(person) AND answered = 1 AND bytes > 0),
                    gone AS (
                        DELETE FROM idempotencyKeys k USING kept WHERE k.person = \(person) AND k.route = kept.route AND k.key = kept.key
                            AND kept.through - kept.bytes < \(total - limit) AND k.answered = 1 AND k.expiresAt = kept.expiresAt
                        RETURNING k.bytes)
                    UPDATE idempotencyOwners SET keys = keys - (SELECT COUNT(*) FROM gone), bytes = bytes - (SELECT COALESCE(SUM(bytes), 0) FROM gone)
                    WHERE person = \(person)
                    """)
            }
        }
    }

    func release(_ claim: IdempotencyClaim) async throws {
        let (person, route, key, holder) = (claim.person, claim.route, claim.key, claim.holder)
        try await offThePool { [self] in
            try database.statement { session in
                try session.execute(
                    """
                    WITH gone AS (DELETE FROM idempotencyKeys WHERE person = \(person) AND route = \(route) AND key = \(key) AND holder = \(holder) RETURNING 1)
                    UPDATE idempotencyOwners SET keys = keys - (SELECT COUNT(*) FROM gone) WHERE person = \(person) AND EXISTS (SELECT 1 FROM gone)
                    """)
            }
        }
    }

    func forgetKeys(of person: String) async throws {
        try await offThePool { [self] in
            try database.statement { session in
                try session.execute(
                    """
                    WITH gone AS (DELETE FROM idempotencyKeys WHERE person = \(person) RETURNING bytes)
                    UPDATE idempotencyOwners SET keys = keys - (SELECT COUNT(*) FROM gone), bytes = bytes - (SELECT COALESCE(SUM(bytes), 0) FROM gone)
                    WHERE person = \(person)
                    """)
            }
            // Gone when nothing is left (a claim that came meanwhile keeps its count).
            try database.statement { session in try session.execute("DELETE FROM idempotencyOwners WHERE person = \(person) AND keys <= 0") }
        }
    }

    /// The `count` oldest done keys of `person` go (they are past their bound of keys). Each
    /// is deleted only as it was read (done, its expiry the same): one that another edge took
    /// over meanwhile (it had expired) runs again and stays; one another claim dropped
    /// meanwhile is not counted twice.
    private func dropOldest(person: String, count: Int) throws {
        try database.statement { session in
            try session.execute(
                """
                WITH oldest AS (
                    SELECT route, key, expiresAt FROM idempotencyKeys WHERE person = \(person) AND answered = 1 ORDER BY expiresAt LIMIT \(count)),
                gone AS (
                    DELETE FROM idempotencyKeys k USING oldest
                    WHERE k.person = \(person) AND k.route = oldest.route AND k.key = oldest.key AND k.answered = 1 AND k.expiresAt = oldest.expiresAt
                    RETURNING k.bytes)
                UPDATE idempotencyOwners SET keys = keys - (SELECT COUNT(*) FROM gone), bytes = bytes - (SELECT COALESCE(SUM(bytes), 0) FROM gone)
                WHERE person = \(person)
                """)
        }
    }

    /// Every expired key goes, and its person's counts with it (one statement), then the
    /// counts of people left with none. Keys another statement holds are left for the next
    /// sweep, and people's counts change in the order of their names after every key is
    /// deleted, as batches change them: a sweep and a batch never wait for each other in a
    /// circle.
    private func deleteExpired(before at: Double) throws {
        try database.statement { session in
            try session.execute(
                """
                WITH gone AS (
                    DELETE FROM idempotencyKeys WHERE (person, route, key) IN
                        (SELECT person, route, key FROM idempotencyKeys WHERE expiresAt < \(at) FOR UPDATE SKIP LOCKED)
                    RETURNING person, bytes)
                INSERT INTO idempotencyOwners SELECT person, -COUNT(*), -COALESCE(SUM(bytes), 0) FROM gone GROUP BY person ORDER BY person
                ON CONFLICT (person) DO UPDATE SET keys = idempotencyOwners.keys + EXCLUDED.keys, bytes = idempotencyOwners.bytes + EXCLUDED.bytes
                """)
        }
        try database.statement { session in
            try session.execute(
                "DELETE FROM idempotencyOwners WHERE person IN (SELECT person FROM idempotencyOwners WHERE keys <= 0 FOR UPDATE SKIP LOCKED)")
        }
    }
}
