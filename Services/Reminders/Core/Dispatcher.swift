import CanopyMessages
import Foundation
import GRDB
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
    public init() {}

    public func now() -> Date { Date() }

    public func sleep(until deadline: Date) async throws {
        let seconds = deadline.timeIntervalSinceNow
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
    /// Deliveries in flight at once.
    public var concurrency = 64
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
final class Dispatcher: Service, Sendable {
    let store: ReminderStore
    let channels: [Reminders.Channel: any NotificationChannel]
    let clock: any ReminderClock
    let settings: DispatchSettings
    let logger: Logger
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
        var lastRefill: [String: Date] = [:]
        var loaded = false
    }

    private let state = Mutex(State())
    private let wakeup = Wakeup()

    init(store: ReminderStore, channels: [any NotificationChannel], clock: any ReminderClock = SystemReminderClock(), settings: DispatchSettings = .init(),
         refill: (@Sendable (String) async -> Void)? = nil, logger: Logger) {
        self.store = store
        self.channels = Dictionary(uniqueKeysWithValues: channels.map { ($0.kind, $0) })
        self.clock = clock
        self.settings = settings
        self.refill = refill
        self.logger = logger
    }

    /// Reminders whose time is new or changed (from a sync).
    func schedule(_ entries: [(id: Int64, fireAt: Double)]) {
        guard !entries.isEmpty else { return }
        state.withLock { state in
            for entry in entries { state.reminders.insert(Entry(at: entry.fireAt, id: entry.id)) }
        }
        wakeup.signal()
    }

    /// Reminders and sends held in memory now.
    var held: (reminders: Int, sends: Int) {
        state.withLock { ($0.reminders.count, $0.sends.count) }
    }

    func run() async throws {
        let reminders = try store.pendingTimes()
        let sends = try store.pendingSends()
        state.withLock { state in
            state.reminders = Heap(reminders.map { Entry(at: $0.fireAt, id: $0.id) })
            state.sends = Heap(sends.map { Entry(at: $0.nextAttempt, id: $0.id) })
            state.loaded = true
        }
        logger.info("remind.dispatcher.started", metadata: ["remind.pending": "\(reminders.count)", "remind.sends": "\(sends.count)"])
        try await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                try await self.turn()
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
            return (reminders, sends, next)
        }
        if dueReminders.isEmpty && dueSends.isEmpty {
            await wait(until: next.map(Date.init(timeIntervalSince1970:)))
            return
        }
        var toDeliver = dueSends
        if !dueReminders.isEmpty {
            let (created, owners) = try prepare(dueReminders, now: clock.now())
            toDeliver += created
            if let refill { for owner in owners where shouldRefill(owner) { await refill(owner) } }
        }
        await deliver(toDeliver)
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
                let companions = try Row.fetchAll(db, sql: "SELECT * FROM reminders WHERE owner = ? AND state = 'pending' AND fireAt > ? AND fireAt <= ?",
                                                  arguments: [owner, nowSeconds, horizon]).map(ReminderStore.reminder).filter { !taken.contains($0.id) }
                let all = due + companions
                let stale = all.filter { $0.fireAt.timeIntervalSince1970 < staleBefore }
                for row in stale {
                    try db.execute(sql: "UPDATE reminders SET state = 'stale', updatedAt = ? WHERE id = ?", arguments: [nowSeconds, row.id])
                    logger.info("remind.stale", metadata: ["remind.task": "\(row.reminder.taskID)", "remind.due": "\(row.reminder.due.formatted(.iso8601))"])
                }
                let fresh = all.filter { $0.fireAt.timeIntervalSince1970 >= staleBefore }
                guard !fresh.isEmpty else { continue }
                let devices = try store.devices(db, owner: owner, activeOnly: true)
                let state = devices.isEmpty ? "delivered" : "sending"
                for row in fresh {
                    try db.execute(sql: "UPDATE reminders SET state = ?, updatedAt = ? WHERE id = ?", arguments: [state, nowSeconds, row.id])
                }
                for device in devices {
                    let key = ReminderNotification.key(deviceID: device.device.id, reminders: fresh.map { ($0.reminder.taskID, $0.reminder.due.timeIntervalSince1970) })
                    let notification = ReminderNotification(id: key, reminders: fresh.map(\.reminder))
                    try db.execute(sql: """
                        INSERT OR IGNORE INTO sends (owner, deviceID, idempotencyKey, notification, nextAttempt, state, createdAt) VALUES (?, ?, ?, ?, ?, 'pending', ?)
                        """, arguments: [owner, device.device.id, key, Data(try store.codec.encode(notification)), nowSeconds, nowSeconds])
                    guard db.changesCount > 0 else { continue }
                    let send = db.lastInsertedRowID
                    for row in fresh {
                        try db.execute(sql: "INSERT INTO sendReminders (sendID, reminderID) VALUES (?, ?)", arguments: [send, row.id])
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
            if let last = state.lastRefill[owner], now.timeIntervalSince(last) < settings.refillInterval.seconds { return true }
            state.lastRefill[owner] = now
            return false
        }
        guard !recent else { return false }
        let (count, last) = (try? store.database.read { db -> (Int, Double?) in
            let row = try Row.fetchOne(db, sql: "SELECT COUNT(*) AS count, MAX(fireAt) AS last FROM reminders WHERE owner = ? AND state = 'pending'", arguments: [owner])
            return (row?["count"] ?? 0, row?["last"])
        }) ?? (0, nil)
        return count < settings.refillBelow || (last ?? 0) < now.timeIntervalSince1970 + settings.refillHorizon.seconds
    }

    // MARK: - Delivering

    /// Delivers sends, at most ``DispatchSettings/concurrency`` at once.
    func deliver(_ sends: [Int64]) async {
        guard !sends.isEmpty else { return }
        await withTaskGroup(of: Void.self) { group in
            var next = sends.makeIterator()
            for _ in 0..<settings.concurrency {
                guard let send = next.next() else { break }
                group.addTask { await self.deliver(send) }
            }
            for await _ in group {
                if let send = next.next() { group.addTask { await self.deliver(send) } }
            }
        }
    }

    private func deliver(_ sendID: Int64) async {
        do {
            guard let (send, device) = try store.database.read({ db -> (Row, ReminderStore.DeviceRecord?)? in
                guard let send = try Row.fetchOne(db, sql: "SELECT * FROM sends WHERE id = ? AND state = 'pending'", arguments: [sendID]) else { return nil }
                let device = try Row.fetchOne(db, sql: "SELECT * FROM devices WHERE id = ?", arguments: [send["deviceID"] as String]).map(ReminderStore.device)
                return (send, device)
            }) else { return } // finished or cancelled meanwhile
            let attempt: Int = send["attempts"] + 1
            let outcome: DeliveryOutcome
            if let device, device.device.active, let channel = channels[device.device.channel] {
                let notification = try store.codec.decode(ReminderNotification.self, from: [UInt8](send["notification"] as Data))
                outcome = await channel.deliver(notification, to: device)
            } else if let device, !device.device.active {
                outcome = .rejected("the device is inactive: \(device.device.deactivatedReason ?? "deactivated")", deactivate: false)
            } else if device == nil {
                outcome = .rejected("the device was removed", deactivate: false)
            } else {
                outcome = .rejected("this service has no \(device!.device.channel.rawValue) channel configured", deactivate: false)
            }
            try record(outcome, sendID: sendID, attempt: attempt, deviceID: send["deviceID"])
        } catch {
            logger.error("remind.deliver.failed", metadata: ["remind.send": "\(sendID)", "remind.error": "\(error)"])
        }
    }

    /// Writes an attempt's outcome: the send finished (delivered or given up) or scheduled again;
    /// its reminders finished once none of their sends is still pending.
    private func record(_ outcome: DeliveryOutcome, sendID: Int64, attempt: Int, deviceID: String) throws {
        let now = clock.now().timeIntervalSince1970
        var retryAt: Double?
        let (label, detail): (String, String) = switch outcome {
        case .accepted(let detail): ("accepted", detail)
        case .retry(let detail): ("retry", detail)
        case .rejected(let detail, _): ("rejected", detail)
        }
        logger.info("remind.attempt", metadata: ["remind.send": "\(sendID)", "remind.attempt": "\(attempt)", "remind.outcome": "\(label)", "remind.detail": "\(detail)"])
        try store.database.write { db in
            try db.execute(sql: "INSERT INTO attempts (sendID, attempt, at, outcome, detail) VALUES (?, ?, ?, ?, ?)", arguments: [sendID, attempt, now, label, detail])
            switch outcome {
            case .accepted:
                try db.execute(sql: "UPDATE sends SET state = 'delivered', attempts = ?, lastError = NULL WHERE id = ?", arguments: [attempt, sendID])
            case .retry(let reason) where attempt < settings.maximumAttempts:
                let pause = min(settings.maximumBackoff.seconds, settings.firstBackoff.seconds * pow(2, Double(attempt - 1))) * Double.random(in: 0.8...1.2)
                retryAt = now + pause
                try db.execute(sql: "UPDATE sends SET attempts = ?, nextAttempt = ?, lastError = ? WHERE id = ?", arguments: [attempt, retryAt, reason, sendID])
            case .retry(let reason), .rejected(let reason, deactivate: false):
                try db.execute(sql: "UPDATE sends SET state = 'failed', attempts = ?, lastError = ?, nextAttempt = ? WHERE id = ?", arguments: [attempt, reason, now, sendID])
            case .rejected(let reason, deactivate: true):
                try db.execute(sql: "UPDATE sends SET state = 'failed', attempts = ?, lastError = ?, nextAttempt = ? WHERE id = ?", arguments: [attempt, reason, now, sendID])
                try db.execute(sql: "UPDATE devices SET active = 0, deactivatedReason = ? WHERE id = ?", arguments: [reason, deviceID])
            }
            guard retryAt == nil else { return }
            // Reminders with no send left pending: delivered when any device took them.
            try db.execute(sql: """
                UPDATE reminders SET updatedAt = ?, state = CASE
                    WHEN EXISTS (SELECT 1 FROM sendReminders s JOIN sends ON sends.id = s.sendID WHERE s.reminderID = reminders.id AND sends.state = 'delivered') THEN 'delivered'
                    ELSE 'failed' END
                WHERE state = 'sending' AND id IN (SELECT reminderID FROM sendReminders WHERE sendID = ?)
                  AND NOT EXISTS (SELECT 1 FROM sendReminders s JOIN sends ON sends.id = s.sendID WHERE s.reminderID = reminders.id AND sends.state = 'pending')
                """, arguments: [now, sendID])
        }
        if let retryAt {
            state.withLock { $0.sends.insert(Entry(at: retryAt, id: sendID)) }
            wakeup.signal()
        }
    }
}

/// Wakes the dispatcher's sleep early; a signal while it is awake is kept for its next wait.
final class Wakeup: Sendable {
    private let state = Mutex<(pending: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))

    func signal() {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard let waiter = state.waiter else {
                state.pending = true
                return nil
            }
            state.waiter = nil
            return waiter
        }
        waiter?.resume()
    }

    func wait() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let resumeNow = state.withLock { state -> Bool in
                    if state.pending || Task.isCancelled {
                        state.pending = false
                        return true
                    }
                    state.waiter = continuation
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
                defer { state.waiter = nil }
                return state.waiter
            }
            waiter?.resume()
        }
    }
}

extension Duration {
    /// In seconds, with fractions.
    var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
