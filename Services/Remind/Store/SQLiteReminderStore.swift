import CanopyMessages
import CanopyStore
import Foundation
import GRDB

/// canopy-remind's store in SQLite (``ReminderStoring``): one file (GRDB, WAL) with each
/// person's devices, their reminders (one per task occurrence), the sends (one notification to
/// one device, kept until the channel accepted it or retries ran out) and every attempt. Every
/// query about a person's data names the owner. Thread-safe.
final class SQLiteReminderStore: ReminderStoring {
    let database: DatabasePool
    let codec = MessageCodec()

    func eraseResidue() {
        SQLiteStore.eraseResidue(database)
    }

    init(path: String) throws {
        // Every commit survives the process crashing (what the crash test checks); losing
        // power can roll back the last moments, and then a reminder is sent again (its
        // idempotency key unchanged), never lost from the window canopy-care hands over again.
        database = try SQLiteStore.open(path: path, migrator: Self.migrator)
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(
                sql: """
                    CREATE TABLE devices (
                        id TEXT PRIMARY KEY,
                        owner TEXT NOT NULL,
                        channel TEXT NOT NULL,
                        address TEXT NOT NULL,
                        name TEXT,
                        secret TEXT,
                        accessToken TEXT,
                        active INTEGER NOT NULL,
                        registeredAt DOUBLE NOT NULL,
                        deactivatedReason TEXT,
                        UNIQUE (owner, channel, address));
                    -- One row per task occurrence; the rowid is what the dispatcher's heap holds.
                    CREATE TABLE reminders (
                        id INTEGER PRIMARY KEY,
                        owner TEXT NOT NULL,
                        taskID TEXT NOT NULL,
                        due DOUBLE NOT NULL,
                        plantID TEXT NOT NULL,
                        kind TEXT NOT NULL,
                        title TEXT NOT NULL,
                        -- when it goes out: the snooze, else the due time
                        fireAt DOUBLE NOT NULL,
                        state TEXT NOT NULL,
                        updatedAt DOUBLE NOT NULL,
                        UNIQUE (owner, taskID, due));
                    CREATE INDEX remindersPending ON reminders(state, fireAt);
                    CREATE INDEX remindersByOwner ON reminders(owner, state, fireAt);
                    CREATE INDEX remindersByPlant ON reminders(owner, plantID);
                    -- One notification to one device, until accepted or given up.
                    CREATE TABLE sends (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        owner TEXT NOT NULL,
                        deviceID TEXT NOT NULL,
                        idempotencyKey TEXT NOT NULL,
                        notification BLOB NOT NULL,
                        attempts INTEGER NOT NULL DEFAULT 0,
                        nextAttempt DOUBLE NOT NULL,
                        state TEXT NOT NULL,
                        lastError TEXT,
                        createdAt DOUBLE NOT NULL,
                        UNIQUE (deviceID, idempotencyKey));
                    CREATE INDEX sendsPending ON sends(state, nextAttempt);
                    CREATE TABLE sendReminders (
                        sendID INTEGER NOT NULL REFERENCES sends(id) ON DELETE CASCADE,
                        reminderID INTEGER NOT NULL REFERENCES reminders(id) ON DELETE CASCADE,
                        PRIMARY KEY (sendID, reminderID));
                    CREATE INDEX sendRemindersByReminder ON sendReminders(reminderID);
                    CREATE TABLE attempts (
                        sendID INTEGER NOT NULL REFERENCES sends(id) ON DELETE CASCADE,
                        attempt INTEGER NOT NULL,
                        at DOUBLE NOT NULL,
                        outcome TEXT NOT NULL,
                        detail TEXT NOT NULL);
                    CREATE INDEX attemptsBySend ON attempts(sendID);
                    """)
        }
        migrator.registerMigration("v2") { db in
            // Fewer indexes to keep up on every sync: cancelling a plant reads the owner's rows
            // (remindersByOwner), and the start-up load scans the table once.
            try db.execute(sql: "DROP INDEX remindersByPlant; DROP INDEX remindersPending")
        }
        return migrator
    }

    func read<T>(_ body: (any ReminderReads) throws -> T) throws -> T {
        try database.tracedRead { db in try body(Transaction(db: db, codec: codec)) }
    }

    func write<T>(_ body: (any ReminderWrites) throws -> T) throws -> T {
        try database.tracedWrite { db in try body(Transaction(db: db, codec: codec)) }
    }

    func read<T: Sendable>(_ body: @escaping @Sendable (any ReminderReads) throws -> T) async throws -> T {
        let codec = self.codec
        return try await database.tracedRead { db in try body(Transaction(db: db, codec: codec)) }
    }

    func write<T: Sendable>(_ body: @escaping @Sendable (any ReminderWrites) throws -> T) async throws -> T {
        let codec = self.codec
        return try await database.tracedWrite { db in try body(Transaction(db: db, codec: codec)) }
    }

    func forEachPending(_ body: (_ id: Int64, _ fireAt: Double) -> Void) throws {
        try database.tracedRead { db in
            let rows = try Row.fetchCursor(db, sql: "SELECT id, fireAt FROM reminders WHERE state = 'pending'")
            while let row = try rows.next() { body(row["id"], row["fireAt"]) }
        }
    }

    func pendingSends() throws -> [(id: Int64, nextAttempt: Double)] {
        try database.tracedRead { db in
            try Row.fetchAll(db, sql: "SELECT id, nextAttempt FROM sends WHERE state = 'pending'").map { ($0["id"], $0["nextAttempt"]) }
        }
    }

    // One process uses a SQLite file: every pending send is its own, and nothing is left
    // behind by another.
    var sharedWithReplicas: Bool { false }

    func claimSend(id: Int64, now: Date, until: Date) throws -> Bool { true }

    func orphans(dueBefore before: Date, now: Date) throws -> (reminders: [(id: Int64, fireAt: Double)], sends: [(id: Int64, nextAttempt: Double)]) {
        ([], [])
    }

    func sendsOfGoneReplicas(dueBefore before: Date) throws -> [(id: Int64, nextAttempt: Double)] { [] }

    fileprivate static func device(_ row: Row) -> DeviceRecord {
        DeviceRecord(
            device: Reminders.Device(
                id: row["id"], channel: Reminders.Channel(rawValue: row["channel"]) ?? .log, address: row["address"], name: row["name"],
                active: row["active"], registeredAt: Date(timeIntervalSince1970: row["registeredAt"]),
                deactivatedReason: row["deactivatedReason"]),
            owner: row["owner"], secret: row["secret"], accessToken: row["accessToken"])
    }

    fileprivate static func reminder(_ row: Row) -> ReminderRow {
        ReminderRow(
            id: row["id"], owner: row["owner"],
            reminder: Reminders.Reminder(
                taskID: row["taskID"], plantID: row["plantID"], kind: Care.TaskKind(rawValue: row["kind"]) ?? .custom,
                title: row["title"], due: Date(timeIntervalSince1970: row["due"]),
                state: Reminders.State(rawValue: row["state"]) ?? .pending),
            fireAt: Date(timeIntervalSince1970: row["fireAt"]))
    }
}

