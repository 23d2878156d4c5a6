import CanopyMessages
import CanopyServiceKit
import Foundation
import GRDB
import DequeModule
import HeapModule
import Logging
import ServiceLifecycle
import Synchronization

/// The time, and sleeping until a time: the system clock in service, a hand-driven one in tests.
public protocol ReminderClock: Sendable {
    func now() -> Date
    /// Returns at `deadline` (or at once when it passed); throws when cancelled.
    func sleep(until deadline: Date) async throws
}

/// The system's clock.
public struct SystemReminderClock: ReminderClock {
    /// The time it tells (`--clock`); sleeping always takes real time.
    let clock: ServiceClock

    public init(clock: ServiceClock = .system) {
        self.clock = clock
    }

    public func now() -> Date { clock.now() }

    public func sleep(until deadline: Date) async throws {
        let seconds = deadline.timeIntervalSince(clock.now())
        guard seconds > 0 else { return }
        try await Task.sleep(for: .seconds(min(seconds, 3_600)))
    }
}

/// How the dispatcher behaves.
public struct DispatchSettings: Sendable {
    /// Reminders of one person due within this of the first go out as one notification.
    public var digestWindow: Duration = .seconds(600)
    /// A reminder whose time passed longer ago than this (the service was down) is not sent,
    /// and recorded as stale.
    public var staleness: Duration = .seconds(12 * 3_600)
    /// Tries per send before it is given up (a dead letter).
    public var maximumAttempts = 8
    /// The first retry's pause; each next one doubles, up to ``maximumBackoff``, ±20% jitter.
    public var firstBackoff: Duration = .seconds(1)
    public var maximumBackoff: Duration = .seconds(300)
    /// Deliveries in flight at once, in all.
    public var concurrency = 64
    /// Deliveries in flight at once to one destination (a webhook's or ntfy server's host)
    /// not heard from yet, or whose last answer came slowly: a slow or dead receiver holds at
    /// most this many of ``concurrency``.
    public var perDestination = 4
    /// …to one whose last answer came within ``quickAnswer``: a busy receiver that keeps up.
    public var perQuickDestination = 32
    /// …to one whose last answer took longer, or never came.
    public var perSlowDestination = 2
    /// An answer within this counts as quick.
    public var quickAnswer: Duration = .seconds(1)
    /// Ask canopy-care for a fresh window when fewer than this many reminders are pending.
    public var refillBelow = 32
    /// …or when the last pending one is within this.
    public var refillHorizon: Duration = .seconds(86_400)
    /// At most one refill request per person this often.
    public var refillInterval: Duration = .seconds(600)

    public init() {}
}

/// Holds every pending reminder and every unfinished send in memory as (time, row id) in two
/// heaps, loaded from the store at start, and sleeps until the earliest (a sync that brings an
/// earlier one wakes it). When reminders come due it groups each person's reminders due
/// within the digest window into one notification per active device, records the sends, and
/// delivers them; a failed send is retried with exponential backoff and jitter, then recorded
/// as a dead letter. A reminder is marked delivered only after a channel accepted it.
///
/// Deliveries are independent of the timer loop and of one another: each is a task of its
/// own, at most ``DispatchSettings/concurrency`` in flight in all and
/// ``DispatchSettings/perDestination`` to one receiving host (``DeliverySlots``), so a slow or
/// dead webhook costs only its own reminders' time.
public final class Dispatcher: Service, Sendable {
    let store: ReminderStore
    let channels: [Reminders.Channel: any NotificationChannel]
    let clock: any ReminderClock
    let settings: DispatchSettings
    let logger: Logger
    let metrics = ReminderMetrics()
    /// Asks canopy-care for a person's fresh window (and syncs it).
    let refill: (@Sendable (String) async -> Void)?

    private struct Entry: Comparable {
        var at: Double
        var id: Int64
        static func < (lhs: Self, rhs: Self) -> Bool { (lhs.at, lhs.id) < (rhs.at, rhs.id) }
    }

