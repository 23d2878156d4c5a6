import CanopyMessages
import Foundation

/// What canopy-remind keeps, as the operations its rules need: no SQL outside the types that
/// implement it: ``SQLiteReminderStore`` (SQLite, the embedded default) and
/// ``PostgresReminderStore`` (PostgreSQL, which replicas share).
///
/// Reads and writes happen in transactions: ``read(_:)`` and ``write(_:)`` hand their body a
/// view of the data (``ReminderReads``, ``ReminderWrites``) that only lives for the
/// transaction. A write that throws changes nothing. Every operation on a person's data names
/// its owner, except the dispatcher's, which go by the row ids it holds.
protocol ReminderStoring: Sendable {
    /// Clears what an erasure (a person's account deleted) left beyond its deleted rows: the
    /// write-ahead log's copies of them (SQLite, at once), the dead rows (PostgreSQL, a
    /// `VACUUM` soon after).
    func eraseResidue()

    func read<T>(_ body: (any ReminderReads) throws -> T) throws -> T
    func write<T>(_ body: (any ReminderWrites) throws -> T) throws -> T
    /// ``read(_:)`` that waits for the store without holding a thread of the caller's.
    func read<T: Sendable>(_ body: @escaping @Sendable (any ReminderReads) throws -> T) async throws -> T
    /// ``write(_:)`` that waits for the writer without holding a thread: syncs of many
    /// people at once queue for the one writer, and blocked threads of Swift's small
    /// cooperative pool would stall every other request meanwhile.
    func write<T: Sendable>(_ body: @escaping @Sendable (any ReminderWrites) throws -> T) async throws -> T

    /// Hands every pending reminder's id and time to `body`, one by one (a cursor, so a
    /// million of them never exist at once): what the dispatcher loads at start.
    func forEachPending(_ body: (_ id: Int64, _ fireAt: Double) -> Void) throws
    /// Every send not yet finished and when it is next tried.
    func pendingSends() throws -> [(id: Int64, nextAttempt: Double)]

    // MARK: Replicas

    /// Whether several replicas share this store: the dispatcher then claims each send before
    /// trying it (``claimSend(id:now:until:)``) and looks for work a replica that stopped left
    /// behind (``orphans(dueBefore:now:)``).
    var sharedWithReplicas: Bool { get }
    /// Leases a pending send to the caller for one attempt, until `until`: false when it is
    /// finished, gone or leased to another replica whose lease has not ended. (With one
    /// process, a pending send is always the caller's.)
    func claimSend(id: Int64, now: Date, until: Date) throws -> Bool
    /// Work nobody is doing: pending reminders that were due before `before`, and pending
    /// sends due before `before` whose lease (if any) ended by `now`.
    func orphans(dueBefore before: Date, now: Date) throws -> (reminders: [(id: Int64, fireAt: Double)], sends: [(id: Int64, nextAttempt: Double)])
    /// Pending sends due before `before` leased to another replica that is gone (its process
    /// ended): what a replica busy with a backlog of its own still takes over at once.
    func sendsOfGoneReplicas(dueBefore before: Date) throws -> [(id: Int64, nextAttempt: Double)]
}

/// What a read transaction sees.
protocol ReminderReads {
    // Devices
    func devices(owner: String, activeOnly: Bool) throws -> [DeviceRecord]
    func device(owner: String, id: String) throws -> DeviceRecord?
    /// The id of the owner's device on `channel` at `address`, if registered.
    func deviceID(owner: String, channel: Reminders.Channel, address: String) throws -> String?
    func deviceCount(owner: String) throws -> Int