/// One transaction of a ``SQLiteReminderStore``: every statement canopy-remind runs.
private struct Transaction: ReminderWrites {
    let db: Database
    let codec: MessageCodec

    /// Runs a statement prepared once per connection and reused: the dispatcher's and the
    /// sync's statements run thousands of times a second, and parsing each anew was a large
    /// part of their cost.
    private func run(_ sql: String, arguments: StatementArguments = StatementArguments()) throws {
        try db.cachedStatement(sql: sql).execute(arguments: arguments)
    }

    /// `(?, ?), (?, ?)` for 2 rows of 2 columns, each row ending in `literal` when given (a
    /// window has at most 128 occurrences, so each statement has at most 128 shapes, each
    /// prepared once per connection).
    static func placeholders(rows: Int, columns: Int, then literal: String? = nil) -> String {
        let row = "(" + (Array(repeating: "?", count: columns) + (literal.map { [$0] } ?? [])).joined(separator: ", ") + ")"
        return Array(repeating: row, count: rows).joined(separator: ", ")
    }

    // MARK: Devices

    func devices(owner: String, activeOnly: Bool) throws -> [DeviceRecord] {
        try Row.fetchAll(
            try db.cachedStatement(
                sql: activeOnly
                    ? "SELECT * FROM devices WHERE owner = ? AND active = 1 ORDER BY registeredAt, id"
                    : "SELECT * FROM devices WHERE owner = ? ORDER BY registeredAt, id"),
            arguments: [owner]
        ).map(SQLiteReminderStore.device)
    }

    func device(owner: String, id: String) throws -> DeviceRecord? {
        try Row.fetchOne(db, sql: "SELECT * FROM devices WHERE owner = ? AND id = ?", arguments: [owner, id]).map(SQLiteReminderStore.device)
    }

