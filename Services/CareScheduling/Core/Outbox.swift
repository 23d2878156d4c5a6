import CanopyBus
import CanopyMessages
import Foundation
import GRDB
import CanopyServiceKit
import Logging
import Metrics
import ServiceLifecycle
import Synchronization

/// Delivers the follow-ups canopy-care owes other services (reminder windows, reminder
/// cancellations, image purges, forgotten identifications). Each one was written to the
/// outbox in the same transaction as the change that caused it, so nothing is lost when a
/// service is down or canopy-care restarts; it is sent until the service confirms, waiting
/// 1, 2, 4 … up to 300 s between attempts.
///
/// It is woken by the commit that adds a follow-up (a GRDB transaction observer on the
/// table), not by a timer: a follow-up leaves within milliseconds of its commit. A pass sends
/// up to ``batch`` due follow-ups, at most ``concurrency`` at once; one person's follow-ups to
/// one service go in their order, one after the other, and stop at the first that fails (the
/// rest wait behind it), while different people and services go side by side. What was
/// confirmed is deleted in one transaction a pass. A backlog is sent pass after pass without
/// pausing; an empty outbox sleeps until the next commit, the next retry that comes due, or
/// ``interval``.
struct Outbox: Service, HealthReporting {
    let library: CareLibrary
    let bus: any BusCalling
    /// The longest it sleeps without a commit or a retry coming due (a safety net).
    let interval: Duration
    let logger: Logger
    /// Follow-ups in flight at once.
    var concurrency = 64
    /// Due follow-ups read per pass.
    var batch = 2_000
    private let codec = MessageCodec()
    /// Signalled by commits that add or change follow-ups.
    private let commits = Wakeup()
    /// `canopy_care_outbox_pending`: follow-ups not yet confirmed.
    private let pending = Gauge(label: "canopy_care_outbox_pending")
    /// `canopy_care_outbox_oldest_seconds`: how long the oldest pending follow-up has waited.
    private let oldest = Gauge(label: "canopy_care_outbox_oldest_seconds")
    /// `canopy_care_outbox_deliveries_total{outcome}`: attempts, confirmed or failed.
    private let delivered = Counter(label: "canopy_care_outbox_deliveries_total", dimensions: [("outcome", "ok")])
    private let failed = Counter(label: "canopy_care_outbox_deliveries_total", dimensions: [("outcome", "failed")])

    /// Passes the loop has finished, each followed by a sleep unless a backlog waits (tests
    /// wait on it to know the outbox is asleep).
    let passes = PassCount()

    final class PassCount: Sendable {
        private let value = Atomic<Int>(0)
        var count: Int { value.load(ordering: .relaxed) }
        func add() { value.add(1, ordering: .relaxed) }
    }

    /// What one pass did.
    struct Pass: Equatable {
        var delivered = 0
        var failed = 0
        /// Due follow-ups it read (``batch`` means more may be due).
        var read = 0
    }

    func run() async throws {
        let observer = OutboxCommits(wakeup: commits)
        library.store.database.add(transactionObserver: observer, extent: .observerLifetime)
        defer { library.store.database.remove(transactionObserver: observer) }
        // A graceful shutdown cancels the loop, and with it a sleep until the next commit.
        await cancelWhenGracefulShutdown { await self.loop() }
    }

    private func loop() async {
        var lastReport = ContinuousClock.now - .seconds(1)
        while !Task.isCancelled {
            let pass = await deliverDue()
            if pass.failed > 0 {
                logger.debug("care.outbox.pending", metadata: ["care.outbox.failed": "\(pass.failed)"])
            }
            // The gauges count the whole table: at most once a second under load.
            if ContinuousClock.now - lastReport >= .seconds(1) || pass.read < batch {
                report(pass)
                lastReport = .now
            } else {
                delivered.increment(by: Int64(pass.delivered))
                failed.increment(by: Int64(pass.failed))
            }
            passes.add()
            if pass.read >= batch { continue } // a backlog: the next pass at once
            await sleep(until: nextAttempt())
        }
    }

