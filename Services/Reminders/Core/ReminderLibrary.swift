import CanopyMessages
import CanopyOutbound
import CanopyServiceKit
import Foundation
import GRDB
import Synchronization

/// What canopy-remind does for requests, one method per operation. Every method takes the
/// owner (the request's principal); nothing is read or changed for anyone else.
final class ReminderLibrary: Sendable {
    /// The time it goes by (`--clock`).
    let clock: ServiceClock
    let store: ReminderStore
    /// Hosts webhooks and ntfy topics may name even on loopback or private addresses.
    let allowedHosts: Set<String>
    /// The channels this service delivers through; devices of others are refused.
    let channels: Set<Reminders.Channel>

    init(store: ReminderStore, allowedHosts: Set<String> = [], channels: Set<Reminders.Channel> = Set(Reminders.Channel.allCases),
         clock: ServiceClock = .system) {
        self.clock = clock
        self.store = store
        self.allowedHosts = allowedHosts
        self.channels = channels
    }

    // MARK: - The window from canopy-care

    /// Replaces the owner's pending reminders with `tasks` by difference: an occurrence
    /// already pending keeps its reminder (its title and snooze brought up to date), a new one
    /// is added, a pending one no longer in the window is dropped, and one already sent (or
    /// given up) for that due time is left as it is, so it is never sent twice.
    ///
    /// One write transaction plans and makes the changes (one that changes nothing writes
    /// nothing). It waits for the store without holding a thread (GRDB's async write): syncs
    /// of many people at once queue for the one writer, and blocked threads of Swift's small
    /// cooperative pool would stall every other request meanwhile. (A read first, to skip the
    /// writer when nothing changed, and running the whole sync on a Dispatch thread were both
    /// slower, measured: docs/PERFORMANCE.md.)
    ///
    /// - Returns: the reminders now pending whose time is new or changed, for the dispatcher.
    func sync(_ tasks: [Care.Task], owner: String, now: Date? = nil) async throws -> [(id: Int64, fireAt: Double)] {
        let now = now ?? clock.now()
        return try await store.database.write { db in
            let plan = try Self.plan(tasks, owner: owner, db: db)
            let updatedAt = now.timeIntervalSince1970
            var scheduled: [(Int64, Double)] = []
            // One statement for each kind of change, not one per occurrence: the writer is the
            // one thing syncs of many people queue for.
            if !plan.updates.isEmpty {
                var values: [(any DatabaseValueConvertible)?] = [updatedAt]
                for (id, task) in plan.updates {
                    let fireAt = (task.snoozedUntil ?? task.due).timeIntervalSince1970
                    values += [id, fireAt, task.title]
                    scheduled.append((id, fireAt))
                }
                try db.run("""
                    UPDATE reminders SET fireAt = changed.column2, title = changed.column3, updatedAt = ?
                    FROM (VALUES \(Self.placeholders(rows: plan.updates.count, columns: 3))) AS changed WHERE reminders.id = changed.column1
                    """, arguments: StatementArguments(values))
            }
            if !plan.inserts.isEmpty {
                var values: [(any DatabaseValueConvertible)?] = []
                values.reserveCapacity(plan.inserts.count * 8)
                for task in plan.inserts {
                    values += [owner, task.id, task.due.timeIntervalSince1970, task.plantID, task.kind.rawValue, task.title,
                               (task.snoozedUntil ?? task.due).timeIntervalSince1970, updatedAt]
                }
                let inserted = try Row.fetchCursor(try db.cachedStatement(sql: """
                    INSERT INTO reminders (owner, taskID, due, plantID, kind, title, fireAt, updatedAt, state)
                    VALUES \(Self.placeholders(rows: plan.inserts.count, columns: 8, then: "'pending'")) RETURNING id, fireAt
                    """), arguments: StatementArguments(values))
                while let row = try inserted.next() { scheduled.append((row[0], row[1])) }
            }
            if !plan.deletes.isEmpty {
                try db.run("DELETE FROM reminders WHERE id IN (\(Self.placeholders(rows: plan.deletes.count, columns: 1)))",
                           arguments: StatementArguments(plan.deletes))
            }
            return scheduled
        }
    }

    /// `(?, ?), (?, ?)` for 2 rows of 2 columns, each row ending in `literal` when given (a window has at most 128 occurrences, so
    /// each statement has at most 128 shapes, each prepared once per connection).
    static func placeholders(rows: Int, columns: Int, then literal: String? = nil) -> String {
        let row = "(" + (Array(repeating: "?", count: columns) + (literal.map { [$0] } ?? [])).joined(separator: ", ") + ")"
        return Array(repeating: row, count: rows).joined(separator: ", ")
    }

