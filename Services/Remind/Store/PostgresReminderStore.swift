import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation
import Logging
import PostgresNIO

/// canopy-remind's store in PostgreSQL (``ReminderStoring``), which any number of
/// canopy-remind replicas share: the same tables as ``SQLiteReminderStore``, the same queries.
///
/// What replicas add:
/// - Every change to a person's reminders, sends or devices holds a transaction-scoped
///   advisory lock for that person (``waitForOwner(_:)``, or ``lockOwner(_:)``, which the
///   dispatcher tries and, finding it held, leaves the person to the replica that holds it),
///   and reads after taking it: in READ COMMITTED each statement then sees what committed
///   before, so a sync, a registration or a recorded attempt changes what it read, and a
///   reminder becomes one notification per device, once (its idempotency key is unique too).
///   Serializable transactions were tried first: under a dispatcher's load their predicate
///   locks spread to whole tables and most transactions failed and ran again (33 deliveries a
///   second where 333 were due).
/// - A send is leased to the replica trying it (``claimSend(id:now:until:)``) until the
///   attempt is recorded; a replica killed mid-delivery holds nothing once PostgreSQL sees its
///   connections go (``PostgresStore/holderIsGone(_:)``; one that hangs, once the lease ends),
///   and another replica's sweep (``orphans(dueBefore:now:)``) takes the send and tries it
///   again, under the same idempotency key (`webhook-id`): the documented at-least-once case.
final class PostgresReminderStore: ReminderStoring {
    let database: PostgresStore
    let codec = MessageCodec()

    func eraseResidue() {
        database.vacuumSoon(remindStoreImport.tables.map(\.name))
    }

    private init(database: PostgresStore) {
        self.database = database
    }

    /// Connects to `url` and migrates canopy-remind's tables.
    static func open(url: DatabaseURL, poolSize: Int = PostgresSettings.defaultPoolSize, waitingUpTo wait: Duration = .zero, logger: Logger) async throws
        -> PostgresReminderStore
    {
        PostgresReminderStore(database: try await PostgresStore.open(url: url, migrator: migrator, size: poolSize, waitingUpTo: wait, logger: logger))
    }

    static var migrator: PostgresMigrator {
        var migrator = PostgresMigrator(store: "remind")
        migrator.register(
            "v1",
            """
            CREATE TABLE devices (
                id TEXT PRIMARY KEY,
                owner TEXT NOT NULL,
                channel TEXT NOT NULL,
                address TEXT NOT NULL,
                name TEXT,
                secret TEXT,
                accessToken TEXT,
                active BOOLEAN NOT NULL,
                registeredAt DOUBLE PRECISION NOT NULL,
                deactivatedReason TEXT,
                UNIQUE (owner, channel, address))
            """,
            """
            CREATE TABLE reminders (
                id BIGSERIAL PRIMARY KEY,
                owner TEXT NOT NULL,
                taskID TEXT NOT NULL,
                due DOUBLE PRECISION NOT NULL,
                plantID TEXT NOT NULL,
                kind TEXT NOT NULL,
                title TEXT NOT NULL,
                fireAt DOUBLE PRECISION NOT NULL,
                state TEXT NOT NULL,
                updatedAt DOUBLE PRECISION NOT NULL,
                UNIQUE (owner, taskID, due))
            """,
            "CREATE INDEX remindersByOwner ON reminders(owner, state, fireAt)",
            // What the start-up load and the orphan sweep read.
            "CREATE INDEX remindersPending ON reminders(fireAt) WHERE state = 'pending'",
            """
            CREATE TABLE sends (
                id BIGSERIAL PRIMARY KEY,
                owner TEXT NOT NULL,
                deviceID TEXT NOT NULL,
                idempotencyKey TEXT NOT NULL,
                notification BYTEA NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0,
                nextAttempt DOUBLE PRECISION NOT NULL,
                state TEXT NOT NULL,
                lastError TEXT,
                createdAt DOUBLE PRECISION NOT NULL,
                -- until when the replica trying it holds it
                leasedUntil DOUBLE PRECISION,
                UNIQUE (deviceID, idempotencyKey))
            """,
            "CREATE INDEX sendsPending ON sends(nextAttempt) WHERE state = 'pending'",
            "CREATE INDEX sendsByOwner ON sends(owner, state)",
            """
            CREATE TABLE sendReminders (
                sendID BIGINT NOT NULL REFERENCES sends(id) ON DELETE CASCADE,
                reminderID BIGINT NOT NULL REFERENCES reminders(id) ON DELETE CASCADE,
                PRIMARY KEY (sendID, reminderID))
            """,
            "CREATE INDEX sendRemindersByReminder ON sendReminders(reminderID)",
            """
            CREATE TABLE attempts (
                sendID BIGINT NOT NULL REFERENCES sends(id) ON DELETE CASCADE,
                attempt INTEGER NOT NULL,
                at DOUBLE PRECISION NOT NULL,
                outcome TEXT NOT NULL,
                detail TEXT NOT NULL)
            """,
            "CREATE INDEX attemptsBySend ON attempts(sendID)")
        // Which replica holds a send's lease (``PostgresStore/holder``): one whose process is
        // gone holds nothing, whatever its lease says.
        migrator.register("v2-lease-holders", "ALTER TABLE sends ADD COLUMN leasedBy BIGINT")
        return migrator
    }