    private struct State {
        var reminders = Heap<Entry>()
        var sends = Heap<Entry>()
        /// When each person's window was last checked for a refill, and the same in the order
        /// of the checks, so that the oldest are forgotten first.
        var lastRefill: [String: Date] = [:]
        var refillChecks = Deque<(owner: String, at: Date)>()
        var loaded = false
        /// Which sends are in flight, in all and per destination.
        var slots: DeliverySlots
        /// Outcomes finished and not yet written, and whether a writer is at it.
        var finished: [Attempt] = []
        var writing = false
    }

    private let state: Mutex<State>
    /// Sends to start, handed from whoever freed a slot to the task group of ``run()``.
    private let starts = AsyncStream<DeliverySlots.Start>.makeStream()
    /// The most refill checks remembered at once (a person checked again sooner than the
    /// refill interval, past it, costs one more call to canopy-care, nothing else).
    static let refillMemory = 65_536
    private let wakeup = Wakeup()

    init(store: ReminderStore, channels: [any NotificationChannel], clock: any ReminderClock = SystemReminderClock(), settings: DispatchSettings = .init(),
         refill: (@Sendable (String) async -> Void)? = nil, logger: Logger) {
        self.store = store
        self.channels = Dictionary(uniqueKeysWithValues: channels.map { ($0.kind, $0) })
        self.clock = clock
        self.settings = settings
        self.refill = refill
        self.logger = logger
        state = Mutex(State(slots: DeliverySlots(total: settings.concurrency, perDestination: settings.perDestination,
                                                 perQuickDestination: settings.perQuickDestination, perSlowDestination: settings.perSlowDestination)))
    }

    /// Reminders whose time is new or changed (from a sync). The dispatcher is woken only
    /// when one is earlier than everything it holds: it sleeps until its earliest entry and
    /// looks again then, and waking it for every sync of a busy hour was a large part of
    /// what syncs cost.
    func schedule(_ entries: [(id: Int64, fireAt: Double)]) {
        guard !entries.isEmpty else { return }
        let earlier = state.withLock { state -> Bool in
            let earliest = [state.reminders.min?.at, state.sends.min?.at].compactMap { $0 }.min()
            for entry in entries { state.reminders.insert(Entry(at: entry.fireAt, id: entry.id)) }
            return earliest.map { earliest in entries.contains { $0.fireAt < earliest } } ?? true
        }
        if earlier { wakeup.signal() }
    }

    /// Reminders and sends held in memory now.
    public var held: (reminders: Int, sends: Int) {
        state.withLock { ($0.reminders.count, $0.sends.count) }
    }

    public func run() async throws {
        var entries: [Entry] = []
        try store.forEachPending { id, fireAt in entries.append(Entry(at: fireAt, id: id)) }
        let reminders = entries.count
        let sends = try store.pendingSends()
        state.withLock { state in
            // Merged with what was scheduled while loading (a sync during start-up): an entry
            // twice does no harm, since a due reminder is checked against the store.
            state.reminders = Heap(entries + state.reminders.unordered)
            state.sends = Heap(sends.map { Entry(at: $0.nextAttempt, id: $0.id) } + state.sends.unordered)
            state.loaded = true
        }
        entries = []
        logger.info("remind.dispatcher.started", metadata: ["remind.pending": "\(reminders)", "remind.sends": "\(sends.count)"])
        await cancelWhenGracefulShutdown {
            // The timer loop is one task; every delivery another, started as slots free up.
            // The loop never waits on a send.
            await withDiscardingTaskGroup { group in
                group.addTask {
                    await self.turnUntilCancelled()
                    self.starts.continuation.finish()
                }
                for await start in self.starts.stream {
                    group.addTask { await self.perform(start) }
                }
            }
        }
    }

    private func turnUntilCancelled() async {
        while !Task.isCancelled {
            do {
                try await turn()
            } catch is CancellationError {
                return
            } catch {
                // The store failed (a full disk?): what was due is back in the heaps for a
                // second from now. Keep turning.
                logger.error("remind.dispatcher.failed", metadata: ["remind.error": "\(error)"])
                try? await clock.sleep(until: clock.now().addingTimeInterval(1))
            }
        }
    }

