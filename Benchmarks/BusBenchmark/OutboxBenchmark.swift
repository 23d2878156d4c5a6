import ArgumentParser
import CanopyBroker
import CanopyBus
import CanopyCare
import CanopyMessages
import Foundation
import GRDB
import Histogram
import Logging
import Synchronization

/// canopy-care's outbox as `serve` builds it, handing reminder windows to a stand-in for
/// canopy-remind that notes when each arrives:
/// - under light load, how long from a plant's save to its window's arrival (an upper bound
///   on commit to arrival: the save's own round trip is in it);
/// - a backlog of N follow-ups drained, per second, against the same calls made directly over
///   the bus by 64 callers (the bus and the stand-in's capacity: the baseline).
struct OutboxBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "outbox",
        abstract: "canopy-care's outbox: save-to-arrival latency under light load, and how fast a backlog drains.",
        discussion: "Example: canopy-bench outbox --saves 200 --backlog 10000")

    @Option(help: "Plants saved one at a time (20 ms apart) for the latency figure.") var saves = 200
    @Option(help: "Follow-ups waiting when canopy-care starts, for the drain figure.") var backlog = 10_000

    /// canopy-remind's stand-in: answers every window at once and notes when each owner's came.
    final class Arrivals: BusService, Sendable {
        let name = Reminders.service
        let seen = Mutex<[String: ContinuousClock.Instant]>([:])
        func register(_ handlers: inout OperationHandlers) {
            handlers.on(Reminders.Sync.self) { [self] _, owner, _ in
                let now = ContinuousClock.now
                seen.withLock { if $0[owner] == nil { $0[owner] = now } }
                return Empty()
            }
        }
        var count: Int { seen.withLock { $0.count } }
    }

    func run() async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-outbox-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let arrivals = Arrivals()
        func stack() async throws -> BenchStack {
            try await BenchStack(logger: logger, asService: true) { endpoint, context in
                var settings = CareServiceSettings(directory: directory, runner: .init(endpoint: endpoint))
                settings.outboxInterval = .seconds(1)
                var runner = ServiceRunner.Configuration(endpoint: endpoint)
                runner.credit = 64
                return [ServiceRunner(service: arrivals, configuration: runner, context: context, logger: logger)]
                    + (try await buildCareService(settings: settings, context: context, logger: logger))
            }
        }

        // Light load: one save at a time.
        let first = try await stack()
        while (try? await first.client.call(Care.CatalogSearch.self, .init(text: "", limit: 1), timeout: .seconds(1))) == nil {
            try await Task.sleep(for: .milliseconds(50))
        }
        progress("saving \(saves) plants one at a time…\n")
        var latency = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
        for index in 0..<saves {
            let owner = "light-\(index)"
            let sent = ContinuousClock.now
            _ = try await first.client.call(Care.AddPlant.self, Care.Plant(scientificName: "Monstera deliciosa"), principal: owner)
            var arrived: ContinuousClock.Instant?
            while arrived == nil {
                arrived = arrivals.seen.withLock { $0[owner] }
                if arrived == nil { try await Task.sleep(for: .microseconds(200)) }
            }
            _ = latency.record(UInt64(max(0, (arrived! - sent).microseconds)))
            try await Task.sleep(for: .milliseconds(20))
        }
        // The baseline for the drain: the same calls, straight over the bus, 64 at once.
        let calls = min(backlog, 10_000)
        let window = Reminders.Sync.Request(window: [])
        let began = ContinuousClock.now
        let client = first.client
        try await withThrowingTaskGroup(of: Void.self) { group in
            for caller in 0..<64 {
                group.addTask {
                    for index in stride(from: caller, to: calls, by: 64) {
                        _ = try await client.call(Reminders.Sync.self, window, principal: "direct-\(index)")
                    }
                }
            }
            try await group.waitForAll()
        }
        let direct = Double(calls) / (ContinuousClock.now - began).seconds
        await first.shutdown()

        // A backlog: follow-ups written while canopy-care was stopped, then drained.
        progress("writing \(backlog) follow-ups, then starting canopy-care…\n")
        let pool = try DatabasePool(path: directory.appendingPathComponent("care.sqlite").path)
        let now = Date().timeIntervalSince1970
        try await pool.write { db in
            for index in 0..<backlog {
                try db.execute(
                    sql: "INSERT INTO outbox (owner, service, operation, body, nextAttempt, createdAt) VALUES (?, ?, ?, ?, ?, ?)",
                    arguments: ["backlog-\(index)", Reminders.service, Reminders.Sync.name, Data(), now, now])
            }
        }
        try pool.close()
        let before = arrivals.count
        let second = try await stack()
        let deadline = ContinuousClock.now + .seconds(300)
        while arrivals.count < before + backlog, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        let times = arrivals.seen.withLock { seen in seen.filter { $0.key.hasPrefix("backlog-") }.map(\.value) }
        await second.shutdown()
        let span = times.isEmpty ? 0 : (times.max()! - times.min()!).seconds
        let drained = Double(times.count) / max(0.001, span)

        print("canopy-bench outbox: canopy-care's follow-ups to a canopy-remind stand-in over the bus")
        printTable([
            ["figure", "value", "baseline", "ratio", "target"],
            ["save to arrival p50 (light load, one at a time)", "\(Double(latency.valueAtPercentile(50)) / 1000) ms", "", "", ""],
            ["save to arrival p99", "\(Double(latency.valueAtPercentile(99)) / 1000) ms", "", "", "under 100 ms"],
            ["backlog drained", "\(times.count) of \(backlog)", "", "", "all"],
            [
                "drained per second (first to last arrival)", String(format: "%.0f", drained), String(format: "%.0f (the same calls, 64 callers)", direct),
                String(format: "%.2f", drained / direct), "2,000",
            ],
        ])
    }
}