    func read<T>(_ body: (any ReminderReads) throws -> T) throws -> T {
        try database.read { session in try body(PostgresReminderTransaction(session: session, codec: codec, holder: database.holder)) }
    }

    func write<T>(_ body: (any ReminderWrites) throws -> T) throws -> T {
        try database.write(isolation: .readCommitted) { session in
            try body(PostgresReminderTransaction(session: session, codec: codec, holder: database.holder))
        }
    }

    func read<T: Sendable>(_ body: @escaping @Sendable (any ReminderReads) throws -> T) async throws -> T {
        try await offThePool { try self.read(body) }
    }

    func write<T: Sendable>(_ body: @escaping @Sendable (any ReminderWrites) throws -> T) async throws -> T {
        try await offThePool { try self.write(body) }
    }

    func forEachPending(_ body: (_ id: Int64, _ fireAt: Double) -> Void) throws {
        try database.read { session in
            for row in try session.rows("SELECT id, fireAt FROM reminders WHERE state = 'pending'") {
                body(try row.column("id").decode(Int64.self), try row.column("fireAt").decode(Double.self))
            }
        }
    }

    func pendingSends() throws -> [(id: Int64, nextAttempt: Double)] {
        try database.read { session in
            try session.rows("SELECT id, nextAttempt FROM sends WHERE state = 'pending'").map {
                (try $0.column("id").decode(Int64.self), try $0.column("nextAttempt").decode(Double.self))
            }
        }
    }

    // MARK: - Replicas

    var sharedWithReplicas: Bool { true }

    func claimSend(id: Int64, now: Date, until: Date) throws -> Bool {
        let (at, end) = (now.timeIntervalSince1970, until.timeIntervalSince1970)
        return try database.write(isolation: .readCommitted) { session in
            try session.execute(
                """
                UPDATE sends SET leasedUntil = \(end), leasedBy = \(database.holder)
                WHERE id = \(id) AND state = 'pending'
                  AND (leasedUntil IS NULL OR leasedUntil <= \(at) OR leasedBy = \(database.holder) OR \(unescaped: PostgresStore.holderIsGone("leasedBy")))
                """) == 1
        }
    }

    func orphans(dueBefore before: Date, now: Date) throws -> (reminders: [(id: Int64, fireAt: Double)], sends: [(id: Int64, nextAttempt: Double)]) {
        let (cutoff, at) = (before.timeIntervalSince1970, now.timeIntervalSince1970)
        return try database.read { session in
            let reminders = try session.rows("SELECT id, fireAt FROM reminders WHERE state = 'pending' AND fireAt < \(cutoff) ORDER BY fireAt LIMIT 10000")
                .map { (id: try $0.column("id").decode(Int64.self), fireAt: try $0.column("fireAt").decode(Double.self)) }
            let sends = try session.rows(
                """
                SELECT id, nextAttempt FROM sends
                WHERE state = 'pending' AND nextAttempt < \(cutoff) AND (leasedUntil IS NULL OR leasedUntil <= \(at) OR \(unescaped: PostgresStore.holderIsGone("leasedBy")))
                ORDER BY nextAttempt LIMIT 10000
                """
            ).map { (id: try $0.column("id").decode(Int64.self), nextAttempt: try $0.column("nextAttempt").decode(Double.self)) }
            return (reminders, sends)
        }
    }

