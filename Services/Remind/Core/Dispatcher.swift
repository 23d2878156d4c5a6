import CanopyMessages
import CanopyServiceKit
import DequeModule
import Foundation
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
    /// With replicas sharing the store: how long a replica holds a send it is trying (longer
    /// than any channel takes to answer); a replica that hangs mid-delivery delays the send
    /// by this, then another tries it (one killed: by a sweep, as its connections end).
    public var lease: Duration = .seconds(120)
    /// …how often each replica looks for work nobody is doing (a stopped replica's reminders
    /// and sends, reminders another replica was busy with)…
    public var sweepInterval: Duration = .seconds(1)
    /// …and how late that work must be before another replica takes it (the replica that
    /// holds it takes it on time).
    public var orphanGrace: Duration = .seconds(2)

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
///
/// The decisions (what is due, what a digest holds, when to retry) are ``DispatchPlan``'s,
/// the data the store's (``ReminderStoring``); this type keeps the time and delivers.
public final class Dispatcher: Service, Sendable {
    let store: any ReminderStoring
    let channels: [Reminders.Channel: any NotificationChannel]
    let clock: any ReminderClock
    let settings: DispatchSettings
    let plan: DispatchPlan
    let logger: Logger
    let metrics = ReminderMetrics()
    /// Asks canopy-care for a person's fresh window (and syncs it).
    let refill: (@Sendable (String) async -> Void)?

    private struct State {
        var due = DispatchPlan.DueQueue()
        /// When to look next for work nobody is doing (replicas only).
        var nextSweep = 0.0
        /// When each person's window was last checked for a refill, and the same in the order
        /// of the checks, so that the oldest are forgotten first.
        var lastRefill: [String: Date] = [:]
        var refillChecks = Deque<(owner: String, at: Date)>()
        var loaded = false
        /// Which sends are in flight, in all and per destination.
        var slots: DeliverySlots
        /// Reminders the loop found due, not yet taken by the preparer, and whether it is at
        /// work on some.
        var toPrepare = Set<Int64>()
        var preparing = false
        /// Sends handed to delivery and not finished (queued, waiting or in flight), and those
        /// finished whose outcome is not written yet.
        var sending = Set<Int64>()
        var recording = Set<Int64>()
        /// Sends made here whose first attempt has not started (``Ready``).
        var ready: [Int64: Ready] = [:]
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
    /// Signalled when the loop finds reminders due (``State/toPrepare``), for the preparer
    /// (``prepareAsTheyComeDue()``).
    private let preparing = Wakeup()
    /// Signalled as deliveries finish: the preparer may go on (``queueAhead``).
    private let room = Wakeup()

    init(
        store: any ReminderStoring, channels: [any NotificationChannel], clock: any ReminderClock = SystemReminderClock(), settings: DispatchSettings = .init(),
        refill: (@Sendable (String) async -> Void)? = nil, logger: Logger
    ) {
        self.store = store
        self.channels = Dictionary(uniqueKeysWithValues: channels.map { ($0.kind, $0) })
        self.clock = clock
        self.settings = settings
        plan = DispatchPlan(settings: settings)
        self.refill = refill
        self.logger = logger
        state = Mutex(
            State(
                slots: DeliverySlots(
                    total: settings.concurrency, perDestination: settings.perDestination,
                    perQuickDestination: settings.perQuickDestination, perSlowDestination: settings.perSlowDestination)))
    }

    /// Reminders whose time is new or changed (from a sync). The dispatcher is woken only
    /// when one is earlier than everything it holds: it sleeps until its earliest entry and
    /// looks again then, and waking it for every sync of a busy hour was a large part of
    /// what syncs cost.
    func schedule(_ entries: [(id: Int64, fireAt: Double)]) {
        guard !entries.isEmpty else { return }
        let earlier = state.withLock { $0.due.schedule(entries) }
        if earlier { wakeup.signal() }
    }

    /// Reminders and sends held in memory now.
    public var held: (reminders: Int, sends: Int) {
        state.withLock { ($0.due.reminders.count, $0.due.sends.count) }
    }