    /// What a sync changes: pending reminders to update (title or time), occurrences to add,
    /// pending reminders to drop.
    struct Plan {
        var updates: [(Int64, Care.Task)] = []
        var inserts: [Care.Task] = []
        var deletes: [Int64] = []
        var isEmpty: Bool { updates.isEmpty && inserts.isEmpty && deletes.isEmpty }
    }

    /// An occurrence: a task at a due time (seconds since 1970, as stored).
    struct Occurrence: Hashable {
        var taskID: String
        var due: Double
    }

    static func plan(_ tasks: [Care.Task], owner: String, db: Database) throws -> Plan {
        var existing: [Occurrence: (id: Int64, pending: Bool, fireAt: Double, title: String)] = [:]
        // By column index, through a cursor: a window is read twice per sync.
        let rows = try Row.fetchCursor(try db.cachedStatement(sql: "SELECT taskID, due, id, state, fireAt, title FROM reminders WHERE owner = ?"),
                                       arguments: [owner])
        while let row = try rows.next() {
            existing[Occurrence(taskID: row[0], due: row[1])] = (row[2], (row[3] as String) == "pending", row[4], row[5])
        }
        var plan = Plan()
        var wanted = Set<Occurrence>()
        wanted.reserveCapacity(tasks.count)
        for task in tasks {
            let key = Occurrence(taskID: task.id, due: task.due.timeIntervalSince1970)
            guard wanted.insert(key).inserted else { continue } // the same occurrence twice in one window
            if let known = existing[key] {
                let fireAt = (task.snoozedUntil ?? task.due).timeIntervalSince1970
                if known.pending, known.fireAt != fireAt || known.title != task.title { plan.updates.append((known.id, task)) }
            } else {
                plan.inserts.append(task)
            }
        }
        for (key, known) in existing where known.pending && !wanted.contains(key) {
            plan.deletes.append(known.id)
        }
        return plan
    }

    /// Forgets a deleted plant: every reminder of it, in any state, and every notification
    /// that carried only its reminders (sent or not, with their attempts). A digest that also
    /// named another plant stays for that plant (its reminders of this one are unlinked).
    func cancel(plantID: String, owner: String) throws {
        try store.database.write { db in
            // Nothing of the plant stays: notifications about it alone (sent or not, with their
            // attempts) and its reminders in every state.
            try db.run("""
                DELETE FROM sends WHERE owner = ? AND id IN (
                    SELECT sendID FROM sendReminders JOIN reminders ON reminders.id = sendReminders.reminderID WHERE reminders.owner = ? AND reminders.plantID = ?)
                  AND NOT EXISTS (SELECT 1 FROM sendReminders other JOIN reminders r ON r.id = other.reminderID
                                  WHERE other.sendID = sends.id AND r.plantID != ?)
                """, arguments: [owner, owner, plantID, plantID])
            try db.run("DELETE FROM reminders WHERE owner = ? AND plantID = ?", arguments: [owner, plantID])
        }
    }

    // MARK: - Devices

    func register(_ request: Reminders.RegisterDevice.Request, owner: String, now: Date? = nil) throws -> Reminders.Device {
        let now = now ?? clock.now()
        guard channels.contains(request.channel) else {
            throw CanopyError(.badRequest, "this Canopy does not deliver through \(request.channel.rawValue) (its operator has not configured it); register a \(channels.map(\.rawValue).sorted().joined(separator: ", ")) device instead")
        }
        if request.channel == .webhook || request.channel == .ntfy {
            try AddressPolicy(allowedHosts: allowedHosts).check(request.address)
        }
        let address = request.channel == .apns ? request.address.lowercased() : request.address
        return try store.database.write { db in
            if let known = try Row.fetchOne(try db.cachedStatement(sql: "SELECT id FROM devices WHERE owner = ? AND channel = ? AND address = ?"),
                                            arguments: [owner, request.channel.rawValue, address]) {
                let id: String = known["id"]
                try db.run("UPDATE devices SET active = 1, deactivatedReason = NULL, name = ?, secret = ?, accessToken = ? WHERE id = ?",
                               arguments: [request.name, request.secret, request.accessToken, id])
                return try store.device(db, owner: owner, id: id)!.device
            }
            let count = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM devices WHERE owner = ?", arguments: [owner]) ?? 0
            guard count < Reminders.Limits.devices else {
                throw CanopyError(.tooLarge, "you have \(count) devices, the most one person may register; remove one with devices.remove first")
            }
            let id = UUID().uuidString.lowercased()
            try db.run("""
                INSERT INTO devices (id, owner, channel, address, name, secret, accessToken, active, registeredAt) VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?)
                """, arguments: [id, owner, request.channel.rawValue, address, request.name, request.secret, request.accessToken, now.timeIntervalSince1970])
            return try store.device(db, owner: owner, id: id)!.device
        }
    }