    /// When the earliest follow-up not yet due comes due, if any.
    private func nextAttempt() -> Date? {
        (try? library.store.database.read { db in try Double.fetchOne(db, sql: "SELECT MIN(nextAttempt) FROM outbox") })?
            .flatMap { $0 }.map(Date.init(timeIntervalSince1970:))
    }

    /// Sleeps until a commit adds a follow-up, `until` passes, or ``interval`` does.
    private func sleep(until: Date?) async {
        var limit = interval
        if let until {
            let seconds = until.timeIntervalSinceNow
            limit = min(limit, .milliseconds(Int64(max(0, seconds) * 1000)))
        }
        guard limit > .zero else { return }
        let (commits, wait) = (self.commits, limit)
        await withTaskGroup(of: Void.self) { group in
            group.addTask { try? await Task.sleep(for: wait) }
            group.addTask { await commits.wait() }
            await group.next()
            group.cancelAll()
        }
    }

    /// The store answers a query, and how many follow-ups wait (waiting is not unhealthy: the
    /// outbox holds them for services that are down).
    func healthChecks() async -> [(name: String, healthy: Bool, detail: String)] {
        do {
            let pending = try await library.store.database.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM outbox") ?? 0 }
            return [("store", true, "answering"), ("outbox", true, "\(pending) follow-up(s) pending")]
        } catch {
            return [("store", false, "not answering: \(error)")]
        }
    }

    /// Brings the outbox's metrics up to date after a pass; returns what the gauges now say.
    @discardableResult
    func report(_ pass: Pass, now: Date = Date()) -> (pending: Int, oldestSeconds: Double) {
        delivered.increment(by: Int64(pass.delivered))
        failed.increment(by: Int64(pass.failed))
        let row = try? library.store.database.read { db in
            try Row.fetchOne(db, sql: "SELECT COUNT(*) AS n, MIN(COALESCE(createdAt, nextAttempt)) AS first FROM outbox")
        }
        let count = row?["n"] as Int? ?? 0
        let age = (row?["first"] as Double?).map { max(0, now.timeIntervalSince1970 - $0) } ?? 0
        pending.record(count)
        oldest.record(age)
        return (count, age)
    }

    /// One follow-up read from the outbox.
    struct FollowUp: Sendable {
        var id: Int64
        var owner: String
        var service: String
        var operation: String
        var body: Data
        var attempts: Int
        var generation: Int64
    }

    /// What became of one follow-up.
    enum Outcome: Sendable {
        case confirmed(id: Int64, generation: Int64)
        case failed(id: Int64, attempts: Int, error: String)
    }

    /// Sends up to ``batch`` follow-ups whose time has come (see the type's summary for the
    /// order) and records what became of them; returns how many were confirmed and failed.
    func deliverDue(now: Date = Date()) async -> Pass {
        let due: [FollowUp]
        do {
            due = try await library.store.database.read { db in
                // Due, and not behind an earlier follow-up of its lane that waits for a retry.
                try Row.fetchAll(db, sql: """
                    SELECT id, owner, service, operation, body, attempts, generation FROM outbox
                    WHERE nextAttempt <= ?1
                      AND NOT EXISTS (SELECT 1 FROM outbox earlier INDEXED BY outboxByLane
                                      WHERE earlier.owner = outbox.owner AND earlier.service = outbox.service
                                        AND earlier.id < outbox.id AND earlier.nextAttempt > ?1)
                    ORDER BY id LIMIT ?2
                    """, arguments: [now.timeIntervalSince1970, batch]).map { row in
                    FollowUp(id: row["id"], owner: row["owner"], service: row["service"], operation: row["operation"],
                        body: row["body"] ?? Data(), attempts: row["attempts"], generation: row["generation"])
                }
            }
        } catch {
            logger.error("care.outbox.read.failed", metadata: ["error": "\(error)"])
            return Pass()
        }
        guard !due.isEmpty else { return Pass() }
        // One lane per person and service, in id order; lanes run side by side.
        var lanes: [String: [FollowUp]] = [:]
        var order: [String] = []
        for row in due {
            let lane = "\(row.service)\u{0}\(row.owner)"
            if lanes[lane] == nil { order.append(lane) }
            lanes[lane, default: []].append(row)
        }
        var outcomes: [Outcome] = []
        outcomes.reserveCapacity(due.count)
        let allLanes = lanes
        await withTaskGroup(of: [Outcome].self) { group in
            var next = order.makeIterator()
            for _ in 0..<concurrency {
                guard let lane = next.next() else { break }
                group.addTask { await self.send(allLanes[lane] ?? []) }
            }
            while let finished = await group.next() {
                outcomes += finished
                if let lane = next.next() { group.addTask { await self.send(allLanes[lane] ?? []) } }
            }
        }
        return record(outcomes, now: now, read: due.count)
    }