    public func run() async throws {
        var entries: [DispatchPlan.DueQueue.Entry] = []
        try store.forEachPending { id, fireAt in entries.append(.init(at: fireAt, id: id)) }
        let reminders = entries.count
        let sends = try store.pendingSends()
        state.withLock { state in
            // Merged with what was scheduled while loading (a sync during start-up).
            state.due.load(reminders: entries, sends: sends.map { .init(at: $0.nextAttempt, id: $0.id) })
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
                group.addTask { await self.prepareAsTheyComeDue() }
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
        // Off the cooperative pool: the sweep's query blocks its thread (a round trip to PostgreSQL).
        if store.sharedWithReplicas { try await offThePool { try self.sweep(now: now) } }
        let (dueReminders, dueSends, next) = state.withLock { state -> ([Int64], [Int64], Double?) in
            let (reminders, sends) = state.due.takeDue(at: now)
            metrics.held(reminders: state.due.reminders.count, sends: state.due.sends.count)
            let wake = store.sharedWithReplicas ? [state.due.wake, state.nextSweep].compactMap { $0 }.min() : state.due.wake
            return (reminders, sends, wake)
        }
        if dueReminders.isEmpty && dueSends.isEmpty {
            await wait(until: next.map(Date.init(timeIntervalSince1970:)))
            return
        }
        enqueue(dueSends)
        // To the preparer: the loop goes on turning (retries, a gone replica's sends) while a
        // burst is turned into sends.
        if !dueReminders.isEmpty {
            state.withLock { $0.toPrepare.formUnion(dueReminders) }
            preparing.signal()
        }
    }

    /// Turns the reminders the loop finds due into sends (``prepare(_:now:)``), one batch
    /// after the other, until the loop ends.
    private func prepareAsTheyComeDue() async {
        while !Task.isCancelled {
            await preparing.wait()
            // Everything found due since the last time, as one: at a steady thousand a second
            // the loop finds one or two at each turn, and a few statements for each would be
            // the cost the batches are there to spread.
            let ids = state.withLock { state in
                defer { state.toPrepare = [] }
                state.preparing = !state.toPrepare.isEmpty
                return Array(state.toPrepare)
            }
            guard !ids.isEmpty else { continue }
            defer { state.withLock { $0.preparing = false } }
            do {
                let owners = try await prepare(ids).owners
                if let refill {
                    // Off the preparer: a refill is a call to canopy-care and a sync, and there
                    // are reminders to send meanwhile. At most one per person per refill interval.
                    for owner in await needingRefill(owners) { Task { await refill(owner) } }
                }
            } catch is CancellationError {
                return
            } catch {
                // What was not written comes round again in a second (what was is no longer
                // pending). A full disk? Keep going.
                logger.error("remind.dispatcher.failed", metadata: ["remind.error": "\(error)"])
                let again = clock.now().timeIntervalSince1970 + 1
                state.withLock { state in for id in ids { state.due.remind(id, at: again) } }
                wakeup.signal()
            }
        }
    }

    /// With replicas: at most once a ``DispatchSettings/sweepInterval``, takes into the queue
    /// the work nobody is doing (late by ``DispatchSettings/orphanGrace``): what a stopped
    /// replica held, and what another replica left (a person it was busy with). Whoever
    /// claims it first does it; the rest find it done.
    private func sweep(now: Double) throws {
        let behind = state.withLock { state -> Bool? in
            guard now >= state.nextSweep else { return nil }
            state.nextSweep = now + settings.sweepInterval.seconds
            // Behind on what it holds itself (at start every replica holds every pending
            // reminder): the late work it finds would be its own, back each second on top of
            // itself. It still takes over at once what a replica that is gone was sending.
            if let earliest = state.due.wake, earliest < now - settings.orphanGrace.seconds { return true }
            // The preparer still at the reminders the loop took: the same.
            return state.preparing || !state.toPrepare.isEmpty
        }
        guard let behind else { return }
        let found =
            behind
            ? (reminders: [], sends: try store.sendsOfGoneReplicas(dueBefore: Date(timeIntervalSince1970: now)))
            : try store.orphans(dueBefore: Date(timeIntervalSince1970: now - settings.orphanGrace.seconds), now: Date(timeIntervalSince1970: now))
        guard !found.reminders.isEmpty || !found.sends.isEmpty else { return }
        state.withLock { state in
            for reminder in found.reminders { state.due.remind(reminder.id, at: reminder.fireAt) }
            for send in found.sends { state.due.retry(send.id, at: send.nextAttempt) }
        }
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

    /// People turned into notifications per transaction: a backlog commits (and starts
    /// delivering) a little at a time instead of holding every person's lock and row until
    /// the whole of it is written.
    static let peoplePerTransaction = 256

    /// Turns due reminders into sends, ``peoplePerTransaction`` people a transaction, and hands
    /// each transaction's sends to delivery as it commits (``enqueue(_:)``): each person's
    /// reminders due within the digest window make one notification per active device
    /// (``DispatchPlan/digest(_:now:devices:)``). Stale ones are recorded as such; without an
    /// active device a reminder counts as done.
    ///
    /// - Parameter time: the time they are turned at (a test's); by default the clock's, as
    ///   each batch starts.
    /// - Returns: the sends made (already handed to delivery), and the people whose reminders went.
    @discardableResult
    func prepare(_ ids: [Int64], now time: Date? = nil) async throws -> (sends: [Int64], owners: Set<String>) {
        let now = time ?? clock.now()
        var owners: [String: [Int64]] = [:]
        for row in try await store.read({ data in try data.pendingReminders(ids: ids) }) where row.fireAt <= now {
            owners[row.owner, default: []].append(row.id) // moved later by a sync: its new time is in the queue
        }
        var created: [Int64] = []
        // In an order of this replica's own: replicas that hold the same due people (each
        // loads every pending reminder at start) mostly lock different batches instead of
        // meeting on every one.
        let people = Array(owners).shuffled()
        for start in stride(from: 0, to: people.count, by: Self.peoplePerTransaction) {
            // No further ahead of delivery than ``queueAhead``: a send is made shortly before
            // its turn (kept ready, see ``Ready``), and a burst of a hundred thousand is not
            // all marked `sending` at once while it waits.
            while state.withLock({ $0.sending.count >= Self.queueAhead }) {
                try Task.checkCancellation()
                await room.wait()
            }
            let group = people[start..<min(start + Self.peoplePerTransaction, people.count)]
            let now = time ?? clock.now()
            // Off the cooperative pool: the store's calls block (on PostgreSQL, a round trip each).
            let (sends, left, ready) = try await offThePool { try self.store.write { data in try self.prepare(group, data: data, now: now) } }
            keepReady(ready) // once committed
            if !left.isEmpty {
                let again = now.timeIntervalSince1970 + 1
                state.withLock { state in for id in left { state.due.remind(id, at: again) } }
                wakeup.signal()
            }
            enqueue(sends)
            created += sends
        }
        return (created, Set(owners.keys))
    }

    /// How many sends may wait for delivery (queued or in flight) before the next batch of
    /// reminders is turned into sends.
    static let queueAhead = 1_024

    /// One transaction of ``prepare(_:now:)``: these people's due reminders, read again under
    /// each person's lock; returns the sends made, the reminders left to the replica that
    /// holds a person now, and the sends as made, to keep ready once the transaction commits.
    /// A few statements for all of them (PostgreSQL: the locks, the due rows, their
    /// companions, the devices, the states, the sends), not a few per person.
    private func prepare(_ people: ArraySlice<(key: String, value: [Int64])>, data: any ReminderWrites, now: Date) throws -> (
        sends: [Int64], left: [Int64], ready: [Int64: Ready]
    ) {
        // Another replica is turning some of these people's reminders into sends now: it
        // takes those too, or they come round again in a second.
        let held = try data.lockOwners(people.map(\.key))
        var left: [Int64] = []
        var ids: [Int64] = []
        for (owner, reminders) in people {
            if held.contains(owner) { ids += reminders } else { left += reminders }
        }
        // Read under the locks: another replica may have sent some since.
        let due = Dictionary(grouping: try data.pendingReminders(ids: ids).filter { $0.fireAt <= now }, by: \.owner)
        guard !due.isEmpty else { return ([], left, [:]) }
        let owners = Array(due.keys)
        // The rest of each one's digest window comes along.
        let companions = Dictionary(grouping: try data.pendingReminders(owners: owners, firingAfter: now, through: plan.digestHorizon(now: now)), by: \.owner)
        let devices = try data.activeDevices(owners: owners)
        var stale: [Int64] = []
        var states: [Reminders.State: [Int64]] = [:]
        var sends: [NewSend] = []
        for owner in owners {
            let rows = due[owner] ?? []
            let taken = Set(rows.map(\.id))
            let digest = plan.digest(rows + (companions[owner] ?? []).filter { !taken.contains($0.id) }, now: now) { devices[owner] ?? [] }
            stale += digest.stale.map(\.id)
            for row in digest.stale {
                logger.info("remind.stale", metadata: ["remind.task": "\(row.reminder.taskID)", "remind.due": "\(row.reminder.due.formatted(.iso8601))"])
            }
            guard !digest.fresh.isEmpty else { continue }
            states[digest.state, default: []] += digest.fresh.map(\.id)
            for addressed in digest.notifications {
                sends.append(NewSend(owner: owner, deviceID: addressed.deviceID, notification: addressed.notification, reminderIDs: digest.fresh.map(\.id)))
            }
        }
        try data.setState(.stale, ofReminders: stale, at: now)
        for (newState, ids) in states { try data.setState(newState, ofReminders: ids, at: now) }
        let leasedUntil = now.addingTimeInterval(settings.lease.seconds)
        var created: [Int64] = []
        var ready: [Int64: Ready] = [:]
        for (send, id) in zip(sends, try data.insertSends(sends, at: now, leasedUntil: leasedUntil)) {
            guard let id else { continue }
            created.append(id)
            let device = devices[send.owner]?.first { $0.device.id == send.deviceID }
            ready[id] = Ready(
                send: StoredSend(id: id, owner: send.owner, deviceID: send.deviceID, notification: send.notification, attempts: 0), device: device,
                madeAt: now.timeIntervalSince1970)
        }
        return (created, left, ready)
    }

    // MARK: - Sends made here, ready to go

    /// A send this replica just made, with its device (and, with replicas, the lease it took
    /// with it): its first attempt, soon after, needs neither a read nor a claim.
    struct Ready: Sendable {
        var send: StoredSend
        var device: DeviceRecord?
        var madeAt: Double
    }

    /// The most sends kept ready at once (about a kilobyte each).
    static let readyLimit = 16_384
    /// How long a send is tried as it was made: one that waited longer for a slot (a
    /// backlog) is read again, and with replicas claimed again, as a retry is, so a plant
    /// deleted meanwhile, or a lease taken over, is seen.
    static let readyFor = 2.0

    private func keepReady(_ sends: [Int64: Ready]) {
        guard !sends.isEmpty else { return }
        let now = clock.now().timeIntervalSince1970
        state.withLock { state in
            if state.ready.count + sends.count > Self.readyLimit { state.ready = state.ready.filter { now - $0.value.madeAt < Self.readyFor } }
            for (id, ready) in sends where state.ready.count < Self.readyLimit { state.ready[id] = ready }
        }
    }

    /// The send `id` as made here, when kept and made within ``readyFor``; `taking` it, it is
    /// no longer kept.
    private func ready(_ id: Int64, taking: Bool) -> (StoredSend, DeviceRecord?)? {
        let now = clock.now().timeIntervalSince1970
        return state.withLock { state in
            guard let ready = state.ready[id] else { return nil }
            guard now - ready.madeAt < Self.readyFor else {
                state.ready[id] = nil
                return nil
            }
            if taking { state.ready[id] = nil }
            return (ready.send, ready.device)
        }
    }

    /// Of `owners`, whose reminders just went, those whose window runs low now (fewer than
    /// ``DispatchSettings/refillBelow`` pending, or the last within the refill horizon) and
    /// who were not checked within the refill interval: one read for all of them, off the
    /// cooperative pool (a morning burst checks a hundred thousand people).
    private func needingRefill(_ owners: Set<String>) async -> [String] {
        let now = clock.now()
        let interval = settings.refillInterval.seconds
        let candidates = state.withLock { state -> [String] in
            var candidates: [String] = []
            for owner in owners {
                if let last = state.lastRefill[owner], now.timeIntervalSince(last) < interval { continue }
                // Only the last interval's checks matter, and at most ``refillMemory`` of them:
                // the oldest go first (a bound on what it holds, in constant time per check).
                while let oldest = state.refillChecks.first,
                    now.timeIntervalSince(oldest.at) >= interval || state.refillChecks.count >= Self.refillMemory
                {
                    state.refillChecks.removeFirst()
                    if state.lastRefill[oldest.owner] == oldest.at { state.lastRefill[oldest.owner] = nil }
                }
                state.refillChecks.append((owner, now))
                state.lastRefill[owner] = now
                candidates.append(owner)
            }
            return candidates
        }
        guard !candidates.isEmpty else { return [] }
        // Unread (the store failed): nobody is asked for, rather than everybody.
        guard let summaries = try? await store.read({ data in try data.pendingSummaries(owners: candidates) }) else { return [] }
        let horizon = now.addingTimeInterval(settings.refillHorizon.seconds)
        return candidates.filter { owner in
            let (count, last) = summaries[owner] ?? (0, nil)
            return count < settings.refillBelow || (last ?? .distantPast) < horizon
        }
    }

    // MARK: - Delivering

    /// Hands sends to the delivery slots and starts what they let start now. Never waits.
    func enqueue(_ sends: [Int64]) {
        guard !sends.isEmpty else { return }
        let starting = state.withLock { state in
            // A send already on its way is not sent a second time at once (a sweep may find
            // one again before its claim is written).
            state.slots.enqueue(sends.filter { !state.recording.contains($0) && state.sending.insert($0).inserted })
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
        var resumed = false // left waiting for its destination: started again later
        var done = false
        defer { if !resumed && !done { ended(start.id, recording: false) } }
        do {
            var found = ready(start.id, taking: false)
            if found == nil { found = try await offThePool({ try self.load(start.id) }) }
            if var (send, device) = found {
                let channel = device.flatMap { channels[$0.device.channel] }
                if start.reserved == nil {
                    destination = device.flatMap { channel?.destination(of: $0) }
                    let admitted = state.withLock { $0.slots.admit(start.id, to: destination) }
                    guard admitted else { // waits for its destination
                        resumed = true
                        return startFreed()
                    }
                }
                // Made here a moment ago (and leased with it): tried as it is. Else, with
                // replicas, only now (admitted) is it leased to this one, and read again:
                // another replica may have tried it, or taken it, meanwhile.
                if ready(start.id, taking: true) == nil, store.sharedWithReplicas {
                    guard let claimed = try await offThePool({ try self.claim(start.id) }) else {
                        state.withLock { $0.slots.finish(destination: destination, quickly: nil) }
                        return startFreed()
                    }
                    (send, device) = claimed
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
            state.withLock { $0.due.retry(start.id, at: now + 1) } // again in a second
        }
        state.withLock { $0.slots.finish(destination: destination, quickly: quickly) }
        startFreed()
        // Before the write: the outcome's retry, once written, finds the send recorded.
        done = true
        ended(start.id, recording: attempt != nil)
        if let attempt { await write(attempt) }
    }

    /// A send no longer on its way: the preparer may make more (``queueAhead``). With an
    /// outcome to write (`recording`), it is not handed to delivery again until
    /// ``record(_:)`` has committed that outcome: a sweep's read taken just before its claim
    /// could bring it back, and this replica, holding its lease, would claim it again and
    /// send it twice. (Waiting on the writes would tie how fast sends are made to how fast
    /// outcomes are written: with two replicas, 681 a second instead of about 3,500.)
    private func ended(_ id: Int64, recording: Bool) {
        let room = state.withLock { state in
            state.sending.remove(id)
            if recording { state.recording.insert(id) }
            return state.sending.count < Self.queueAhead
        }
        if room { self.room.signal() }
    }

    /// Starts the sends that freed slots let start.
    private func startFreed() {
        for start in state.withLock({ $0.slots.start() }) { starts.continuation.yield(start) }
    }

    /// Writes a finished attempt: the first to finish while no one writes becomes the writer
    /// and writes, a transaction at a time, everything that finishes meanwhile.
    private func write(_ attempt: Attempt) async {
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
            _ = try? await offThePool { self.record(batch) } // it handles its own errors
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
    private func load(_ sendID: Int64) throws -> (StoredSend, DeviceRecord?)? {
        try store.read { data in try data.pendingSend(id: sendID) }
    }

    /// Leases the send to this replica for its attempt (``DispatchSettings/lease``) and reads
    /// it as it is now; nil when it is finished, gone or another replica's.
    private func claim(_ sendID: Int64) throws -> (StoredSend, DeviceRecord?)? {
        let now = clock.now()
        guard try store.claimSend(id: sendID, now: now, until: now.addingTimeInterval(settings.lease.seconds)) else { return nil }
        return try load(sendID)
    }

    /// Tries one send through its device's channel.
    private func attempt(_ send: StoredSend, device: DeviceRecord?, channel: (any NotificationChannel)?) async throws -> Attempt {
        let outcome: DeliveryOutcome
        var due: Date?
        if let device, device.device.active, let channel {
            due = send.notification.reminders.map(\.due).min()
            outcome = await channel.deliver(send.notification, to: device)
        } else if let device, !device.device.active {
            outcome = .rejected("the device is inactive: \(device.device.deactivatedReason ?? "deactivated")", deactivate: false)
        } else if let device {
            outcome = .rejected("this service has no \(device.device.channel.rawValue) channel configured", deactivate: false)
        } else {
            outcome = .rejected("the device was removed", deactivate: false)
        }
        metrics.attempt(outcome, channel: channel == nil ? nil : device?.device.channel, lateBy: due.map { clock.now().timeIntervalSince($0) })
        return Attempt(sendID: send.id, attempt: send.attempts + 1, deviceID: send.deviceID, outcome: outcome, due: due)
    }

    /// Writes attempts' outcomes in one transaction: each send finished (delivered or given
    /// up) or scheduled again (``DispatchPlan/update(after:attempt:now:jitter:)``); its
    /// reminders finished once none of their sends is pending.
    private func record(_ attempts: [Attempt]) {
        guard !attempts.isEmpty else { return }
        let now = clock.now()
        let (plan, logger) = (self.plan, self.logger)
        let retries: [(Int64, Double)]
        do {
            retries = try store.write { data in
                // A few statements for the whole batch (PostgreSQL), the people's locks first.
                // Its plant was deleted while it was on its way: nothing of it is kept.
                let existing = try data.lockForRecording(sendIDs: attempts.map(\.sendID))
                var updates: [(attempt: Attempt, update: SendUpdate)] = []
                var retries: [(Int64, Double)] = []
                var settled: [Int64] = []
                for attempt in attempts where existing.contains(attempt.sendID) {
                    let update = plan.update(
                        after: attempt.outcome, attempt: attempt.attempt, now: now.timeIntervalSince1970, jitter: Double.random(in: 0.8...1.2))
                    logger.info(
                        "remind.attempt",
                        metadata: [
                            "remind.send": "\(attempt.sendID)", "remind.attempt": "\(attempt.attempt)",
                            "remind.outcome": "\(attempt.outcome.label)", "remind.detail": "\(attempt.outcome.detail)",
                        ])
                    updates.append((attempt, update))
                    if case .retry(let at, _) = update { retries.append((attempt.sendID, at)) } else { settled.append(attempt.sendID) }
                }
                try data.record(updates, at: now)
                try data.settleReminders(ofSends: settled, at: now)
                return retries
            }
        } catch {
            // Not written: the sends stay pending; they go again in a second (the receiver may
            // see their keys twice).
            logger.error("remind.record.failed", metadata: ["remind.sends": "\(attempts.count)", "remind.error": "\(error)"])
            state.withLock { $0.recording.subtract(attempts.map(\.sendID)) }
            let again = now.timeIntervalSince1970 + 1
            state.withLock { state in for attempt in attempts { state.due.retry(attempt.sendID, at: again) } }
            wakeup.signal()
            return
        }
        state.withLock { $0.recording.subtract(attempts.map(\.sendID)) }
        if !retries.isEmpty {
            state.withLock { state in for (id, at) in retries { state.due.retry(id, at: at) } }
            wakeup.signal()
        }
    }
}

extension DeliveryOutcome {
    /// How an attempt is recorded: accepted, retry or rejected.
    var label: String {
        switch self {
        case .accepted: "accepted"
        case .retry: "retry"
        case .rejected: "rejected"
        }
    }

    /// What the channel answered.
    var detail: String {
        switch self {
        case .accepted(let detail), .retry(let detail), .rejected(let detail, _): detail
        }
    }
}