    func sendsOfGoneReplicas(dueBefore before: Date) throws -> [(id: Int64, nextAttempt: Double)] {
        try database.statement { session in
            try session.rows(
                """
                SELECT id, nextAttempt FROM sends
                WHERE state = 'pending' AND nextAttempt < \(before.timeIntervalSince1970)
                  AND leasedBy <> \(database.holder) AND \(unescaped: PostgresStore.holderIsGone("leasedBy"))
                ORDER BY nextAttempt LIMIT 10000
                """
            ).map { (id: try $0.column("id").decode(Int64.self), nextAttempt: try $0.column("nextAttempt").decode(Double.self)) }
        }
    }

    // MARK: - Rows

    static let deviceColumns = "id, channel, address, name, active, registeredAt, deactivatedReason, owner, secret, accessToken"

    fileprivate static func device(_ row: PostgresRandomAccessRow) throws -> DeviceRecord {
        DeviceRecord(
            device: Reminders.Device(
                id: try row.column("id").decode(String.self), channel: Reminders.Channel(rawValue: try row.column("channel").decode(String.self)) ?? .log,
                address: try row.column("address").decode(String.self), name: try row.column("name").decode(String?.self),
                active: try row.column("active").decode(Bool.self),
                registeredAt: Date(timeIntervalSince1970: try row.column("registeredAt").decode(Double.self)),
                deactivatedReason: try row.column("deactivatedReason").decode(String?.self)),
            owner: try row.column("owner").decode(String.self), secret: try row.column("secret").decode(String?.self),
            accessToken: try row.column("accessToken").decode(String?.self))
    }

    static let reminderColumns = "id, owner, taskID, plantID, kind, title, due, state, fireAt, updatedAt"

    fileprivate static func reminder(_ row: PostgresRandomAccessRow) throws -> ReminderRow {
        ReminderRow(
            id: try row.column("id").decode(Int64.self), owner: try row.column("owner").decode(String.self),
            reminder: Reminders.Reminder(
                taskID: try row.column("taskID").decode(String.self), plantID: try row.column("plantID").decode(String.self),
                kind: Care.TaskKind(rawValue: try row.column("kind").decode(String.self)) ?? .custom, title: try row.column("title").decode(String.self),
                due: Date(timeIntervalSince1970: try row.column("due").decode(Double.self)),
                state: Reminders.State(rawValue: try row.column("state").decode(String.self)) ?? .pending),
            fireAt: Date(timeIntervalSince1970: try row.column("fireAt").decode(Double.self)))
    }
}

/// One transaction of a ``PostgresReminderStore``: every statement canopy-remind runs, as
/// ``SQLiteReminderStore``'s, in PostgreSQL's dialect.
private struct PostgresReminderTransaction: ReminderWrites {
    let session: PostgresSession
    let codec: MessageCodec
    /// This replica's id in the leases it takes (``PostgresStore/holder``).
    let holder: Int64

    // MARK: Devices

    func devices(owner: String, activeOnly: Bool) throws -> [DeviceRecord] {
        let filter = activeOnly ? "AND active" : ""
        return try session.rows(
            """
            SELECT \(unescaped: PostgresReminderStore.deviceColumns) FROM devices WHERE owner = \(owner) \(unescaped: filter) ORDER BY registeredAt, id
            """
        ).map(PostgresReminderStore.device)
    }

    func device(owner: String, id: String) throws -> DeviceRecord? {
        try session.row("SELECT \(unescaped: PostgresReminderStore.deviceColumns) FROM devices WHERE owner = \(owner) AND id = \(id)")
            .map(PostgresReminderStore.device)
    }

    func deviceID(owner: String, channel: Reminders.Channel, address: String) throws -> String? {
        try session.value(String.self, "SELECT id FROM devices WHERE owner = \(owner) AND channel = \(channel.rawValue) AND address = \(address)")
    }

    func deviceCount(owner: String) throws -> Int {
        try session.value(Int.self, "SELECT COUNT(*) FROM devices WHERE owner = \(owner)") ?? 0
    }