    /// One pass: send what is due, deliver what is due, else sleep until the next.
    func turn() async throws {
        let now = clock.now().timeIntervalSince1970
        let (dueReminders, dueSends, next) = state.withLock { state -> ([Int64], [Int64], Double?) in
            var reminders: [Int64] = [], sends: [Int64] = []
            while let first = state.reminders.min, first.at <= now { reminders.append(state.reminders.removeMin().id) }
            while let first = state.sends.min, first.at <= now { sends.append(state.sends.removeMin().id) }
            let next = [state.reminders.min?.at, state.sends.min?.at].compactMap { $0 }.min()
            metrics.held(reminders: state.reminders.count, sends: state.sends.count)
            return (reminders, sends, next)
        }
        if dueReminders.isEmpty && dueSends.isEmpty {
            await wait(until: next.map(Date.init(timeIntervalSince1970:)))
            return
        }
        var toDeliver = dueSends
        if !dueReminders.isEmpty {
            let created: [Int64], owners: Set<String>
            do {
                (created, owners) = try prepare(dueReminders, now: clock.now())
            } catch {
                // Nothing was written: they come round again in a second, with the sends due now.
                state.withLock { state in
                    for id in dueReminders { state.reminders.insert(Entry(at: now + 1, id: id)) }
                    for id in dueSends { state.sends.insert(Entry(at: now + 1, id: id)) }
                }
                throw error
            }
            toDeliver += created
            if let refill {
                // Off the loop: a refill is a call to canopy-care and a sync, and the loop has
                // reminders to send meanwhile. At most one per person per refill interval.
                for owner in owners where shouldRefill(owner) { Task { await refill(owner) } }
            }
        }
        enqueue(toDeliver)
    }

    private func wait(until deadline: Date?) async {
        let clock = self.clock, wakeup = self.wakeup
        await withTaskGroup(of: Void.self) { group in
            if let deadline { group.addTask { try? await clock.sleep(until: deadline) } }
            group.addTask { await wakeup.wait() }
            await group.next()
            group.cancelAll()
        }
    }

    // MARK: - Reminders due

    /// Turns due reminders into sends, in one transaction: each person's reminders due within
    /// the digest window make one notification per active device. Stale ones are recorded as
    /// such; without an active device a reminder counts as done.
    ///
    /// - Returns: the sends to deliver, and the people whose reminders went.
    func prepare(_ ids: [Int64], now: Date) throws -> (sends: [Int64], owners: Set<String>) {
        let nowSeconds = now.timeIntervalSince1970
        let horizon = nowSeconds + settings.digestWindow.seconds
        let staleBefore = nowSeconds - settings.staleness.seconds
        return try store.database.write { db in
            var owners: [String: [ReminderStore.ReminderRow]] = [:]
            for chunk in stride(from: 0, to: ids.count, by: 500).map({ Array(ids[$0..<min($0 + 500, ids.count)]) }) {
                let rows = try Row.fetchAll(db, sql: "SELECT * FROM reminders WHERE state = 'pending' AND id IN (\(chunk.map { _ in "?" }.joined(separator: ",")))",
                                            arguments: StatementArguments(chunk))
                for row in rows.map(ReminderStore.reminder) where row.fireAt.timeIntervalSince1970 <= nowSeconds {
                    owners[row.owner, default: []].append(row) // moved later by a sync: its new time is in the heap
                }
            }
            var created: [Int64] = []
            for (owner, due) in owners {
                // The rest of the digest window comes along.
                let taken = Set(due.map(\.id))
                let companions = try Row.fetchAll(try db.cachedStatement(sql: "SELECT * FROM reminders WHERE owner = ? AND state = 'pending' AND fireAt > ? AND fireAt <= ?"),
                                                  arguments: [owner, nowSeconds, horizon]).map(ReminderStore.reminder).filter { !taken.contains($0.id) }
                let all = due + companions
                let stale = all.filter { $0.fireAt.timeIntervalSince1970 < staleBefore }
                for row in stale {
                    try db.run("UPDATE reminders SET state = 'stale', updatedAt = ? WHERE id = ?", arguments: [nowSeconds, row.id])
                    logger.info("remind.stale", metadata: ["remind.task": "\(row.reminder.taskID)", "remind.due": "\(row.reminder.due.formatted(.iso8601))"])
                }
                let fresh = all.filter { $0.fireAt.timeIntervalSince1970 >= staleBefore }
                guard !fresh.isEmpty else { continue }
                let devices = try store.devices(db, owner: owner, activeOnly: true)
                let state = devices.isEmpty ? "delivered" : "sending"
                for row in fresh {
                    try db.run("UPDATE reminders SET state = ?, updatedAt = ? WHERE id = ?", arguments: [state, nowSeconds, row.id])
                }
                for device in devices {
                    let key = ReminderNotification.key(deviceID: device.device.id, reminders: fresh.map { ($0.reminder.taskID, $0.reminder.due.timeIntervalSince1970) })
                    let notification = ReminderNotification(id: key, reminders: fresh.map(\.reminder))
                    try db.run("""
                        INSERT OR IGNORE INTO sends (owner, deviceID, idempotencyKey, notification, nextAttempt, state, createdAt) VALUES (?, ?, ?, ?, ?, 'pending', ?)
                        """, arguments: [owner, device.device.id, key, Data(try store.codec.encode(notification)), nowSeconds, nowSeconds])
                    guard db.changesCount > 0 else { continue }
                    let send = db.lastInsertedRowID
                    for row in fresh {
                        try db.run("INSERT INTO sendReminders (sendID, reminderID) VALUES (?, ?)", arguments: [send, row.id])
                    }
                    created.append(send)
                }
            }
            return (created, Set(owners.keys))
        }
    }

