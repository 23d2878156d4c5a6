import CanopyMessages
import Foundation

/// What canopy-care keeps, as the operations its rules need: no SQL outside the type that
/// implements it: ``SQLiteCareStore`` (SQLite, the embedded default) and ``PostgresCareStore``
/// (PostgreSQL, which replicas share).
///
/// Reads and writes happen in transactions: ``read(_:)`` and ``write(_:)`` hand their body a
/// view of the data (``CareReads``, ``CareWrites``) that only lives for the transaction.
/// A write that throws changes nothing. Every operation on a person's data names its owner.
/// The outbox's own operations are transactions of their own.
protocol CareStoring: Sendable {
    /// Clears what an erasure (a person's account deleted) left beyond its deleted rows: the
    /// write-ahead log's copies of them (SQLite, at once), the dead rows (PostgreSQL, a
    /// `VACUUM` soon after).
    func eraseResidue()

    /// The species catalog plants take their care profile from.
    var catalog: Catalog { get }

    /// Runs `body` in a read transaction: it sees one state of the data.
    func read<T>(_ body: (any CareReads) throws -> T) throws -> T
    /// Runs `body`, which writes `owner`'s data, in a write transaction: all of it is stored,
    /// or nothing. One person's writes run one after the other (PostgreSQL: a lock on the
    /// person taken first), so two phones changing one task at once both get an answer, the
    /// second on what the first wrote, never a conflict.
    func write<T>(owner: String, _ body: (any CareWrites) throws -> T) throws -> T

    // MARK: The outbox

    /// Up to `limit` follow-ups due at `now`, in the order they were written, leaving out
    /// any behind an earlier follow-up of its lane (owner, service) that waits for a retry or
    /// is on its way from another replica. With replicas sharing the store, the follow-ups
    /// read are leased to the caller until it settles them, its process ends (PostgreSQL sees
    /// its connection go: ``PostgresStore/holderIsGone(_:)``), or ``FollowUp/lease`` passes
    /// (a replica that hangs, or lost the network), and another replica sends them.
    func dueFollowUps(now: Date, limit: Int) async throws -> [FollowUp]
    /// Records what became of sent follow-ups, in one transaction: confirmed ones are deleted
    /// (only when their generation is still the one sent), failed ones are put off until
    /// `now` plus their backoff, returned ones (not tried) are free to go again.
    func settle(_ outcomes: [FollowUp.Outcome], now: Date) async throws
    /// When the earliest follow-up that is not due at `now` comes due, if there is one: when
    /// the outbox next has something to send (one due at `now` was either read by the pass
    /// just made or waits behind a retry, which comes due later).
    func nextFollowUpDue(after now: Date) async throws -> Date?
    /// How many follow-ups wait, and when the oldest was written.
    func pendingFollowUps() async throws -> (count: Int, oldest: Date?)
    /// Calls `wake` after every commit that adds or changes a follow-up (by any replica),
    /// until `stop` is called on what it returns; returns once it observes.
    func observeFollowUps(_ wake: @escaping @Sendable () -> Void) async -> any FollowUpObservation
}

/// A ``CareStoring/observeFollowUps(_:)`` in force.
protocol FollowUpObservation: Sendable {
    func stop()
}

/// What a read transaction sees.
protocol CareReads {
    /// The plant with its effective profile (its override, else the catalog's), or nil
    /// when the owner has no such plant.
    func plant(owner: String, id: String) throws -> Care.Plant?
    /// Whether the owner has a plant with this id (cheaper than reading it).
    func hasPlant(owner: String, id: String) throws -> Bool
    /// Whether anyone has a plant with this id.
    func plantIDTaken(_ id: String) throws -> Bool
    func plantCount(owner: String) throws -> Int
    /// Every plant of the owner, with profiles.
    func plants(owner: String) throws -> [Care.Plant]
    /// A page of the owner's plants matching `request` (filtered, sorted and paged by the
    /// database), without profiles, and how many match in all.
    func plants(owner: String, matching request: Care.ListPlants.Request) throws -> Care.ListPlants.Reply
    /// The counts of ``Care/Statistics``: plants added from `monthStart`, tasks showing
    /// from `now` to `weekEnd`, tasks showing before `now`.
    func statistics(owner: String, monthStart: Date, now: Date, weekEnd: Date) throws -> Care.Statistics.Reply
    /// The owner's preferences, or the defaults.
    func preferences(owner: String) throws -> Care.Preferences
    /// ``plantCount(owner:)`` and ``preferences(owner:)`` together, what adding a plant reads
    /// (in one round trip where the store can).
    func plantCountAndPreferences(owner: String) throws -> (plants: Int, preferences: Care.Preferences)

    func task(owner: String, id: String) throws -> StoredTask?
    /// The tasks of one plant.
    func tasks(owner: String, plantID: String) throws -> [StoredTask]
    /// The owner's tasks in the order they show, those showing before `before` when given,
    /// at most `limit`.
    func tasks(owner: String, showingBefore before: Date?, limit: Int) throws -> [StoredTask]
    /// The plant's task that shows first, if it has any (an indexed look-up).
    func nextTask(owner: String, plantID: String) throws -> StoredTask?
    /// How many custom tasks the plant has.
    func customTaskCount(owner: String, plantID: String) throws -> Int
    /// The plant's care log, newest first, at most `limit` entries.
    func careLog(owner: String, plantID: String, limit: Int) throws -> [Care.LogEntry]
}

