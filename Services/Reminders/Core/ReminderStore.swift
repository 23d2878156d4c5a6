import CanopyMessages
import CanopyStore
import Foundation
import GRDB

/// canopy-remind's store: one SQLite file (GRDB, WAL) with each person's devices, their
/// reminders (one per task occurrence), the sends (one notification to one device, kept until
/// the channel accepted it or retries ran out) and every attempt. Every query about a person's
/// data names the owner. Thread-safe.
final class ReminderStore: Sendable {
    let database: DatabasePool
    let codec = MessageCodec()

    init(path: String) throws {
        // Every commit survives the process crashing (what the crash test checks); losing
        // power can roll back the last moments, and then a reminder is sent again (its
        // idempotency key unchanged), never lost from the window canopy-care hands over again.
        database = try SQLiteStore.open(path: path, migrator: Self.migrator)
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(sql: """
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

    // MARK: - Devices

    /// A device with what delivering needs (its secrets included).
    struct DeviceRecord: Sendable, Equatable {
        var device: Reminders.Device
        var owner: String
        var secret: String?
        var accessToken: String?
    }

    static func device(_ row: Row) -> DeviceRecord {
        DeviceRecord(
            device: Reminders.Device(id: row["id"], channel: Reminders.Channel(rawValue: row["channel"]) ?? .log, address: row["address"], name: row["name"],
                                     active: row["active"], registeredAt: Date(timeIntervalSince1970: row["registeredAt"]),
                                     deactivatedReason: row["deactivatedReason"]),
            owner: row["owner"], secret: row["secret"], accessToken: row["accessToken"])
    }

    func devices(_ db: Database, owner: String, activeOnly: Bool = false) throws -> [DeviceRecord] {
        try Row.fetchAll(try db.cachedStatement(sql: activeOnly ? "SELECT * FROM devices WHERE owner = ? AND active = 1 ORDER BY registeredAt, id"
                                                                 : "SELECT * FROM devices WHERE owner = ? ORDER BY registeredAt, id"),
                         arguments: [owner]).map(Self.device)
    }

    func device(_ db: Database, owner: String, id: String) throws -> DeviceRecord? {
        try Row.fetchOne(db, sql: "SELECT * FROM devices WHERE owner = ? AND id = ?", arguments: [owner, id]).map(Self.device)
    }

    // MARK: - Reminders

    /// A reminder row as the dispatcher handles it.
    struct ReminderRow: Sendable, Equatable {
        var id: Int64
        var owner: String
        var reminder: Reminders.Reminder
        var fireAt: Date
    }

    static func reminder(_ row: Row) -> ReminderRow {
        ReminderRow(
            id: row["id"], owner: row["owner"],
            reminder: Reminders.Reminder(taskID: row["taskID"], plantID: row["plantID"], kind: Care.TaskKind(rawValue: row["kind"]) ?? .custom,
                                         title: row["title"], due: Date(timeIntervalSince1970: row["due"]),
                                         state: Reminders.State(rawValue: row["state"]) ?? .pending),
            fireAt: Date(timeIntervalSince1970: row["fireAt"]))
    }

    /// Hands every pending reminder's id and time to `body`, row by row (a cursor, so a
    /// million of them never exist as a million row objects): what the dispatcher loads at start.
    func forEachPending(_ body: (_ id: Int64, _ fireAt: Double) -> Void) throws {
        try database.read { db in
            let rows = try Row.fetchCursor(db, sql: "SELECT id, fireAt FROM reminders WHERE state = 'pending'")
            while let row = try rows.next() { body(row[0], row[1]) }
        }
    }

    /// Every send not yet finished and when it is next tried.
    func pendingSends() throws -> [(id: Int64, nextAttempt: Double)] {
        try database.read { db in
            try Row.fetchAll(db, sql: "SELECT id, nextAttempt FROM sends WHERE state = 'pending'").map { ($0["id"], $0["nextAttempt"]) }
        }
    }
}

extension Database {
    /// Runs a statement prepared once per connection and reused: the dispatcher's and the
    /// sync's statements run thousands of times a second, and parsing each anew was a large
    /// part of their cost.
    func run(_ sql: String, arguments: StatementArguments = StatementArguments()) throws {
        try cachedStatement(sql: sql).execute(arguments: arguments)
    }
}