    func reactivateDevice(id: String, name: String?, secret: String?, accessToken: String?) throws {
        try session.execute(
            """
            UPDATE devices SET active = true, deactivatedReason = NULL, name = \(name), secret = \(secret), accessToken = \(accessToken) WHERE id = \(id)
            """)
    }

    func insertDevice(_ device: Reminders.Device, owner: String, secret: String?, accessToken: String?) throws {
        try session.execute(
            """
            INSERT INTO devices (id, owner, channel, address, name, secret, accessToken, active, registeredAt)
            VALUES (\(device.id), \(owner), \(device.channel.rawValue), \(device.address), \(device.name), \(secret), \(accessToken), \(device.active),
                    \(device.registeredAt.timeIntervalSince1970))
            """)
    }

    func removeDevice(owner: String, id: String) throws {
        try session.execute("DELETE FROM devices WHERE owner = \(owner) AND id = \(id)")
    }

    func forgetPerson(_ owner: String) throws {
        try session.execute("DELETE FROM sends WHERE owner = \(owner)")
        try session.execute("DELETE FROM reminders WHERE owner = \(owner)")
        try session.execute("DELETE FROM devices WHERE owner = \(owner)")
    }

    func deactivateDevice(id: String, reason: String) throws {
        try session.execute("UPDATE devices SET active = false, deactivatedReason = \(reason) WHERE id = \(id)")
    }

    // MARK: Reminders

    func knownReminders(owner: String) throws -> [KnownReminder] {
        try session.rows("SELECT taskID, due, id, state, fireAt, title FROM reminders WHERE owner = \(owner)").map { row in
            KnownReminder(
                id: try row.column("id").decode(Int64.self),
                occurrence: .init(taskID: try row.column("taskID").decode(String.self), due: try row.column("due").decode(Double.self)),
                pending: try row.column("state").decode(String.self) == "pending", fireAt: try row.column("fireAt").decode(Double.self),
                title: try row.column("title").decode(String.self))
        }
    }

    func apply(_ plan: SyncPlan, owner: String, now: Date) throws -> [(id: Int64, fireAt: Double)] {
        let updatedAt = now.timeIntervalSince1970
        var scheduled: [(id: Int64, fireAt: Double)] = []
        // One statement for each kind of change, the rows as arrays.
        if !plan.updates.isEmpty {
            var (ids, fireAts, titles) = ([Int64](), [Double](), [String]())
            for (id, task) in plan.updates {
                let fireAt = (task.snoozedUntil ?? task.due).timeIntervalSince1970
                ids.append(id)
                fireAts.append(fireAt)
                titles.append(task.title)
                scheduled.append((id, fireAt))
            }
            try session.execute(
                """
                UPDATE reminders SET fireAt = changed.fireAt, title = changed.title, updatedAt = \(updatedAt)
                FROM unnest(\(ids), \(fireAts), \(titles)) AS changed(id, fireAt, title) WHERE reminders.id = changed.id
                """)
        }
        if !plan.inserts.isEmpty {
            let tasks = plan.inserts
            let (taskIDs, dues, plantIDs) = (tasks.map(\.id), tasks.map(\.due.timeIntervalSince1970), tasks.map(\.plantID))
            let (kinds, titles, fireAts) = (tasks.map(\.kind.rawValue), tasks.map(\.title), tasks.map { ($0.snoozedUntil ?? $0.due).timeIntervalSince1970 })
            let inserted = try session.rows(
                """
                INSERT INTO reminders (owner, taskID, due, plantID, kind, title, fireAt, updatedAt, state)
                SELECT \(owner), taskID, due, plantID, kind, title, fireAt, \(updatedAt), 'pending'
                FROM unnest(\(taskIDs), \(dues), \(plantIDs), \(kinds), \(titles), \(fireAts)) AS new(taskID, due, plantID, kind, title, fireAt)
                RETURNING id, fireAt
                """)
            for row in inserted { scheduled.append((try row.column("id").decode(Int64.self), try row.column("fireAt").decode(Double.self))) }
        }
        if !plan.deletes.isEmpty {
            try session.execute("DELETE FROM reminders WHERE id = ANY(\(plan.deletes))")
        }
        return scheduled
    }