    private func shouldRefill(_ owner: String) -> Bool {
        let now = clock.now()
        let recent = state.withLock { state -> Bool in
            let interval = settings.refillInterval.seconds
            if let last = state.lastRefill[owner], now.timeIntervalSince(last) < interval { return true }
            // Only the last interval's checks matter, and at most ``refillMemory`` of them: the
            // oldest go first (a bound on what it holds, in constant time per check).
            while let oldest = state.refillChecks.first,
                  now.timeIntervalSince(oldest.at) >= interval || state.refillChecks.count >= Self.refillMemory {
                state.refillChecks.removeFirst()
                if state.lastRefill[oldest.owner] == oldest.at { state.lastRefill[oldest.owner] = nil }
            }
            state.refillChecks.append((owner, now))
            state.lastRefill[owner] = now
            return false
        }
        guard !recent else { return false }
        let (count, last) = (try? store.database.read { db -> (Int, Double?) in
            let row = try Row.fetchOne(try db.cachedStatement(sql: "SELECT COUNT(*) AS count, MAX(fireAt) AS last FROM reminders WHERE owner = ? AND state = 'pending'"), arguments: [owner])
            return (row?["count"] ?? 0, row?["last"])
        }) ?? (0, nil)
        return count < settings.refillBelow || (last ?? 0) < now.timeIntervalSince1970 + settings.refillHorizon.seconds
    }

    // MARK: - Delivering

    /// Hands sends to the delivery slots and starts what they let start now. Never waits.
    func enqueue(_ sends: [Int64]) {
        guard !sends.isEmpty else { return }
        let starting = state.withLock { state in
            state.slots.enqueue(sends)
            return state.slots.start()
        }
        for start in starting { starts.continuation.yield(start) }
    }

    /// One started send: loaded, admitted to its destination (or left waiting for it), tried,
    /// its slots freed, its outcome written with others finishing about then (group commit).
    private func perform(_ start: DeliverySlots.Start) async {
        var destination = start.reserved
        var attempt: Attempt?
        var quickly: Bool?
        do {
            if let (send, device) = try load(start.id) {
                let channel = device.flatMap { channels[$0.device.channel] }
                if start.reserved == nil {
                    destination = device.flatMap { channel?.destination(of: $0) }
                    let admitted = state.withLock { $0.slots.admit(start.id, to: destination) }
                    guard admitted else { return startFreed() } // waits for its destination
                }
                let began = ContinuousClock.now
                attempt = try await self.attempt(send, device: device, channel: channel)
                if destination != nil, let outcome = attempt?.outcome {
                    // A quick answer raises the destination's bound; a slow one, or one to try
                    // again (a timeout, a refused connection, a 5xx or 429: it cannot keep up),
                    // lowers it.
                    if case .retry = outcome {
                        quickly = false
                    } else {
                        quickly = ContinuousClock.now - began < settings.quickAnswer
                    }
                }
            }
        } catch {
            logger.error("remind.deliver.failed", metadata: ["remind.send": "\(start.id)", "remind.error": "\(error)"])
            let now = clock.now().timeIntervalSince1970
            state.withLock { $0.sends.insert(Entry(at: now + 1, id: start.id)) } // again in a second
        }
        state.withLock { $0.slots.finish(destination: destination, quickly: quickly) }
        startFreed()
        if let attempt { write(attempt) }
    }