    func deviceID(owner: String, channel: Reminders.Channel, address: String) throws -> String? {
        try String.fetchOne(
            try db.cachedStatement(sql: "SELECT id FROM devices WHERE owner = ? AND channel = ? AND address = ?"),
            arguments: [owner, channel.rawValue, address])
    }

    func deviceCount(owner: String) throws -> Int {
        try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM devices WHERE owner = ?", arguments: [owner]) ?? 0
    }

    func reactivateDevice(id: String, name: String?, secret: String?, accessToken: String?) throws {
        try run(
            "UPDATE devices SET active = 1, deactivatedReason = NULL, name = ?, secret = ?, accessToken = ? WHERE id = ?",
            arguments: [name, secret, accessToken, id])
    }

    func insertDevice(_ device: Reminders.Device, owner: String, secret: String?, accessToken: String?) throws {
        try run(
            """
            INSERT INTO devices (id, owner, channel, address, name, secret, accessToken, active, registeredAt) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
            """,
            arguments: [
                device.id, owner, device.channel.rawValue, device.address, device.name, secret, accessToken, device.active,
                device.registeredAt.timeIntervalSince1970,
            ])
    }

    func removeDevice(owner: String, id: String) throws {
        try run("DELETE FROM devices WHERE owner = ? AND id = ?", arguments: [owner, id])
    }

    func forgetPerson(_ owner: String) throws {
        try run("DELETE FROM sends WHERE owner = ?", arguments: [owner])
        try run("DELETE FROM reminders WHERE owner = ?", arguments: [owner])
        try run("DELETE FROM devices WHERE owner = ?", arguments: [owner])
    }

    func deactivateDevice(id: String, reason: String) throws {
        try run("UPDATE devices SET active = 0, deactivatedReason = ? WHERE id = ?", arguments: [reason, id])
    }

    // MARK: Reminders

    func knownReminders(owner: String) throws -> [KnownReminder] {
        // Through a cursor: a window is read twice per sync.
        let rows = try Row.fetchCursor(
            try db.cachedStatement(sql: "SELECT taskID, due, id, state, fireAt, title FROM reminders WHERE owner = ?"),
            arguments: [owner])
        var known: [KnownReminder] = []
        while let row = try rows.next() {
            known.append(
                KnownReminder(
                    id: row["id"], occurrence: .init(taskID: row["taskID"], due: row["due"]), pending: (row["state"] as String) == "pending",
                    fireAt: row["fireAt"], title: row["title"]))
        }
        return known
    }

    func apply(_ plan: SyncPlan, owner: String, now: Date) throws -> [(id: Int64, fireAt: Double)] {
        let updatedAt = now.timeIntervalSince1970
        var scheduled: [(id: Int64, fireAt: Double)] = []
        // One statement for each kind of change, not one per occurrence: the writer is the
        // one thing syncs of many people queue for.
        if !plan.updates.isEmpty {
            var values: [(any DatabaseValueConvertible)?] = [updatedAt]
            for (id, task) in plan.updates {
                let fireAt = (task.snoozedUntil ?? task.due).timeIntervalSince1970
                values += [id, fireAt, task.title]
                scheduled.append((id, fireAt))
            }
            try run(
                """
                UPDATE reminders SET fireAt = changed.column2, title = changed.column3, updatedAt = ?
                FROM (VALUES \(Self.placeholders(rows: plan.updates.count, columns: 3))) AS changed WHERE reminders.id = changed.column1
                """, arguments: StatementArguments(values))
        }
        if !plan.inserts.isEmpty {
            var values: [(any DatabaseValueConvertible)?] = []
            values.reserveCapacity(plan.inserts.count * 8)
            for task in plan.inserts {
                values += [
                    owner, task.id, task.due.timeIntervalSince1970, task.plantID, task.kind.rawValue, task.title,
                    (task.snoozedUntil ?? task.due).timeIntervalSince1970, updatedAt,
                ]
            }
            let inserted = try Row.fetchCursor(
                try db.cachedStatement(
                    sql: """
                        INSERT INTO reminders (owner, taskID, due, plantID, kind, title, fireAt, updatedAt, state)
                        VALUES \(Self.placeholders(rows: plan.inserts.count, columns: 8, then: "'pending'")) RETURNING id, fireAt
                        """), arguments: StatementArguments(values))
            while let row = try inserted.next() { scheduled.append((row["id"], row["fireAt"])) }
        }
        if !plan.deletes.isEmpty {
            try run(
                "DELETE FROM reminders WHERE id IN (\(Self.placeholders(rows: plan.deletes.count, columns: 1)))",
                arguments: StatementArguments(plan.deletes))
        }
        return scheduled
    }