    func cancelPlant(_ plantID: String, owner: String) throws {
        // Nothing of the plant stays: notifications about it alone (sent or not, with their
        // attempts) and its reminders in every state.
        try session.execute(
            """
            DELETE FROM sends WHERE owner = \(owner) AND id IN (
                SELECT sendID FROM sendReminders JOIN reminders ON reminders.id = sendReminders.reminderID
                WHERE reminders.owner = \(owner) AND reminders.plantID = \(plantID))
              AND NOT EXISTS (SELECT 1 FROM sendReminders other JOIN reminders r ON r.id = other.reminderID
                              WHERE other.sendID = sends.id AND r.plantID != \(plantID))
            """)
        try session.execute("DELETE FROM reminders WHERE owner = \(owner) AND plantID = \(plantID)")
    }

    func pendingReminders(ids: [Int64]) throws -> [ReminderRow] {
        try session.rows("SELECT \(unescaped: PostgresReminderStore.reminderColumns) FROM reminders WHERE state = 'pending' AND id = ANY(\(ids))")
            .map(PostgresReminderStore.reminder)
    }

    func pendingReminders(owner: String, firingAfter after: Date, through: Date) throws -> [ReminderRow] {
        try session.rows(
            """
            SELECT \(unescaped: PostgresReminderStore.reminderColumns) FROM reminders
            WHERE owner = \(owner) AND state = 'pending' AND fireAt > \(after.timeIntervalSince1970) AND fireAt <= \(through.timeIntervalSince1970)
            """
        ).map(PostgresReminderStore.reminder)
    }

    func pendingSummary(owner: String) throws -> (count: Int, lastFireAt: Date?) {
        let row = try session.row("SELECT COUNT(*) AS count, MAX(fireAt) AS latest FROM reminders WHERE owner = \(owner) AND state = 'pending'")
        return (try row?.column("count").decode(Int.self) ?? 0, try row?.column("latest").decode(Double?.self).map(Date.init(timeIntervalSince1970:)))
    }

    func upcoming(owner: String, limit: Int) throws -> [Reminders.Reminder] {
        try session.rows(
            """
            SELECT \(unescaped: PostgresReminderStore.reminderColumns) FROM reminders
            WHERE owner = \(owner) AND state IN ('pending', 'sending') ORDER BY fireAt, id LIMIT \(limit)
            """
        ).map { try PostgresReminderStore.reminder($0).reminder }
    }

    func failedSends(owner: String, limit: Int) throws -> [Reminders.Failure] {
        try session.rows(
            """
            SELECT reminders.id, reminders.owner, reminders.taskID, reminders.plantID, reminders.kind, reminders.title, reminders.due,
                   reminders.state, reminders.fireAt, reminders.updatedAt, sends.deviceID, sends.attempts, sends.lastError, sends.nextAttempt FROM sends
            JOIN sendReminders ON sendReminders.sendID = sends.id JOIN reminders ON reminders.id = sendReminders.reminderID
            WHERE sends.owner = \(owner) AND sends.state = 'failed' ORDER BY sends.nextAttempt DESC LIMIT \(limit)
            """
        ).map { row in
            Reminders.Failure(
                reminder: try PostgresReminderStore.reminder(row).reminder, deviceID: try row.column("deviceID").decode(String.self),
                attempts: try row.column("attempts").decode(Int.self), lastError: try row.column("lastError").decode(String?.self) ?? "",
                at: Date(timeIntervalSince1970: try row.column("nextAttempt").decode(Double.self)))
        }
    }

    func staleReminders(owner: String, limit: Int) throws -> [(reminder: Reminders.Reminder, at: Date)] {
        try session.rows(
            """
            SELECT \(unescaped: PostgresReminderStore.reminderColumns) FROM reminders
            WHERE owner = \(owner) AND state = 'stale' ORDER BY updatedAt DESC LIMIT \(limit)
            """
        ).map { (try PostgresReminderStore.reminder($0).reminder, Date(timeIntervalSince1970: try $0.column("updatedAt").decode(Double.self))) }
    }

    func lockOwner(_ owner: String) throws -> Bool {
        try session.value(Bool.self, "SELECT pg_try_advisory_xact_lock(hashtext('canopy_remind:' || \(owner)))") ?? false
    }