    /// Starts the sends that freed slots let start.
    private func startFreed() {
        for start in state.withLock({ $0.slots.start() }) { starts.continuation.yield(start) }
    }

    /// Writes a finished attempt: the first to finish while no one writes becomes the writer
    /// and writes, a transaction at a time, everything that finishes meanwhile.
    private func write(_ attempt: Attempt) {
        let becomesWriter = state.withLock { state -> Bool in
            state.finished.append(attempt)
            guard !state.writing else { return false }
            state.writing = true
            return true
        }
        guard becomesWriter else { return }
        while true {
            let batch = state.withLock { state -> [Attempt] in
                let batch = state.finished.prefix(256)
                state.finished.removeFirst(batch.count)
                if batch.isEmpty { state.writing = false }
                return Array(batch)
            }
            guard !batch.isEmpty else { return }
            record(batch)
        }
    }

    /// One delivery's outcome, to be written.
    struct Attempt: Sendable {
        var sendID: Int64
        var attempt: Int
        var deviceID: String
        var outcome: DeliveryOutcome
        /// The earliest due time among the send's reminders, for the lateness figure.
        var due: Date?
    }

    /// A send and its device; `nil` when the send is no longer pending (finished or cancelled
    /// meanwhile).
    private func load(_ sendID: Int64) throws -> (Row, ReminderStore.DeviceRecord?)? {
        try store.database.read { db -> (Row, ReminderStore.DeviceRecord?)? in
            guard let send = try Row.fetchOne(try db.cachedStatement(sql: "SELECT * FROM sends WHERE id = ? AND state = 'pending'"), arguments: [sendID]) else { return nil }
            let device = try Row.fetchOne(try db.cachedStatement(sql: "SELECT * FROM devices WHERE id = ?"), arguments: [send["deviceID"] as String]).map(ReminderStore.device)
            return (send, device)
        }
    }

    /// Tries one send through its device's channel.
    private func attempt(_ send: Row, device: ReminderStore.DeviceRecord?, channel: (any NotificationChannel)?) async throws -> Attempt {
        let outcome: DeliveryOutcome
        var due: Date?
        if let device, device.device.active, let channel {
            let notification = try store.codec.decode(ReminderNotification.self, from: [UInt8](send["notification"] as Data))
            due = notification.reminders.map(\.due).min()
            outcome = await channel.deliver(notification, to: device)
        } else if let device, !device.device.active {
            outcome = .rejected("the device is inactive: \(device.device.deactivatedReason ?? "deactivated")", deactivate: false)
        } else if let device {
            outcome = .rejected("this service has no \(device.device.channel.rawValue) channel configured", deactivate: false)
        } else {
            outcome = .rejected("the device was removed", deactivate: false)
        }
        metrics.attempt(outcome, lateBy: due.map { clock.now().timeIntervalSince($0) })
        return Attempt(sendID: send["id"], attempt: send["attempts"] + 1, deviceID: send["deviceID"], outcome: outcome, due: due)
    }