    func cancelPlant(_ plantID: String, owner: String) throws {
        // Nothing of the plant stays: notifications about it alone (sent or not, with their
        // attempts) and its reminders in every state.
        try run(
            """
            DELETE FROM sends WHERE owner = ? AND id IN (
                SELECT sendID FROM sendReminders JOIN reminders ON reminders.id = sendReminders.reminderID WHERE reminders.owner = ? AND reminders.plantID = ?)
              AND NOT EXISTS (SELECT 1 FROM sendReminders other JOIN reminders r ON r.id = other.reminderID
                              WHERE other.sendID = sends.id AND r.plantID != ?)
            """, arguments: [owner, owner, plantID, plantID])
        try run("DELETE FROM reminders WHERE owner = ? AND plantID = ?", arguments: [owner, plantID])
    }

    func pendingReminders(ids: [Int64]) throws -> [ReminderRow] {
        var rows: [ReminderRow] = []
        for start in stride(from: 0, to: ids.count, by: 500) {
            let chunk = Array(ids[start..<min(start + 500, ids.count)])
            rows += try Row.fetchAll(
                db, sql: "SELECT * FROM reminders WHERE state = 'pending' AND id IN (\(chunk.map { _ in "?" }.joined(separator: ",")))",
                arguments: StatementArguments(chunk)
            ).map(SQLiteReminderStore.reminder)
        }
        return rows
    }

    func pendingReminders(owner: String, firingAfter after: Date, through: Date) throws -> [ReminderRow] {
        try Row.fetchAll(
            try db.cachedStatement(sql: "SELECT * FROM reminders WHERE owner = ? AND state = 'pending' AND fireAt > ? AND fireAt <= ?"),
            arguments: [owner, after.timeIntervalSince1970, through.timeIntervalSince1970]
        ).map(SQLiteReminderStore.reminder)
    }

    func pendingSummary(owner: String) throws -> (count: Int, lastFireAt: Date?) {
        let row = try Row.fetchOne(
            try db.cachedStatement(sql: "SELECT COUNT(*) AS count, MAX(fireAt) AS last FROM reminders WHERE owner = ? AND state = 'pending'"),
            arguments: [owner])
        return (row?["count"] ?? 0, (row?["last"] as Double?).map(Date.init(timeIntervalSince1970:)))
    }

    func upcoming(owner: String, limit: Int) throws -> [Reminders.Reminder] {
        try Row.fetchAll(
            try db.cachedStatement(sql: "SELECT * FROM reminders WHERE owner = ? AND state IN ('pending', 'sending') ORDER BY fireAt, id LIMIT ?"),
            arguments: [owner, limit]
        ).map { SQLiteReminderStore.reminder($0).reminder }
    }

    func failedSends(owner: String, limit: Int) throws -> [Reminders.Failure] {
        try Row.fetchAll(
            db,
            sql: """
                SELECT reminders.*, sends.deviceID, sends.attempts AS attempts, sends.lastError AS lastError, sends.nextAttempt AS at FROM sends
                JOIN sendReminders ON sendReminders.sendID = sends.id JOIN reminders ON reminders.id = sendReminders.reminderID
                WHERE sends.owner = ? AND sends.state = 'failed' ORDER BY sends.nextAttempt DESC LIMIT ?
                """, arguments: [owner, limit]
        ).map { row in
            Reminders.Failure(
                reminder: SQLiteReminderStore.reminder(row).reminder, deviceID: row["deviceID"], attempts: row["attempts"],
                lastError: row["lastError"] ?? "", at: Date(timeIntervalSince1970: row["at"]))
        }
    }

    func staleReminders(owner: String, limit: Int) throws -> [(reminder: Reminders.Reminder, at: Date)] {
        try Row.fetchAll(
            try db.cachedStatement(sql: "SELECT * FROM reminders WHERE owner = ? AND state = 'stale' ORDER BY updatedAt DESC LIMIT ?"),
            arguments: [owner, limit]
        ).map { (SQLiteReminderStore.reminder($0).reminder, Date(timeIntervalSince1970: $0["updatedAt"])) }
    }