    func waitForOwner(_ owner: String) throws {
        try session.execute("SELECT pg_advisory_xact_lock(hashtext('canopy_remind:' || \(owner)))")
    }

    func setState(_ state: Reminders.State, ofReminders ids: [Int64], at: Date) throws {
        guard !ids.isEmpty else { return }
        try session.execute("UPDATE reminders SET state = \(state.rawValue), updatedAt = \(at.timeIntervalSince1970) WHERE id = ANY(\(ids))")
    }

    // MARK: Sends

    func insertSend(owner: String, deviceID: String, notification: ReminderNotification, reminderIDs: [Int64], at: Date) throws -> Int64? {
        let (body, now) = (Data(try codec.encode(notification)), at.timeIntervalSince1970)
        guard
            let send = try session.value(
                Int64.self,
                """
                INSERT INTO sends (owner, deviceID, idempotencyKey, notification, nextAttempt, state, createdAt)
                VALUES (\(owner), \(deviceID), \(notification.id), \(body), \(now), 'pending', \(now))
                ON CONFLICT (deviceID, idempotencyKey) DO NOTHING RETURNING id
                """)
        else { return nil }
        try session.execute("INSERT INTO sendReminders (sendID, reminderID) SELECT \(send), unnest(\(reminderIDs))")
        return send
    }

    func pendingSend(id: Int64) throws -> (send: StoredSend, device: DeviceRecord?)? {
        guard
            let row = try session.row(
                """
                SELECT id, owner, deviceID, notification, attempts FROM sends WHERE id = \(id) AND state = 'pending'
                """)
        else { return nil }
        let send = StoredSend(
            id: try row.column("id").decode(Int64.self), owner: try row.column("owner").decode(String.self),
            deviceID: try row.column("deviceID").decode(String.self),
            notification: try codec.decode(ReminderNotification.self, from: [UInt8](try row.column("notification").decode(Data.self))),
            attempts: try row.column("attempts").decode(Int.self))
        let device = try session.row("SELECT \(unescaped: PostgresReminderStore.deviceColumns) FROM devices WHERE id = \(send.deviceID)")
            .map(PostgresReminderStore.device)
        return (send, device)
    }

    func sendExists(id: Int64) throws -> Bool {
        try session.value(Int.self, "SELECT 1 FROM sends WHERE id = \(id)") != nil
    }

    func record(_ attempt: Dispatcher.Attempt, update: SendUpdate, at: Date) throws {
        let (sendID, number, now) = (attempt.sendID, attempt.attempt, at.timeIntervalSince1970)
        try session.execute(
            """
            INSERT INTO attempts (sendID, attempt, at, outcome, detail) VALUES (\(sendID), \(number), \(now), \(attempt.outcome.label), \(attempt.outcome.detail))
            """)
        switch update {
        case .delivered:
            try session.execute("UPDATE sends SET state = 'delivered', attempts = \(number), lastError = NULL, leasedUntil = NULL WHERE id = \(sendID)")
        case .retry(let retryAt, let reason):
            try session.execute(
                """
                UPDATE sends SET attempts = \(number), nextAttempt = \(retryAt), lastError = \(reason), leasedUntil = NULL WHERE id = \(sendID)
                """)
        case .failed(let reason, let deactivate):
            try session.execute(
                """
                UPDATE sends SET state = 'failed', attempts = \(number), lastError = \(reason), nextAttempt = \(now), leasedUntil = NULL WHERE id = \(sendID)
                """)
            if deactivate { try deactivateDevice(id: attempt.deviceID, reason: reason) }
        }
    }

    // MARK: The dispatcher's batches: a statement or two for many people

    func pendingReminders(owners: [String], firingAfter after: Date, through: Date) throws -> [ReminderRow] {
        try session.rows(
            """
            SELECT \(unescaped: PostgresReminderStore.reminderColumns) FROM reminders
            WHERE owner = ANY(\(owners)) AND state = 'pending' AND fireAt > \(after.timeIntervalSince1970) AND fireAt <= \(through.timeIntervalSince1970)
            """
        ).map(PostgresReminderStore.reminder)
    }

    func activeDevices(owners: [String]) throws -> [String: [DeviceRecord]] {
        let devices = try session.rows(
            """
            SELECT \(unescaped: PostgresReminderStore.deviceColumns) FROM devices WHERE owner = ANY(\(owners)) AND active ORDER BY registeredAt, id
            """
        ).map(PostgresReminderStore.device)
        return Dictionary(grouping: devices, by: \.owner)
    }