/// What a write transaction can change (it reads too).
protocol CareWrites: CareReads {
    /// Writes a plant (new or changed) with every derived column, its version 1 when new and
    /// one more when changed; `override` is the care profile the person set, if any. Its
    /// tasks and log stay. Returns the plant as stored (its profile, its version).
    @discardableResult
    func save(_ plant: Care.Plant, owner: String, override: Care.Profile?) throws -> Care.Plant
    /// Deletes a plant with its tasks and care log.
    func deletePlant(owner: String, id: String) throws
    func savePreferences(_ preferences: Care.Preferences, owner: String) throws
    func deletePreferences(owner: String) throws
    /// Writes a task (new or changed), its snooze cleared.
    func saveTask(_ task: StoredTask) throws
    func deleteTask(owner: String, id: String) throws
    /// ``saveTask(_:)`` for each, in one statement where the store can.
    func saveTasks(_ tasks: [StoredTask]) throws
    /// ``deleteTask(owner:id:)`` for each, in one statement where the store can.
    func deleteTasks(owner: String, ids: [String]) throws
    /// Shows the task at `until`, its rule unchanged.
    func snoozeTask(owner: String, id: String, until: Date) throws
    /// Logs care done.
    func logCare(owner: String, plantID: String, kind: Care.TaskKind, at: Date) throws
    /// Records a caller's idempotency key (`tasks.complete`, `tasks.skip`) as used at `now`;
    /// false when the owner used it within ``RequestKeys/lifetime`` already (the work is done).
    /// Keys past their lifetime go, and an owner keeps at most ``RequestKeys/maximumPerOwner``.
    func useRequestKey(owner: String, key: String, now: Date) throws -> Bool
    /// Forgets every idempotency key of the owner (their account deleted).
    func deleteRequestKeys(owner: String) throws
    /// Records a follow-up for another service, delivered by the outbox until confirmed.
    func enqueue(owner: String, service: String, operation: String, body: [UInt8], now: Date) throws
    /// Asks for the owner's reminder window to be handed over again; one pending request per
    /// owner is enough (the window is read when it is sent). A pending one is marked asked
    /// again (its generation bumped): it may be on its way with a window read before this
    /// change, and is then sent again rather than deleted (see ``Outbox``).
    func enqueueReminderSync(owner: String, now: Date) throws
}

extension CareWrites {
    // One at a time (SQLite: each a prepared statement on the one connection, no round trip).
    func saveTasks(_ tasks: [StoredTask]) throws {
        for task in tasks { try saveTask(task) }
    }

    func deleteTasks(owner: String, ids: [String]) throws {
        for id in ids { try deleteTask(owner: owner, id: id) }
    }
}

/// A task as kept: what the person sees, and what its rule needs to move on.
struct StoredTask: Sendable, Equatable {
    var task: Care.Task
    var owner: String
    /// Where its rule counts from: when the care was last done (or the plant added).
    var anchor: Date
    /// A custom task's interval in days.
    var everyDays: Int?

    /// When it shows: at its snooze, else when due.
    var showAt: Date { task.snoozedUntil ?? task.due }
}

/// One follow-up in the outbox.
struct FollowUp: Sendable, Equatable {
    var id: Int64
    var owner: String
    var service: String
    var operation: String
    var body: [UInt8]
    /// Attempts that failed so far.
    var attempts: Int
    /// Bumped when a change asks again for a pending reminder sync.
    var generation: Int64

    /// What became of one follow-up.
    enum Outcome: Sendable, Equatable {
        case confirmed(id: Int64, generation: Int64)
        case failed(id: Int64, attempts: Int, error: String)
        /// Not tried (its lane stopped at a failure, or the outbox is shutting down).
        case returned(id: Int64)
    }

    /// How long a replica holds the follow-ups it read: longer than a lane of them takes
    /// (5 s a call at most), short enough that a replica that hangs mid-pass delays its
    /// follow-ups by no more than this (one killed delays them by one outbox interval).
    static let lease: TimeInterval = 60

    /// How long a follow-up that failed `attempts` times before waits: 1, 2, 4 … up to 300 s.
    static func backoff(afterAttempts attempts: Int) -> TimeInterval {
        min(300, pow(2, Double(attempts)))
    }
}

extension CareReads {
    func plantCountAndPreferences(owner: String) throws -> (plants: Int, preferences: Care.Preferences) {
        (try plantCount(owner: owner), try preferences(owner: owner))
    }
}

/// Callers' idempotency keys canopy-care keeps (`requestKeys`): a repeat of a keyed
/// `tasks.complete` or `tasks.skip` within a day changes nothing.
enum RequestKeys {
    static let lifetime: TimeInterval = 24 * 3600
    static let maximumPerOwner = 10_000
}

/// The columns a plant is read from, on either store (``ColumnPositions``).
enum PlantColumn: Int, CaseIterable {
    case id, scientificName, commonNames, family, genus, customName, location, notes, favourite, imageIDs, source, confidence
    case dateIdentified, dateAdded, profileOverride, version
}

/// The columns a task is read from, on either store.
enum TaskColumn: Int, CaseIterable {
    case id, plantID, kind, title, due, snoozedUntil, owner, anchor, everyDays
}