    // Reminders
    /// Every reminder of the owner, in any state, as a sync compares them.
    func knownReminders(owner: String) throws -> [KnownReminder]
    /// The reminders among `ids` still pending.
    func pendingReminders(ids: [Int64]) throws -> [ReminderRow]
    /// The owner's pending reminders firing after `after` and up to `through`.
    func pendingReminders(owner: String, firingAfter after: Date, through: Date) throws -> [ReminderRow]
    /// How many reminders of the owner are pending, and when the last one fires.
    func pendingSummary(owner: String) throws -> (count: Int, lastFireAt: Date?)
    /// The owner's reminders waiting or being sent, in the order they fire.
    func upcoming(owner: String, limit: Int) throws -> [Reminders.Reminder]
    /// Sends that gave up, newest first, one failure per reminder they carried.
    func failedSends(owner: String, limit: Int) throws -> [Reminders.Failure]
    /// Reminders recorded as stale, newest first.
    func staleReminders(owner: String, limit: Int) throws -> [(reminder: Reminders.Reminder, at: Date)]

    // Sends
    /// A send still pending, with its device (nil when the device was removed).
    func pendingSend(id: Int64) throws -> (send: StoredSend, device: DeviceRecord?)?
    func sendExists(id: Int64) throws -> Bool

    // The dispatcher's batches (PostgreSQL: one statement each; SQLite: one at a time)
    /// Every pending reminder of `owners` firing after `after` and up to `through`.
    func pendingReminders(owners: [String], firingAfter after: Date, through: Date) throws -> [ReminderRow]
    /// The active devices of `owners`, by owner, each owner's in the order they registered.
    func activeDevices(owners: [String]) throws -> [String: [DeviceRecord]]
    /// Which of `ids` are sends that still exist.
    func existingSends(ids: [Int64]) throws -> Set<Int64>
    /// ``pendingSummary(owner:)`` of each of `owners` that has a pending reminder.
    func pendingSummaries(owners: [String]) throws -> [String: (count: Int, lastFireAt: Date?)]
}

extension ReminderReads {
    func pendingReminders(owners: [String], firingAfter after: Date, through: Date) throws -> [ReminderRow] {
        try owners.flatMap { try pendingReminders(owner: $0, firingAfter: after, through: through) }
    }

    func activeDevices(owners: [String]) throws -> [String: [DeviceRecord]] {
        var devices: [String: [DeviceRecord]] = [:]
        for owner in owners { devices[owner] = try self.devices(owner: owner, activeOnly: true) }
        return devices
    }

    func existingSends(ids: [Int64]) throws -> Set<Int64> {
        Set(try ids.filter { try sendExists(id: $0) })
    }

    func pendingSummaries(owners: [String]) throws -> [String: (count: Int, lastFireAt: Date?)] {
        var summaries: [String: (count: Int, lastFireAt: Date?)] = [:]
        for owner in owners {
            let summary = try pendingSummary(owner: owner)
            if summary.count > 0 { summaries[owner] = summary }
        }
        return summaries
    }
}

/// What a write transaction can change (it reads too).
protocol ReminderWrites: ReminderReads {
    /// Makes a sync's changes; returns the reminders whose time is new or changed.
    func apply(_ plan: SyncPlan, owner: String, now: Date) throws -> [(id: Int64, fireAt: Double)]
    /// Deletes every reminder of the plant, and every send that carried only its reminders.
    func cancelPlant(_ plantID: String, owner: String) throws
    /// Deletes everything of the person: devices, reminders, sends with their attempts.
    func forgetPerson(_ owner: String) throws

    func reactivateDevice(id: String, name: String?, secret: String?, accessToken: String?) throws
    func insertDevice(_ device: Reminders.Device, owner: String, secret: String?, accessToken: String?) throws
    func removeDevice(owner: String, id: String) throws
    func deactivateDevice(id: String, reason: String) throws

    /// Makes the caller the one replica turning the owner's due reminders into sends until
    /// the transaction ends; false when another replica is at it now (it takes them).
    func lockOwner(_ owner: String) throws -> Bool
    /// Waits until no other transaction changes the owner's reminders, sends or devices, and
    /// holds them until this one ends: what a sync, a registration and a recorded attempt
    /// read is then what they change (with replicas; one SQLite writer is alone already).
    func waitForOwner(_ owner: String) throws