    func pendingSummaries(owners: [String]) throws -> [String: (count: Int, lastFireAt: Date?)] {
        var summaries: [String: (count: Int, lastFireAt: Date?)] = [:]
        for row in try session.rows(
            "SELECT owner, COUNT(*) AS count, MAX(fireAt) AS latest FROM reminders WHERE owner = ANY(\(owners)) AND state = 'pending' GROUP BY owner")
        {
            summaries[try row.column("owner").decode(String.self)] = (
                try row.column("count").decode(Int.self), try row.column("latest").decode(Double?.self).map(Date.init(timeIntervalSince1970:))
            )
        }
        return summaries
    }

    func existingSends(ids: [Int64]) throws -> Set<Int64> {
        Set(try session.rows("SELECT id FROM sends WHERE id = ANY(\(ids))").map { try $0.column("id").decode(Int64.self) })
    }

    func lockOwners(_ owners: [String]) throws -> Set<String> {
        // Tries only (none waits), so the order they are taken in does not matter.
        Set(
            try session.rows(
                "SELECT owner FROM unnest(\(owners)) AS owner WHERE pg_try_advisory_xact_lock(hashtext('canopy_remind:' || owner))"
            ).map { try $0.column("owner").decode(String.self) })
    }

    func insertSends(_ sends: [NewSend], at: Date, leasedUntil: Date) throws -> [Int64?] {
        guard !sends.isEmpty else { return [] }
        let bodies = try sends.map { ByteBuffer(bytes: try codec.encode($0.notification)) }
        let (now, until) = (at.timeIntervalSince1970, leasedUntil.timeIntervalSince1970)
        // One statement for all; a key already recorded for its device (being or sent) is
        // skipped and answers no row.
        var ids: [String: Int64] = [:]
        for row in try session.rows(
            """
            INSERT INTO sends (owner, deviceID, idempotencyKey, notification, nextAttempt, state, createdAt, leasedUntil, leasedBy)
            SELECT owner, deviceID, key, body, \(now), 'pending', \(now), \(until), \(holder)
            FROM unnest(\(sends.map(\.owner)), \(sends.map(\.deviceID)), \(sends.map(\.notification.id)), \(bodies)) AS s(owner, deviceID, key, body)
            ON CONFLICT (deviceID, idempotencyKey) DO NOTHING RETURNING id, deviceID, idempotencyKey
            """)
        {
            ids[try row.column("deviceID").decode(String.self) + "\u{1F}" + row.column("idempotencyKey").decode(String.self)] = try row.column("id").decode(
                Int64.self)
        }
        let made = sends.map { ids[$0.deviceID + "\u{1F}" + $0.notification.id] }
        var pairs: (sends: [Int64], reminders: [Int64]) = ([], [])
        for (send, id) in zip(sends, made) {
            guard let id else { continue }
            pairs.sends += Array(repeating: id, count: send.reminderIDs.count)
            pairs.reminders += send.reminderIDs
        }
        if !pairs.sends.isEmpty {
            try session.execute("INSERT INTO sendReminders (sendID, reminderID) SELECT * FROM unnest(\(pairs.sends), \(pairs.reminders))")
        }
        return made
    }

    func lockForRecording(sendIDs: [Int64]) throws -> Set<Int64> {
        guard !sendIDs.isEmpty else { return [] }
        // The sends' rows, so that none goes (a plant deleted) between this and the attempts
        // written for it. The people's locks come last, in ``settleReminders(ofSends:at:)``:
        // taken here, for the whole of the writing, the other replicas' preparers found those
        // people locked far more often (two replicas delivered 499 a second instead of 3,557).
        return Set(try session.rows("SELECT id FROM sends WHERE id = ANY(\(sendIDs)) FOR UPDATE").map { try $0.column("id").decode(Int64.self) })
    }