    /// Writes attempts' outcomes in one transaction: each send finished (delivered or given
    /// up) or scheduled again; its reminders finished once none of their sends is pending.
    private func record(_ attempts: [Attempt]) {
        guard !attempts.isEmpty else { return }
        let now = clock.now().timeIntervalSince1970
        var retries: [Entry] = []
        do {
            try store.database.write { db in
                for attempt in attempts {
                    if let retryAt = try record(attempt, db: db, now: now) { retries.append(Entry(at: retryAt, id: attempt.sendID)) }
                }
            }
        } catch {
            // Not written: the sends stay pending; they go again in a second (the receiver may
            // see their keys twice).
            logger.error("remind.record.failed", metadata: ["remind.sends": "\(attempts.count)", "remind.error": "\(error)"])
            state.withLock { state in for attempt in attempts { state.sends.insert(Entry(at: now + 1, id: attempt.sendID)) } }
            wakeup.signal()
            return
        }
        if !retries.isEmpty {
            state.withLock { state in for entry in retries { state.sends.insert(entry) } }
            wakeup.signal()
        }
    }

    /// One attempt's rows; returns when to try again, if it is to be.
    private func record(_ attempt: Attempt, db: Database, now: Double) throws -> Double? {
        let (sendID, number) = (attempt.sendID, attempt.attempt)
        // Its plant was deleted while it was on its way: nothing of it is kept.
        guard try Bool.fetchOne(try db.cachedStatement(sql: "SELECT 1 FROM sends WHERE id = ?"), arguments: [sendID]) != nil else { return nil }
        let (label, detail): (String, String) = switch attempt.outcome {
        case .accepted(let detail): ("accepted", detail)
        case .retry(let detail): ("retry", detail)
        case .rejected(let detail, _): ("rejected", detail)
        }
        logger.info("remind.attempt", metadata: ["remind.send": "\(sendID)", "remind.attempt": "\(number)", "remind.outcome": "\(label)", "remind.detail": "\(detail)"])
        try db.run("INSERT INTO attempts (sendID, attempt, at, outcome, detail) VALUES (?, ?, ?, ?, ?)", arguments: [sendID, number, now, label, detail])
        switch attempt.outcome {
        case .accepted:
            try db.run("UPDATE sends SET state = 'delivered', attempts = ?, lastError = NULL WHERE id = ?", arguments: [number, sendID])
        case .retry(let reason) where number < settings.maximumAttempts:
            let pause = min(settings.maximumBackoff.seconds, settings.firstBackoff.seconds * pow(2, Double(number - 1))) * Double.random(in: 0.8...1.2)
            try db.run("UPDATE sends SET attempts = ?, nextAttempt = ?, lastError = ? WHERE id = ?", arguments: [number, now + pause, reason, sendID])
            return now + pause
        case .retry(let reason), .rejected(let reason, deactivate: false):
            try db.run("UPDATE sends SET state = 'failed', attempts = ?, lastError = ?, nextAttempt = ? WHERE id = ?", arguments: [number, reason, now, sendID])
        case .rejected(let reason, deactivate: true):
            try db.run("UPDATE sends SET state = 'failed', attempts = ?, lastError = ?, nextAttempt = ? WHERE id = ?", arguments: [number, reason, now, sendID])
            try db.run("UPDATE devices SET active = 0, deactivatedReason = ? WHERE id = ?", arguments: [reason, attempt.deviceID])
        }
        // Reminders with no send left pending: delivered when any device took them. One by
        // primary key (a statement over every reminder being sent would scan them all).
        let reminderIDs = try Int64.fetchAll(try db.cachedStatement(sql: "SELECT reminderID FROM sendReminders WHERE sendID = ?"), arguments: [sendID])
        for reminderID in reminderIDs {
            try db.run("""
                UPDATE reminders SET updatedAt = ?, state = CASE
                    WHEN EXISTS (SELECT 1 FROM sendReminders s CROSS JOIN sends ON sends.id = s.sendID WHERE s.reminderID = reminders.id AND sends.state = 'delivered') THEN 'delivered'
                    ELSE 'failed' END
                WHERE id = ? AND state = 'sending'
                  AND NOT EXISTS (SELECT 1 FROM sendReminders s CROSS JOIN sends ON sends.id = s.sendID WHERE s.reminderID = reminders.id AND sends.state = 'pending')
                """, arguments: [now, reminderID])
        }
        return nil
    }
}

extension Duration {
    /// In seconds, with fractions.
    var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
