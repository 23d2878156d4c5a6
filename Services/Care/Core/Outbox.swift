import CanopyBus
import CanopyMessages
import CanopyServiceKit
import Foundation
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
/// It is woken by the commit that adds a follow-up (``CareStoring/observeFollowUps(_:)``),
/// not by a timer: a follow-up leaves within milliseconds of its commit. A pass sends
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
        let commits = self.commits
        let observation = await library.store.observeFollowUps { commits.signal() }
        defer { observation.stop() }
        // A graceful shutdown cancels the loop, and with it a sleep until the next commit.
        await cancelWhenGracefulShutdown { await self.loop() }
    }

    private func loop() async {
        var lastReport = ContinuousClock.now - .seconds(1)
        while !Task.isCancelled {
            let started = Date()
            let pass = await deliverDue(now: started)
            if pass.failed > 0 {
                logger.debug("care.outbox.pending", metadata: ["care.outbox.failed": "\(pass.failed)"])
            }
            // The gauges count the whole table: at most once a second under load.
            if ContinuousClock.now - lastReport >= .seconds(1) || pass.read < batch {
                await report(pass)
                lastReport = .now
            } else {
                delivered.increment(by: Int64(pass.delivered))
                failed.increment(by: Int64(pass.failed))
            }
            passes.add()
            if pass.read >= batch { continue } // a backlog: the next pass at once
            await sleep(until: await nextAttempt(after: started))
        }
    }

    /// When the earliest follow-up not due when the pass began comes due, if any (one that
    /// came due during the pass: at once).
    ///
    /// Not the earliest of all: a follow-up due but waiting behind a retry of its lane
    /// would make the loop turn without pause until the retry.
    private func nextAttempt(after now: Date) async -> Date? {
        (try? await library.store.nextFollowUpDue(after: now)) ?? nil
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
            let pending = try await library.store.pendingFollowUps().count
            return [("store", true, "answering"), ("outbox", true, "\(pending) follow-up(s) pending")]
        } catch {
            return [("store", false, "not answering: \(error)")]
        }
    }

    /// Brings the outbox's metrics up to date after a pass; returns what the gauges now say.
    @discardableResult
    func report(_ pass: Pass, now: Date = Date()) async -> (pending: Int, oldestSeconds: Double) {
        delivered.increment(by: Int64(pass.delivered))
        failed.increment(by: Int64(pass.failed))
        let waiting = try? await library.store.pendingFollowUps()
        let count = waiting?.count ?? 0
        let age = waiting?.oldest.map { max(0, now.timeIntervalSince($0)) } ?? 0
        pending.record(count)
        oldest.record(age)
        return (count, age)
    }

    /// Sends up to ``batch`` follow-ups whose time has come (see the type's summary for the
    /// order) and records what became of them; returns how many were confirmed and failed.
    func deliverDue(now: Date = Date()) async -> Pass {
        let due: [FollowUp]
        do {
            due = try await library.store.dueFollowUps(now: now, limit: batch)
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
        var outcomes: [FollowUp.Outcome] = []
        outcomes.reserveCapacity(due.count)
        let allLanes = lanes
        await withTaskGroup(of: [FollowUp.Outcome].self) { group in
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
        let pass = await record(outcomes, now: now, read: due.count)
        // A deleted account's last follow-ups (forget-person) gone from the outbox: the rows
        // that named the person go from the store's log too.
        let confirmed = Set(outcomes.compactMap { if case .confirmed(let id, _) = $0 { id } else { nil } })
        if due.contains(where: { confirmed.contains($0.id) && Self.erasures.contains($0.operation) }) {
            library.store.eraseResidue()
        }
        return pass
    }

    /// The follow-ups that end a person's erasure in another service.
    static let erasures: Set<String> = [Reminders.ForgetPerson.name, Identification.ForgetPerson.name, Images.ForgetPerson.name, Care.DeleteAccount.name]

    /// Sends one lane's follow-ups one after the other, stopping at the first that fails.
    private func send(_ rows: [FollowUp]) async -> [FollowUp.Outcome] {
        var outcomes: [FollowUp.Outcome] = []
        for row in rows {
            do {
                let (library, owner) = (self.library, row.owner)
                let body: [UInt8] =
                    row.operation == Reminders.Sync.name // the window as it is now, read off the pool (it waits on the store)
                    ? try codec.encode(Reminders.Sync.Request(window: try await offThePool { try library.reminderWindow(owner: owner) }))
                    : row.body
                _ = try await bus.call(service: row.service, operation: row.operation, body: body, principal: row.owner, timeout: .seconds(5), idempotent: true)
                outcomes.append(.confirmed(id: row.id, generation: row.generation))
            } catch is CancellationError {
                break // shutting down: not an attempt; it goes after the restart
            } catch {
                outcomes.append(.failed(id: row.id, attempts: row.attempts, error: "\(error)"))
                break // the rest of this lane waits behind it
            }
        }
        // What was not tried goes back: another replica may send it.
        outcomes += rows.dropFirst(outcomes.count).map { .returned(id: $0.id) }
        return outcomes
    }

    /// Writes a pass's outcomes in one transaction: confirmed follow-ups deleted (a sync only
    /// when nothing asked for it again since its row, and then its window, was read: else it
    /// stays and the next pass sends the newer window), failed ones put off with backoff.
    private func record(_ outcomes: [FollowUp.Outcome], now: Date, read: Int) async -> Pass {
        var pass = Pass(read: read)
        do {
            try await library.store.settle(outcomes, now: now)
        } catch {
            // Not written: everything of the pass is sent again (services take follow-ups twice).
            logger.error("care.outbox.write.failed", metadata: ["error": "\(error)"])
        }
        for outcome in outcomes {
            switch outcome {
            case .confirmed: pass.delivered += 1
            case .failed: pass.failed += 1
            case .returned: break
            }
        }
        return pass
    }
}