    func record(_ attempts: [(attempt: Dispatcher.Attempt, update: SendUpdate)], at: Date) throws {
        guard !attempts.isEmpty else { return }
        let now = at.timeIntervalSince1970
        let ids = attempts.map(\.attempt.sendID), numbers = attempts.map(\.attempt.attempt)
        try session.execute(
            """
            INSERT INTO attempts (sendID, attempt, at, outcome, detail)
            SELECT id, number, \(now), outcome, detail FROM unnest(\(ids), \(numbers), \(attempts.map(\.attempt.outcome.label)), \(attempts.map(\.attempt.outcome.detail)))
                AS a(id, number, outcome, detail)
            """)
        // Per send: its state, its error ('' for none) and its next attempt (-1: unchanged).
        var states: [String] = [], errors: [String] = [], next: [Double] = []
        for (_, update) in attempts {
            let (state, error, at): (String, String, Double) =
                switch update {
                case .delivered: ("delivered", "", -1)
                case .retry(let retryAt, let reason): ("pending", reason, retryAt)
                case .failed(let reason, _): ("failed", reason, now)
                }
            states.append(state)
            errors.append(error)
            next.append(at)
        }
        try session.execute(
            """
            UPDATE sends SET state = u.state, attempts = u.number, lastError = NULLIF(u.error, ''),
                nextAttempt = CASE WHEN u.next < 0 THEN sends.nextAttempt ELSE u.next END, leasedUntil = NULL
            FROM unnest(\(ids), \(numbers), \(states), \(errors), \(next)) AS u(id, number, state, error, next) WHERE sends.id = u.id
            """)
        for (attempt, update) in attempts {
            if case .failed(let reason, true) = update { try deactivateDevice(id: attempt.deviceID, reason: reason) }
        }
    }

    func settleReminders(ofSends ids: [Int64], at: Date) throws {
        guard !ids.isEmpty else { return }
        // As ``settleReminders(ofSend:at:)``, the people's locks first, in the order of the
        // locks' own keys on every replica (two recording at once never wait for each other
        // in a circle).
        try session.execute(
            """
            SELECT pg_advisory_xact_lock(key) FROM (SELECT DISTINCT hashtext('canopy_remind:' || owner) AS key FROM sends WHERE id = ANY(\(ids))) AS o
            ORDER BY key
            """)
        try session.execute(
            """
            UPDATE reminders SET updatedAt = \(at.timeIntervalSince1970), state = CASE
                WHEN EXISTS (SELECT 1 FROM sendReminders s JOIN sends ON sends.id = s.sendID WHERE s.reminderID = reminders.id AND sends.state = 'delivered')
                THEN 'delivered' ELSE 'failed' END
            WHERE id IN (SELECT reminderID FROM sendReminders WHERE sendID = ANY(\(ids))) AND state = 'sending'
              AND NOT EXISTS (SELECT 1 FROM sendReminders s JOIN sends ON sends.id = s.sendID WHERE s.reminderID = reminders.id AND sends.state = 'pending')
            """)
    }

    func settleReminders(ofSend sendID: Int64, at: Date) throws {
        // The person's other sends of these reminders may be recorded on another replica at
        // this moment: one after the other, each seeing the other's outcome.
        try session.execute(
            """
            SELECT pg_advisory_xact_lock(hashtext('canopy_remind:' || owner)) FROM sends WHERE id = \(sendID)
            """)
        try session.execute(
            """
            UPDATE reminders SET updatedAt = \(at.timeIntervalSince1970), state = CASE
                WHEN EXISTS (SELECT 1 FROM sendReminders s JOIN sends ON sends.id = s.sendID WHERE s.reminderID = reminders.id AND sends.state = 'delivered')
                THEN 'delivered' ELSE 'failed' END
            WHERE id IN (SELECT reminderID FROM sendReminders WHERE sendID = \(sendID)) AND state = 'sending'
              AND NOT EXISTS (SELECT 1 FROM sendReminders s JOIN sends ON sends.id = s.sendID WHERE s.reminderID = reminders.id AND sends.state = 'pending')
            """)
    }
}

/// How canopy-remind's SQLite store moves into PostgreSQL (`canopy migrate`).
public let remindStoreImport = StoreImport(
    store: "remind", migrator: PostgresReminderStore.migrator,
    tables: [
        .init("devices", key: ["id"]), .init("reminders", key: ["id"]), .init("sends", key: ["id"]),
        .init("sendReminders", key: ["sendID", "reminderID"]), .init("attempts"),
    ])
