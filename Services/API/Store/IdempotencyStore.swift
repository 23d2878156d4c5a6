import CanopyMessages
import CanopyStore
import Foundation
import GRDB
import PostgresNIO
import Synchronization

/// The `idempotencyKeys` table of canopy-api's store (migration v2 of both), one row per
/// person, route and key. `answered` 0 is a request running, held by `holder` until
/// `leaseUntil`; 1 is done, with its answer (`status`, `headers` as JSON `[[name, value]]`,
/// `body`; no body when it was too large to keep). Every row goes at `expiresAt`.
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

    /// How often a store deletes every expired row (each claim deletes its person's own).
    static let sweepInterval: TimeInterval = 60

    static let encoder = JSONEncoder()
    static let decoder = JSONDecoder()

    static func encode(_ headers: [[String]]) -> String {
        String(decoding: (try? encoder.encode(headers)) ?? Data("[]".utf8), as: UTF8.self)
    }

    static func decodeHeaders(_ text: String?) -> [[String]] {
        text.flatMap { try? decoder.decode([[String]].self, from: Data($0.utf8)) } ?? []
    }

    /// The record a row holds.
    static func record(fingerprint: Data, holder: String?, leaseUntil: Double?, answered: Bool, status: Int?, headers: String?, body: Data?)
        -> IdempotencyRecord
    {
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

// MARK: - SQLite

// Every statement prepared once per connection (`cachedStatement`): preparing one is most of
// what a statement this small costs. A person's keys are found by (person, expiresAt): their
// expired ones, and the ones to drop past a bound (those that would expire first), in one
// range of the index, which also holds what the bounds count (`answered`, `bytes`): counting
// a person's keys and bytes reads the index alone.

extension SQLiteAPIStore {
    func claim(_ claim: IdempotencyClaim, now: Date) throws -> IdempotencyDecision {
        let at = now.timeIntervalSince1970
        if sweep.due(now) {
            try database.tracedWrite { db in try db.cachedStatement(sql: "DELETE FROM idempotencyKeys WHERE expiresAt < ?").execute(arguments: [at]) }
        }
        return try database.tracedWrite { db in
            try db.cachedStatement(sql: "DELETE FROM idempotencyKeys WHERE person = ? AND expiresAt < ?").execute(arguments: [claim.person, at])
            let row = try Row.fetchOne(
                db.cachedStatement(
                    sql: """
                        SELECT fingerprint, holder, leaseUntil, answered, status, headers, body FROM idempotencyKeys WHERE person = ? AND route = ? AND key = ?
                        """), arguments: [claim.person, claim.route, claim.key])
            let record = row.map { row in
                IdempotencyTable.record(
                    fingerprint: row["fingerprint"], holder: row["holder"], leaseUntil: row["leaseUntil"], answered: row["answered"] as Int != 0,
                    status: row["status"], headers: row["headers"], body: row["body"])
            }
            let decision = IdempotencyDecision.decide(record, for: claim, now: now)
            guard decision == .proceed else { return decision }
            let lease = at + claim.lease
            if record != nil {
                try db.cachedStatement(sql: "UPDATE idempotencyKeys SET holder = ?, leaseUntil = ? WHERE person = ? AND route = ? AND key = ?")
                    .execute(arguments: [claim.holder, lease, claim.person, claim.route, claim.key])
                return decision
            }
            let held = try Int.fetchOne(db.cachedStatement(sql: "SELECT COUNT(*) FROM idempotencyKeys WHERE person = ?"), arguments: [claim.person]) ?? 0
            if held >= idempotencyLimits.keysPerPerson {
                try db.cachedStatement(
                    sql: """
                        DELETE FROM idempotencyKeys WHERE rowid IN
                            (SELECT rowid FROM idempotencyKeys WHERE person = ? AND answered = 1 ORDER BY expiresAt LIMIT ?)
                        """
                ).execute(arguments: [claim.person, held - idempotencyLimits.keysPerPerson + 1])
            }
            try db.cachedStatement(
                sql: """
                    INSERT INTO idempotencyKeys (person, route, key, fingerprint, holder, leaseUntil, answered, createdAt, expiresAt)
                    VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?)
                    """
            ).execute(arguments: [claim.person, claim.route, claim.key, Data(claim.fingerprint), claim.holder, lease, at, at + IdempotencyKeys.lifetime])
            return decision
        }
    }

    func answer(_ claim: IdempotencyClaim, with answer: KeptAnswer?, now: Date) throws {
        let at = now.timeIntervalSince1970
        try database.tracedWrite { db in
            try db.cachedStatement(
                sql: """
                    UPDATE idempotencyKeys SET holder = NULL, leaseUntil = NULL, answered = 1, status = ?, headers = ?, body = ?, bytes = ?, expiresAt = ?
                    WHERE person = ? AND route = ? AND key = ? AND holder = ?
                    """
            ).execute(arguments: [
                answer?.status, answer.map { IdempotencyTable.encode($0.headers) }, answer.map { Data($0.body) }, answer?.body.count ?? 0,
                at + IdempotencyKeys.lifetime, claim.person, claim.route, claim.key, claim.holder,
            ])
            let total =
                try Int.fetchOne(
                    db.cachedStatement(sql: "SELECT COALESCE(SUM(bytes), 0) FROM idempotencyKeys WHERE person = ?"),
                    arguments: [claim.person]) ?? 0
            guard total > idempotencyLimits.bytesPerPerson else { return }
            let sizes = try Row.fetchAll(
                db.cachedStatement(
                    sql: """
                        SELECT route, key, bytes FROM idempotencyKeys WHERE person = ? AND answered = 1 AND bytes > 0 AND NOT (route = ? AND key = ?) ORDER BY expiresAt
                        """), arguments: [claim.person, claim.route, claim.key]
            ).map { (route: $0["route"] as String, key: $0["key"] as String, bytes: $0["bytes"] as Int) }
            for (route, key) in IdempotencyTable.oldestToDrop(sizes, total: total, limit: idempotencyLimits.bytesPerPerson) {
                try db.cachedStatement(sql: "DELETE FROM idempotencyKeys WHERE person = ? AND route = ? AND key = ?").execute(arguments: [
                    claim.person, route, key,
                ])
            }
        }
    }

    func release(_ claim: IdempotencyClaim) throws {
        try database.tracedWrite { db in
            try db.cachedStatement(sql: "DELETE FROM idempotencyKeys WHERE person = ? AND route = ? AND key = ? AND holder = ?")
                .execute(arguments: [claim.person, claim.route, claim.key, claim.holder])
        }
    }

    func forgetKeys(of person: String) throws {
        try database.tracedWrite { db in try db.cachedStatement(sql: "DELETE FROM idempotencyKeys WHERE person = ?").execute(arguments: [person]) }
    }
}

// MARK: - PostgreSQL

extension PostgresAPIStore {
    func claim(_ claim: IdempotencyClaim, now: Date) throws -> IdempotencyDecision {
        let at = now.timeIntervalSince1970
        if sweep.due(now) { try database.statement { session in try session.execute("DELETE FROM idempotencyKeys WHERE expiresAt < \(at)") } }
        // Serializable, and a new key inserted only if no other claim inserted it meanwhile: a
        // claim that lost that race runs again and finds the winner's row.
        for _ in 0..<3 {
            if let decision = try claimOnce(claim, now: now) { return decision }
        }
        return .running(retryAfter: 1)
    }

    /// One attempt of ``claim(_:now:)``: nil when another claim inserted the key first.
    private func claimOnce(_ claim: IdempotencyClaim, now: Date) throws -> IdempotencyDecision? {
        let at = now.timeIntervalSince1970
        let (person, route, key, holder) = (claim.person, claim.route, claim.key, claim.holder)
        return try database.write { session -> IdempotencyDecision? in
            try session.execute("DELETE FROM idempotencyKeys WHERE person = \(person) AND expiresAt < \(at)")
            let row = try session.row(
                """
                SELECT fingerprint, holder, leaseUntil, answered, status, headers, body FROM idempotencyKeys WHERE person = \(person) AND route = \(route) AND key = \(key)
                """)
            let record = try row.map { row in
                IdempotencyTable.record(
                    fingerprint: try row.column("fingerprint").decode(Data.self), holder: try row.column("holder").decode(String?.self),
                    leaseUntil: try row.column("leaseUntil").decode(Double?.self),
                    answered: try row.column("answered").decode(Int.self) != 0, status: try row.column("status").decode(Int?.self),
                    headers: try row.column("headers").decode(String?.self),
                    body: try row.column("body").decode(Data?.self))
            }
            let decision = IdempotencyDecision.decide(record, for: claim, now: now)
            guard decision == .proceed else { return decision }
            let lease = at + claim.lease
            if record != nil {
                try session.execute(
                    "UPDATE idempotencyKeys SET holder = \(holder), leaseUntil = \(lease) WHERE person = \(person) AND route = \(route) AND key = \(key)")
                return decision
            }
            let held = try session.value(Int.self, "SELECT COUNT(*)::BIGINT FROM idempotencyKeys WHERE person = \(person)") ?? 0
            if held >= idempotencyLimits.keysPerPerson {
                let excess = held - idempotencyLimits.keysPerPerson + 1
                try session.execute(
                    """
                    DELETE FROM idempotencyKeys WHERE (person, route, key) IN
                        (SELECT person, route, key FROM idempotencyKeys WHERE person = \(person) AND answered = 1 ORDER BY expiresAt LIMIT \(excess))
                    """)
            }
            let (fingerprint, expires) = (Data(claim.fingerprint), at + IdempotencyKeys.lifetime)
            let inserted = try session.execute(
                """
                INSERT INTO idempotencyKeys (person, route, key, fingerprint, holder, leaseUntil, answered, createdAt, expiresAt)
                VALUES (\(person), \(route), \(key), \(fingerprint), \(holder), \(lease), 0, \(at), \(expires))
                ON CONFLICT (person, route, key) DO NOTHING
                """)
            return inserted == 1 ? decision : nil
        }
    }

    func answer(_ claim: IdempotencyClaim, with answer: KeptAnswer?, now: Date) throws {
        let (person, route, key, holder) = (claim.person, claim.route, claim.key, claim.holder)
        let (status, headers, body, bytes) = (
            answer?.status, answer.map { IdempotencyTable.encode($0.headers) }, answer.map { Data($0.body) }, answer?.body.count ?? 0
        )
        let expires = now.timeIntervalSince1970 + IdempotencyKeys.lifetime
        try database.write(isolation: .readCommitted) { session in
            try session.execute(
                """
                UPDATE idempotencyKeys SET holder = NULL, leaseUntil = NULL, answered = 1, status = \(status), headers = \(headers), body = \(body),
                    bytes = \(bytes), expiresAt = \(expires)
                WHERE person = \(person) AND route = \(route) AND key = \(key) AND holder = \(holder)
                """)
            let total = try session.value(Int.self, "SELECT COALESCE(SUM(bytes), 0)::BIGINT FROM idempotencyKeys WHERE person = \(person)") ?? 0
            guard total > idempotencyLimits.bytesPerPerson else { return }
            let sizes = try session.rows(
                """
                SELECT route, key, bytes FROM idempotencyKeys WHERE person = \(person) AND answered = 1 AND bytes > 0 AND NOT (route = \(route) AND key = \(key))
                ORDER BY expiresAt
                """
            ).map {
                (
                    route: try $0.column("route").decode(String.self), key: try $0.column("key").decode(String.self),
                    bytes: try $0.column("bytes").decode(Int.self)
                )
            }
            for (dropRoute, dropKey) in IdempotencyTable.oldestToDrop(sizes, total: total, limit: idempotencyLimits.bytesPerPerson) {
                try session.execute("DELETE FROM idempotencyKeys WHERE person = \(person) AND route = \(dropRoute) AND key = \(dropKey)")
            }
        }
    }

    func release(_ claim: IdempotencyClaim) throws {
        let (person, route, key, holder) = (claim.person, claim.route, claim.key, claim.holder)
        try database.statement { session in
            try session.execute("DELETE FROM idempotencyKeys WHERE person = \(person) AND route = \(route) AND key = \(key) AND holder = \(holder)")
        }
    }

    func forgetKeys(of person: String) throws {
        try database.statement { session in try session.execute("DELETE FROM idempotencyKeys WHERE person = \(person)") }
    }
}