    func lockOwner(_ owner: String) throws -> Bool { true } // one writer at a time already

    func waitForOwner(_ owner: String) throws {}

    func setState(_ state: Reminders.State, ofReminders ids: [Int64], at: Date) throws {
        for id in ids {
            try run("UPDATE reminders SET state = ?, updatedAt = ? WHERE id = ?", arguments: [state.rawValue, at.timeIntervalSince1970, id])
        }
    }

    // MARK: Sends

    func insertSend(owner: String, deviceID: String, notification: ReminderNotification, reminderIDs: [Int64], at: Date) throws -> Int64? {
        try run(
            """
            INSERT OR IGNORE INTO sends (owner, deviceID, idempotencyKey, notification, nextAttempt, state, createdAt) VALUES (?, ?, ?, ?, ?, 'pending', ?)
            """, arguments: [owner, deviceID, notification.id, Data(try codec.encode(notification)), at.timeIntervalSince1970, at.timeIntervalSince1970])
        guard db.changesCount > 0 else { return nil }
        let send = db.lastInsertedRowID
        for reminderID in reminderIDs {
            try run("INSERT INTO sendReminders (sendID, reminderID) VALUES (?, ?)", arguments: [send, reminderID])
        }
        return send
    }

    func pendingSend(id: Int64) throws -> (send: StoredSend, device: DeviceRecord?)? {
        guard let row = try Row.fetchOne(try db.cachedStatement(sql: "SELECT * FROM sends WHERE id = ? AND state = 'pending'"), arguments: [id]) else {
            return nil
        }
        let send = StoredSend(
            id: row["id"], owner: row["owner"], deviceID: row["deviceID"],
            notification: try codec.decode(ReminderNotification.self, from: [UInt8](row["notification"] as Data)), attempts: row["attempts"])
        let device = try Row.fetchOne(try db.cachedStatement(sql: "SELECT * FROM devices WHERE id = ?"), arguments: [send.deviceID]).map(
            SQLiteReminderStore.device)
        return (send, device)
    }

    func sendExists(id: Int64) throws -> Bool {
        try Bool.fetchOne(try db.cachedStatement(sql: "SELECT 1 FROM sends WHERE id = ?"), arguments: [id]) != nil
    }

    func record(_ attempt: Dispatcher.Attempt, update: SendUpdate, at: Date) throws {
        let (sendID, number, now) = (attempt.sendID, attempt.attempt, at.timeIntervalSince1970)
        try run(
            "INSERT INTO attempts (sendID, attempt, at, outcome, detail) VALUES (?, ?, ?, ?, ?)",
            arguments: [sendID, number, now, attempt.outcome.label, attempt.outcome.detail])
        switch update {
        case .delivered:
            try run("UPDATE sends SET state = 'delivered', attempts = ?, lastError = NULL WHERE id = ?", arguments: [number, sendID])
        case .retry(let retryAt, let reason):
            try run("UPDATE sends SET attempts = ?, nextAttempt = ?, lastError = ? WHERE id = ?", arguments: [number, retryAt, reason, sendID])
        case .failed(let reason, let deactivate):
            try run("UPDATE sends SET state = 'failed', attempts = ?, lastError = ?, nextAttempt = ? WHERE id = ?", arguments: [number, reason, now, sendID])
            if deactivate { try deactivateDevice(id: attempt.deviceID, reason: reason) }
        }
    }

    func settleReminders(ofSend sendID: Int64, at: Date) throws {
        // One by primary key (a statement over every reminder being sent would scan them all).
        let reminderIDs = try Int64.fetchAll(try db.cachedStatement(sql: "SELECT reminderID FROM sendReminders WHERE sendID = ?"), arguments: [sendID])
        for reminderID in reminderIDs {
            try run(
                """
                UPDATE reminders SET updatedAt = ?, state = CASE
                    WHEN EXISTS (SELECT 1 FROM sendReminders s CROSS JOIN sends ON sends.id = s.sendID WHERE s.reminderID = reminders.id AND sends.state = 'delivered') THEN 'delivered'
                    ELSE 'failed' END
                WHERE id = ? AND state = 'sending'
                  AND NOT EXISTS (SELECT 1 FROM sendReminders s CROSS JOIN sends ON sends.id = s.sendID WHERE s.reminderID = reminders.id AND sends.state = 'pending')
                """, arguments: [at.timeIntervalSince1970, reminderID])
        }
    }
}
