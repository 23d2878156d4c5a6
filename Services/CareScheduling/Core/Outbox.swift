import CanopyBus
import CanopyMessages
import Foundation
import GRDB
import CanopyServiceKit
import Logging
import Metrics
import ServiceLifecycle

/// Delivers the follow-ups canopy-care owes other services (reminder windows, reminder
/// cancellations, image purges, forgotten identifications). Each one was written to the
/// outbox in the same transaction as the change that caused it, so nothing is lost when a
/// service is down or canopy-care restarts; it is sent until the service confirms, waiting
/// 1, 2, 4 … up to 300 s between attempts.
struct Outbox: Service, HealthReporting {
    let library: CareLibrary
    let bus: BusClient
    let interval: Duration
    let logger: Logger
    private let codec = MessageCodec()
    /// `canopy_care_outbox_pending`: follow-ups not yet confirmed.
    private let pending = Gauge(label: "canopy_care_outbox_pending")
    /// `canopy_care_outbox_oldest_seconds`: how long the oldest pending follow-up has waited.
    private let oldest = Gauge(label: "canopy_care_outbox_oldest_seconds")
    /// `canopy_care_outbox_deliveries_total{outcome}`: attempts, confirmed or failed.
    private let delivered = Counter(label: "canopy_care_outbox_deliveries_total", dimensions: [("outcome", "ok")])
    private let failed = Counter(label: "canopy_care_outbox_deliveries_total", dimensions: [("outcome", "failed")])

    /// What one pass did.
    struct Pass: Equatable {
        var delivered = 0
        var failed = 0
    }

    func run() async throws {
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            let pass = await deliverDue()
            report(pass)
            if pass.failed > 0 {
                logger.debug("care.outbox.pending", metadata: ["care.outbox.failed": "\(pass.failed)"])
            }
            try? await Task.sleep(for: interval)
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

    /// Sends every follow-up whose time has come; returns how many were confirmed.
    func deliverDue(now: Date = Date()) async -> Pass {
        let due: [Row]
        do {
            due = try library.store.database.read { db in
                try Row.fetchAll(db, sql: "SELECT * FROM outbox WHERE nextAttempt <= ? ORDER BY id LIMIT 100", arguments: [now.timeIntervalSince1970])
            }
        } catch {
            logger.error("care.outbox.read.failed", metadata: ["error": "\(error)"])
            return Pass()
        }
        var pass = Pass()
        for row in due {
            let id: Int64 = row["id"], owner: String = row["owner"], operation: String = row["operation"], attempts: Int = row["attempts"]
            let generation: Int64 = row["generation"]
            do {
                let body: [UInt8] = operation == Reminders.Sync.name
                    ? try codec.encode(Reminders.Sync.Request(window: try library.reminderWindow(owner: owner))) // the window as it is now
                    : [UInt8](row["body"] as Data)
                _ = try await bus.call(service: row["service"], operation: operation, body: body, principal: owner, timeout: .seconds(5), idempotent: true)
                // Only if nothing asked for this sync again since its row (and then the window)
                // was read: otherwise the row stays, and the next pass sends the newer window.
                try await library.store.database.write { db in
                    try db.execute(sql: "DELETE FROM outbox WHERE id = ? AND generation = ?", arguments: [id, generation])
                }
                pass.delivered += 1
            } catch {
                let delay = min(300, pow(2, Double(attempts)))
                _ = try? await library.store.database.write { db in
                    try db.execute(sql: "UPDATE outbox SET attempts = attempts + 1, nextAttempt = ?, lastError = ? WHERE id = ?",
                                   arguments: [now.timeIntervalSince1970 + delay, "\(error)", id])
                }
                pass.failed += 1
            }
        }
        return pass
    }
}