    func setState(_ state: Reminders.State, ofReminders ids: [Int64], at: Date) throws
    /// Records a notification to a device carrying `reminderIDs`; nil when the same key was
    /// already recorded for that device (it is being or was sent).
    func insertSend(owner: String, deviceID: String, notification: ReminderNotification, reminderIDs: [Int64], at: Date) throws -> Int64?
    /// Records an attempt and what it made of its send (``DispatchPlan/update(after:attempt:now:jitter:)``),
    /// ending its lease.
    func record(_ attempt: Dispatcher.Attempt, update: SendUpdate, at: Date) throws
    /// The send's reminders that no send still waits for: delivered when any device took
    /// them, else failed.
    func settleReminders(ofSend sendID: Int64, at: Date) throws

    // The dispatcher's batches (PostgreSQL: a statement or two each; SQLite: one at a time)
    /// Of `owners`, those whose lock (``lockOwner(_:)``) this transaction holds now.
    func lockOwners(_ owners: [String]) throws -> Set<String>
    /// ``insertSend(owner:deviceID:notification:reminderIDs:at:)`` for each of `sends`, in
    /// order; with replicas, each leased to this replica until `leasedUntil` (its first
    /// attempt needs no claim).
    func insertSends(_ sends: [NewSend], at: Date, leasedUntil: Date) throws -> [Int64?]
    /// Before recording attempts of `sendIDs`: takes the sends' rows and answers which still
    /// exist (a plant deleted meanwhile takes its sends with it).
    func lockForRecording(sendIDs: [Int64]) throws -> Set<Int64>
    /// ``record(_:update:at:)`` for each.
    func record(_ attempts: [(attempt: Dispatcher.Attempt, update: SendUpdate)], at: Date) throws
    /// ``settleReminders(ofSend:at:)`` for each.
    func settleReminders(ofSends ids: [Int64], at: Date) throws
}

extension ReminderWrites {
    func lockOwners(_ owners: [String]) throws -> Set<String> {
        Set(try owners.filter { try lockOwner($0) })
    }

    func insertSends(_ sends: [NewSend], at: Date, leasedUntil: Date) throws -> [Int64?] {
        try sends.map { try insertSend(owner: $0.owner, deviceID: $0.deviceID, notification: $0.notification, reminderIDs: $0.reminderIDs, at: at) }
    }

    func lockForRecording(sendIDs: [Int64]) throws -> Set<Int64> {
        try existingSends(ids: sendIDs) // one writer at a time already
    }

    func record(_ attempts: [(attempt: Dispatcher.Attempt, update: SendUpdate)], at: Date) throws {
        for (attempt, update) in attempts { try record(attempt, update: update, at: at) }
    }

    func settleReminders(ofSends ids: [Int64], at: Date) throws {
        for id in ids { try settleReminders(ofSend: id, at: at) }
    }
}

/// A notification to record as a send (``ReminderWrites/insertSends(_:at:leasedUntil:)``).
struct NewSend: Sendable, Equatable {
    var owner: String
    var deviceID: String
    var notification: ReminderNotification
    var reminderIDs: [Int64]
}

/// A device with what delivering needs (its secrets included).
struct DeviceRecord: Sendable, Equatable {
    var device: Reminders.Device
    var owner: String
    var secret: String?
    var accessToken: String?
}

/// A reminder row as the dispatcher handles it.
struct ReminderRow: Sendable, Equatable {
    var id: Int64
    var owner: String
    var reminder: Reminders.Reminder
    var fireAt: Date
}

/// A reminder as a sync compares it with the window: which occurrence, and what may change.
struct KnownReminder: Sendable, Equatable {
    var id: Int64
    var occurrence: SyncPlan.Occurrence
    var pending: Bool
    var fireAt: Double
    var title: String
}

/// A send as the dispatcher tries it.
struct StoredSend: Sendable, Equatable {
    var id: Int64
    var owner: String
    var deviceID: String
    var notification: ReminderNotification
    /// Attempts made so far.
    var attempts: Int
}

/// What an attempt makes of its send.
enum SendUpdate: Sendable, Equatable {
    /// A channel took it.
    case delivered
    /// Try again at `at` (seconds since 1970).
    case retry(at: Double, reason: String)
    /// Given up: a dead letter; the device deactivated too when it is gone.
    case failed(reason: String, deactivateDevice: Bool)
}