    func removeDevice(_ id: String, owner: String) throws {
        try store.database.write { db in
            try db.run("DELETE FROM devices WHERE owner = ? AND id = ?", arguments: [owner, id])
        }
    }

    func devices(owner: String) throws -> [Reminders.Device] {
        try store.database.read { db in try store.devices(db, owner: owner).map(\.device) }
    }

    // MARK: - Reading

    func pending(owner: String, limit: Int) throws -> [Reminders.Reminder] {
        try store.database.read { db in
            try Row.fetchAll(try db.cachedStatement(sql: "SELECT * FROM reminders WHERE owner = ? AND state IN ('pending', 'sending') ORDER BY fireAt, id LIMIT ?"),
                             arguments: [owner, limit]).map { ReminderStore.reminder($0).reminder }
        }
    }

    /// Dead letters: sends that gave up, and reminders that were stale when their time came.
    func failures(owner: String, limit: Int) throws -> [Reminders.Failure] {
        try store.database.read { db in
            let failedSends = try Row.fetchAll(db, sql: """
                SELECT reminders.*, sends.deviceID, sends.attempts AS attempts, sends.lastError AS lastError, sends.nextAttempt AS at FROM sends
                JOIN sendReminders ON sendReminders.sendID = sends.id JOIN reminders ON reminders.id = sendReminders.reminderID
                WHERE sends.owner = ? AND sends.state = 'failed' ORDER BY sends.nextAttempt DESC LIMIT ?
                """, arguments: [owner, limit]).map { row in
                Reminders.Failure(reminder: ReminderStore.reminder(row).reminder, deviceID: row["deviceID"], attempts: row["attempts"],
                                  lastError: row["lastError"] ?? "", at: Date(timeIntervalSince1970: row["at"]))
            }
            let stale = try Row.fetchAll(try db.cachedStatement(sql: "SELECT * FROM reminders WHERE owner = ? AND state = 'stale' ORDER BY updatedAt DESC LIMIT ?"),
                                         arguments: [owner, limit]).map { row in
                Reminders.Failure(reminder: ReminderStore.reminder(row).reminder, deviceID: nil, attempts: 0,
                                  lastError: "not sent: past the staleness limit when its time came (the service was down)",
                                  at: Date(timeIntervalSince1970: row["updatedAt"]))
            }
            return Array((failedSends + stale).sorted { $0.at > $1.at }.prefix(limit))
        }
    }
}

/// Which addresses webhooks and ntfy topics may name when they are registered: http(s) URLs
/// of hosts that resolve, and only to public addresses (``PublicAddress``, the one rule the
/// project has), unless the operator allowed the host. Deliveries check again when they
/// connect (``PinnedHTTP``), so a name that resolves elsewhere later is refused then.
struct AddressPolicy: Sendable {
    let allowedHosts: Set<String>

    func check(_ address: String) throws(CanopyError) {
        guard let url = URL(string: address), let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https",
              let host = url.host?.lowercased(), !host.isEmpty
        else {
            throw CanopyError(.badRequest, "'\(address.prefix(100))' is not an http(s) URL")
        }
        if allowedHosts.contains(host) { return }
        let bare = host.hasPrefix("[") ? String(host.dropFirst().dropLast()) : host
        if bare == "localhost" || bare.hasSuffix(".localhost") || bare.hasSuffix(".local") || bare.hasSuffix(".internal") {
            throw refusal(host)
        }
        let addresses = PinnedHTTP.addresses(of: bare)
        guard !addresses.isEmpty else {
            throw CanopyError(.badRequest, "'\(host.prefix(100))' does not resolve; check the address")
        }
        if addresses.contains(where: PublicAddress.isInternal) { throw refusal(host) }
    }

    private func refusal(_ host: String) -> CanopyError {
        CanopyError(.badRequest, "'\(host)' is a loopback, private or internal address; notifications go to public hosts only (an operator can allow a host with --allow-host)")
    }
}