    /// Sends one lane's follow-ups one after the other, stopping at the first that fails.
    private func send(_ rows: [FollowUp]) async -> [Outcome] {
        var outcomes: [Outcome] = []
        for row in rows {
            do {
                let body: [UInt8] = row.operation == Reminders.Sync.name
                    ? try codec.encode(Reminders.Sync.Request(window: try library.reminderWindow(owner: row.owner))) // the window as it is now
                    : [UInt8](row.body)
                _ = try await bus.call(service: row.service, operation: row.operation, body: body, principal: row.owner, timeout: .seconds(5), idempotent: true)
                outcomes.append(.confirmed(id: row.id, generation: row.generation))
            } catch is CancellationError {
                break // shutting down: not an attempt; it goes after the restart
            } catch {
                outcomes.append(.failed(id: row.id, attempts: row.attempts, error: "\(error)"))
                break // the rest of this lane waits behind it
            }
        }
        return outcomes
    }

    /// Writes a pass's outcomes in one transaction: confirmed follow-ups deleted (a sync only
    /// when nothing asked for it again since its row, and then its window, was read: else it
    /// stays and the next pass sends the newer window), failed ones put off with backoff.
    private func record(_ outcomes: [Outcome], now: Date, read: Int) -> Pass {
        var pass = Pass(read: read)
        do {
            try library.store.database.write { db in
                let confirm = try db.cachedStatement(sql: "DELETE FROM outbox WHERE id = ? AND generation = ?")
                let putOff = try db.cachedStatement(sql: "UPDATE outbox SET attempts = attempts + 1, nextAttempt = ?, lastError = ? WHERE id = ?")
                for outcome in outcomes {
                    switch outcome {
                    case .confirmed(let id, let generation):
                        try confirm.execute(arguments: [id, generation])
                    case .failed(let id, let attempts, let error):
                        try putOff.execute(arguments: [now.timeIntervalSince1970 + min(300, pow(2, Double(attempts))), String(error.prefix(2_000)), id])
                    }
                }
            }
        } catch {
            // Not written: everything of the pass is sent again (services take follow-ups twice).
            logger.error("care.outbox.write.failed", metadata: ["error": "\(error)"])
        }
        for outcome in outcomes {
            switch outcome {
            case .confirmed: pass.delivered += 1
            case .failed: pass.failed += 1
            }
        }
        return pass
    }
}

/// Wakes the outbox when a transaction that added or changed follow-ups commits.
final class OutboxCommits: TransactionObserver, @unchecked Sendable {
    private let wakeup: Wakeup
    /// Whether the transaction under way touched the outbox (the writer's thread only).
    private var touched = false

    init(wakeup: Wakeup) {
        self.wakeup = wakeup
    }

    func observes(eventsOfKind eventKind: DatabaseEventKind) -> Bool {
        switch eventKind {
        case .insert(let table), .update(let table, _): table == "outbox"
        case .delete: false
        }
    }

    func databaseDidChange(with event: DatabaseEvent) {
        touched = true
    }

    func databaseDidCommit(_ db: Database) {
        guard touched else { return }
        touched = false
        wakeup.signal()
    }

    func databaseDidRollback(_ db: Database) {
        touched = false
    }
}
