import ArgumentParser
import AsyncHTTPClient
import CanopyBroker
import CanopyBus
import CanopyMessages
import CanopyOutbound
import CanopyRemind
import CanopyServiceKit
import CanopyStore
import CanopyTesting
import Foundation
import GRDB
import Histogram
import Hummingbird
import Logging
import NIOCore
import PostgresNIO
import ServiceLifecycle
import Synchronization

/// canopy-remind at load, as `serve` builds it:
/// - N reminders (one per person, each with a webhook) due over one minute, delivered to a
///   local webhook sink: deliveries per second and lateness (arrival minus due time), against
///   the sink's own capacity measured with the same HTTP client in the same run;
/// - the same on PostgreSQL with one replica and then two, in one run;
/// - windows of 64 synced for many people over the bus, against a bus round trip;
/// - the dispatcher's memory for a million pending reminders.
struct RemindBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "remind",
        abstract: "canopy-remind: deliveries and lateness to a local webhook, window syncs, memory for a million pending reminders.",
        discussion: "Example: canopy-bench remind --reminders 100000 --seconds 60 --people 10000")

    @Option(help: "Reminders due over the delivery run (one per person).") var reminders = 100_000
    @Option(help: "Seconds the reminders are spread over.") var seconds = 60.0
    @Option(help: "People whose windows of 64 are synced.") var people = 10_000
    @Option(help: "Pending reminders for the memory figure.") var memory = 1_000_000
    @Option(help: "Deliveries the dispatcher keeps in flight at once.") var concurrency = DispatchSettings().concurrency
    @Option(help: "Which parts to run: deliveries, replicas, fairness, codec, syncs, memory (comma-separated).") var parts =
        "deliveries,replicas,fairness,codec,syncs,memory"
    @Option(help: "Replicas: reminders (one per person) delivered from SQLite, then PostgreSQL with 1 and 2 replicas.") var replicaReminders = 20_000
    @Option(help: "Replicas: seconds those reminders are due over (0: all at the same instant).") var replicaSeconds = 0.0
    @Option(help: "Replicas: how many PostgreSQL replicas to run, in turn (comma-separated).") var replicaCounts = "1,2"
    @Option(help: "Replicas: an answer within this many seconds counts as quick (a destination's bound is 32 then, else 2).") var quickAnswer = 1.0
    @Option(help: "Fairness: receivers that take --slow-seconds to answer, each on a host of its own.") var slowReceivers = 10
    @Option(help: "Fairness: how long each slow receiver takes to answer.") var slowSeconds = 10.0
    @Option(help: "Fairness: other people's reminders, due over 5 s while the slow receivers hold theirs.") var others = 2_000

    func run() async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        let parts = Set(self.parts.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) })
        if parts.contains("deliveries") {
            try await deliveries(logger: logger)
            print("")
        }
        if parts.contains("replicas") {
            try await replicas(logger: logger)
            print("")
        }
        if parts.contains("fairness") {
            try await fairness(logger: logger)
            print("")
        }
        if parts.contains("codec") {
            try windowCodec()
            print("")
        }
        if parts.contains("syncs") {
            try await syncs(logger: logger)
            print("")
        }
        if parts.contains("memory") { try await memoryFigure(logger: logger) }
    }

    // MARK: - Deliveries

    private func deliveries(logger: Logger) async throws {
        let sink = Sink()
        let sinkGroup = serviceGroup([sink.application], signals: [], logger: logger)
        let sinkTask = Task { try await sinkGroup.run() }
        let url = try await sink.url()

        // The sink's capacity with the same client, many requests at once: the baseline.
        let baseline = try await sink.capacity(url: url, requests: 5_000, concurrency: 64)

        let start = Date().addingTimeInterval(20) // time to load the store and start
        let secret = Self.secret
        let running = try await RunningDispatcher.start(concurrency: concurrency, logger: logger) { db in
            FileHandle.standardError.write(Data("loading \(reminders) reminders…".utf8))
            for person in 0..<reminders {
                try Self.insert(
                    db, person: "u\(person)", url: url, secret: secret, due: start.timeIntervalSince1970 + seconds * Double(person) / Double(reminders))
            }
            FileHandle.standardError.write(Data(" done\n".utf8))
            sink.reset()
        }
        let cpuBefore = processCPU()
        let deadline = start.addingTimeInterval(seconds + 120)
        while sink.count < reminders, Date() < deadline { try await Task.sleep(for: .milliseconds(200)) }
        let cpu = processCPU() - cpuBefore
        let arrivals = sink.arrivals()
        let figures = Lateness(arrivals)
        print(
            "canopy-bench remind: \(reminders) reminders due over \(Int(seconds)) s (\(Int(Double(reminders) / seconds))/s asked), one per person, to a local webhook sink"
        )
        printTable([
            ["figure", "value"],
            ["delivered", "\(arrivals.count) of \(reminders)"],
            ["deliveries per second (over the run)", String(format: "%.0f", figures.rate)],
            ["sink capacity, same client, 64 at once (baseline)", String(format: "%.0f/s", baseline)],
            ["lateness p50 ms", "\(figures.histogram.valueAtPercentile(50))"],
            ["lateness p99 ms", "\(figures.histogram.valueAtPercentile(99))"],
            ["lateness max ms", String(format: "%.0f", figures.latest)],
            ["process CPU over the run (cores)", String(format: "%.2f", cpu / (figures.span + 1))],
        ])
        await running.stop()
        await sinkGroup.triggerGracefulShutdown()
        _ = try? await sinkTask.value
    }

    static let secret = "whsec_" + Data((0..<32).map { UInt8($0) }).base64EncodedString()

    // MARK: - Replicas

    /// `replicaReminders` reminders (one per person) due over `replicaSeconds` (0: all at the
    /// same instant, a time zone's 09:00), delivered to one sink: on SQLite (the baseline), on a
    /// throwaway PostgreSQL by one canopy-remind replica and then by two (each loads every
    /// pending reminder at start; they share the work), and against the physical limit of the
    /// queue itself: a bare `FOR UPDATE SKIP LOCKED` claim-and-delete loop on the same server.
    private func replicas(logger: Logger) async throws {
        let sink = Sink()
        let sinkGroup = serviceGroup([sink.application], signals: [], logger: logger)
        let sinkTask = Task { try await sinkGroup.run() }
        let url = try await sink.url()
        progress("starting a throwaway PostgreSQL (Debian's postgresql)…\n")
        let server = try await PostgresServer()
        defer { server.stop() }
        let (reminders, spread, secret) = (replicaReminders, replicaSeconds, Self.secret)
        // Time to load the store and start, then the reminders due over `spread`.
        let lead = 8 + Double(reminders) / 10_000
        func dues(from start: Date) -> [Double] {
            (0..<reminders).map { start.timeIntervalSince1970 + spread * Double($0) / Double(reminders) }
        }
        var rows = [
            [
                "store", "replicas", "delivered", "per second", "÷ SQLite", "lateness p50 ms", "p99 ms", "max ms", "drained in s", "sent twice",
                "PostgreSQL CPU ms a reminder", "process CPU (cores)",
            ]
        ]
        var sqliteRate = 0.0
        let counts = replicaCounts.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }
        for (backend, count) in [("SQLite", 1)] + counts.map({ ("PostgreSQL", $0) }) {
            sink.reset()
            let start = Date().addingTimeInterval(lead)
            let dueTimes = dues(from: start)
            let running: [RunningDispatcher]
            if backend == "SQLite" {
                running = [
                    try await RunningDispatcher.start(concurrency: concurrency, quickAnswer: quickAnswer, logger: logger) { db in
                        for (person, due) in dueTimes.enumerated() { try Self.insert(db, person: "u\(person)", url: url, secret: secret, due: due) }
                    }
                ]
            } else {
                let database = try await server.database("canopy_remind_\(count)")
                let store = try await PostgresStore.open(url: database, migrator: remindStoreImport.migrator, size: 1, logger: logger)
                try store.write { session in
                    let people = (0..<reminders).map { "u\($0)" }
                    try session.execute(
                        """
                        INSERT INTO devices (id, owner, channel, address, secret, active, registeredAt)
                        SELECT 'd-' || person, person, 'webhook', \(url), \(secret), true, 0 FROM unnest(\(people)) AS person
                        """)
                    try session.execute(
                        """
                        INSERT INTO reminders (owner, taskID, due, plantID, kind, title, fireAt, state, updatedAt)
                        SELECT person, 'p-' || person || ':water', due, 'p-' || person, 'water', 'Water it', due, 'pending', 0
                        FROM unnest(\(people), \(dueTimes)) AS r(person, due)
                        """)
                }
                store.close()
                running = try await (0..<count).asyncMap { _ in
                    try await RunningDispatcher.start(
                        concurrency: concurrency, quickAnswer: quickAnswer, postgres: PostgresSettings(url: database, poolSize: 8), logger: logger
                    ) { _ in }
                }
            }
            let cpuBefore = (process: processCPU(), database: databaseCPUSeconds(server.pid))
            let deadline = start.addingTimeInterval(spread + 600)
            while sink.count < reminders, Date() < deadline { try await Task.sleep(for: .milliseconds(100)) }
            let drained = Date().timeIntervalSince(start)
            try await Task.sleep(for: .seconds(1)) // a second copy of any would arrive by now
            let arrivals = sink.arrivals()
            let cpu = (process: processCPU() - cpuBefore.process, database: databaseCPUSeconds(server.pid) - cpuBefore.database)
            for replica in running { await replica.stop() }
            let figures = Lateness(arrivals)
            if backend == "SQLite" { sqliteRate = figures.rate }
            rows.append([
                backend, "\(count)", "\(Set(arrivals.map(\.task)).count) of \(reminders)", String(format: "%.0f", figures.rate),
                String(format: "%.2f", figures.rate / max(1, sqliteRate)), "\(figures.histogram.valueAtPercentile(50))",
                "\(figures.histogram.valueAtPercentile(99))", String(format: "%.0f", figures.latest), String(format: "%.1f", drained),
                "\(arrivals.count - Set(arrivals.map(\.task)).count)",
                backend == "SQLite" ? "-" : String(format: "%.3f", cpu.database * 1_000 / Double(max(1, arrivals.count))),
                String(format: "%.2f", cpu.process / max(1, figures.span)),
            ])
        }
        let bare = try await bareClaims(server: server, rows: reminders, logger: logger)
        print(
            "canopy-bench remind replicas: \(reminders) reminders due \(spread == 0 ? "at the same instant" : "over \(Int(spread)) s"), one per person, to a local webhook sink"
        )
        printTable(rows)
        print(
            String(
                format:
                    "the queue's limit on this PostgreSQL: a bare FOR UPDATE SKIP LOCKED claim-and-delete loop (batches of 256, 2 connections) claims %.0f rows/s at %.3f ms of PostgreSQL CPU a row",
                bare.rate, bare.cpuMilliseconds))
        for (index, row) in rows.dropFirst().enumerated() where row[0] == "PostgreSQL" {
            print(
                "  PostgreSQL, \(row[1]) replica(s): deliveries ÷ bare claims \(String(format: "%.3f", (Double(row[3]) ?? 0) / max(1, bare.rate))) (row \(index + 1))"
            )
        }
        await sinkGroup.triggerGracefulShutdown()
        _ = try? await sinkTask.value
    }

    /// Lateness (arrival minus due time) and the rate over the arrivals.
    struct Lateness {
        var histogram = Histogram<UInt64>(highestTrackableValue: 3_600_000, numberOfSignificantValueDigits: .three)
        var latest = 0.0
        var rate = 0.0
        var span = 0.0

        init(_ arrivals: [(at: Double, due: Double, task: String)]) {
            for arrival in arrivals {
                let late = max(0, arrival.at - arrival.due) * 1000
                latest = max(latest, late)
                _ = histogram.record(UInt64(late.rounded()))
            }
            let first = arrivals.map(\.at).min() ?? 0, last = arrivals.map(\.at).max() ?? 0
            span = max(0.001, last - first)
            rate = Double(arrivals.count) / span
        }
    }

    /// The queue's physical limit on `server`: `rows` rows claimed and deleted by two
    /// connections, 256 at a time with `FOR UPDATE SKIP LOCKED` (what PostgreSQL job queues
    /// do), as claims a second and PostgreSQL CPU a row.
    private func bareClaims(server: PostgresServer, rows: Int, logger: Logger) async throws -> (rate: Double, cpuMilliseconds: Double) {
        let database = try await server.database("canopy_bare_claims")
        try await PostgresServer.query(database, "CREATE TABLE jobs (id BIGSERIAL PRIMARY KEY, due DOUBLE PRECISION NOT NULL)")
        try await PostgresServer.query(database, "CREATE INDEX jobsByDue ON jobs(due)")
        // Ten times the reminders (at least 200,000): enough CPU time to read in clock ticks.
        try await PostgresServer.query(database, "INSERT INTO jobs (due) SELECT g FROM generate_series(1, \(max(200_000, rows * 10))) AS g")
        try await PostgresServer.query(database, "VACUUM ANALYZE jobs")
        // Connected first and closed after the CPU is read: a connection's server process
        // takes its CPU time with it when it ends.
        let connections = try await (0..<2).asyncMap { id in
            try await PostgresConnection.connect(configuration: try database.connectionConfiguration(), id: id, logger: logger)
        }
        defer { for connection in connections { connection.close().whenComplete { _ in } } }
        let before = databaseCPUSeconds(server.pid)
        let begin = ContinuousClock.now
        let total = try await withThrowingTaskGroup(of: Int.self) { group in
            for client in connections {
                group.addTask {
                    var claimed = 0
                    while true {
                        var count = 0
                        for try await _ in try await client.query(
                            "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs ORDER BY due LIMIT 256 FOR UPDATE SKIP LOCKED) RETURNING id", logger: logger)
                        {
                            count += 1
                        }
                        if count == 0 { return claimed }
                        claimed += count
                    }
                }
            }
            return try await group.reduce(0, +)
        }
        let seconds = (ContinuousClock.now - begin).seconds
        return (Double(total) / max(0.001, seconds), (databaseCPUSeconds(server.pid) - before) * 1_000 / Double(max(1, total)))
    }

    /// One person with a webhook device and one reminder due at `due`.
    static func insert(_ db: Database, person: String, url: String, secret: String, due: Double) throws {
        try db.execute(
            sql: "INSERT INTO devices (id, owner, channel, address, secret, active, registeredAt) VALUES (?, ?, 'webhook', ?, ?, 1, 0)",
            arguments: ["d-\(person)", person, url, secret])
        try db.execute(
            sql: """
                INSERT INTO reminders (owner, taskID, due, plantID, kind, title, fireAt, state, updatedAt) VALUES (?, ?, ?, ?, 'water', 'Water it', ?, 'pending', 0)
                """, arguments: [person, "p-\(person):water", due, "p-\(person)", due])
    }

    // MARK: - Fairness

    /// Other people's lateness while `slowReceivers` receivers, each on a host of its own,
    /// take `slowSeconds` to answer each of their many sends, against the same run without
    /// them (the baseline).
    private func fairness(logger: Logger) async throws {
        func othersLateness(slow: Int) async throws -> (Histogram<UInt64>, delivered: Int, slowArrived: Int) {
            let sink = Sink()
            let slowSinks = (0..<slow).map { Sink(host: "127.0.0.\(2 + $0)", delay: .seconds(slowSeconds)) }
            let sinks = serviceGroup([sink.application] + slowSinks.map(\.application), signals: [], logger: logger)
            let sinksTask = Task { try await sinks.run() }
            let url = try await sink.url()
            var urls: [String] = []
            for slowSink in slowSinks { urls.append(try await slowSink.url()) }
            let slowURLs = urls
            let start = Date().addingTimeInterval(3)
            let (others, secret) = (self.others, Self.secret)
            let running = try await RunningDispatcher.start(
                concurrency: concurrency, allowedHosts: Set((0..<max(1, slow)).map { "127.0.0.\(2 + $0)" }),
                logger: logger
            ) { db in
                // Each slow receiver: 20 people's reminders due first, at the start.
                for (index, slowURL) in slowURLs.enumerated() {
                    for person in 0..<20 {
                        try Self.insert(db, person: "slow\(index)-\(person)", url: slowURL, secret: secret, due: start.timeIntervalSince1970)
                    }
                }
                // Everyone else's from 0.5 s on, over 5 s.
                for person in 0..<others {
                    try Self.insert(
                        db, person: "u\(person)", url: url, secret: secret, due: start.timeIntervalSince1970 + 0.5 + 5 * Double(person) / Double(others))
                }
            }
            let deadline = start.addingTimeInterval(60)
            while sink.count < others, Date() < deadline { try await Task.sleep(for: .milliseconds(100)) }
            var lateness = Histogram<UInt64>(highestTrackableValue: 600_000, numberOfSignificantValueDigits: .three)
            for arrival in sink.arrivals() { _ = lateness.record(UInt64((max(0, arrival.at - arrival.due) * 1000).rounded())) }
            let slowArrived = slowSinks.reduce(0) { $0 + $1.arrived }
            await running.stop()
            await sinks.triggerGracefulShutdown()
            _ = try? await sinksTask.value
            return (lateness, sink.count, slowArrived)
        }
        let (baseline, baselineDelivered, _) = try await othersLateness(slow: 0)
        let (loaded, delivered, slowArrived) = try await othersLateness(slow: slowReceivers)
        print(
            "canopy-bench remind fairness: \(others) people's reminders due over 5 s, while \(slowReceivers) receivers (a host each) take \(Int(slowSeconds)) s per answer for 20 sends each"
        )
        printTable([
            ["figure", "without slow receivers (baseline)", "with them", "ratio"],
            ["others delivered", "\(baselineDelivered) of \(others)", "\(delivered) of \(others)", ""],
            [
                "others' lateness p50 ms", "\(baseline.valueAtPercentile(50))", "\(loaded.valueAtPercentile(50))",
                String(format: "%.2f", Double(loaded.valueAtPercentile(50)) / Double(max(1, baseline.valueAtPercentile(50)))),
            ],
            [
                "others' lateness p99 ms (target under 100)", "\(baseline.valueAtPercentile(99))", "\(loaded.valueAtPercentile(99))",
                String(format: "%.2f", Double(loaded.valueAtPercentile(99)) / Double(max(1, baseline.valueAtPercentile(99)))),
            ],
            ["others' lateness max ms", "\(baseline.max)", "\(loaded.max)", ""],
            ["slow receivers' requests in flight at the end (at most 4 a host)", "", "\(slowArrived)", ""],
        ])
    }

    // MARK: - Syncs

    /// A window of 64 (8 tasks, each due 8 times) as canopy-care makes it.
    static func window(_ person: Int, base: Date, shift: Double) -> [Care.Task] {
        (0..<64).map { index in
            Care.Task(
                id: "p\(person)-\(index % 8):water", plantID: "p\(person)-\(index % 8)", kind: .water, title: "Water plant \(index % 8)",
                due: base.addingTimeInterval(Double(index) * 43_200 + shift))
        }
    }

    /// What one window costs to encode and decode with the bus's codec: as it travels (each
    /// task once with its due times) against one keyed object per occurrence (how it
    /// travelled before), in the same run.
    private func windowCodec() throws {
        let codec = MessageCodec()
        let window = Self.window(1, base: Date(), shift: 0)
        let rounds = 5_000
        func measure(_ body: () throws -> Void) rethrows -> Double {
            for _ in 0..<200 { try body() } // warm
            let begin = ContinuousClock.now
            for _ in 0..<rounds { try body() }
            let elapsed = ContinuousClock.now - begin
            return Double(elapsed.microseconds) / Double(rounds)
        }
        let flatBytes = try codec.encode(window)
        let groupedBytes = try codec.encode(Reminders.Sync.Request(window: window))
        let flatEncode = try measure { _ = try codec.encode(window) }
        let groupedEncode = try measure { _ = try codec.encode(Reminders.Sync.Request(window: window)) }
        let flatDecode = try measure { _ = try codec.decode([Care.Task].self, from: flatBytes) }
        let groupedDecode = try measure { _ = try codec.decode(Reminders.Sync.Request.self, from: groupedBytes).occurrences }
        print("one window of 64 (8 tasks due 8 times each) through the bus codec, \(rounds) times each")
        printTable([
            ["shape", "bytes", "encode µs", "decode µs", "decode against 64 keyed objects"],
            ["64 keyed occurrences (before, baseline)", "\(flatBytes.count)", String(format: "%.1f", flatEncode), String(format: "%.1f", flatDecode), "1.00"],
            [
                "each task once with its due times", "\(groupedBytes.count)", String(format: "%.1f", groupedEncode), String(format: "%.1f", groupedDecode),
                String(format: "%.2f", groupedDecode / flatDecode),
            ],
        ])
    }

    private func syncs(logger: Logger) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-remind-sync-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let stack = try await BenchStack(logger: logger, asService: true) { endpoint, context in
            var runner = ServiceRunner.Configuration(endpoint: endpoint)
            runner.credit = 16
            return try await buildReminderService(settings: ReminderServiceSettings(directory: directory, runner: runner), context: context, logger: logger)
        }
        let client = stack.client
        let base = Date().addingTimeInterval(86_400)
        func window(_ person: Int, shift: Double) -> [Care.Task] { Self.window(person, base: base, shift: shift) }
        _ = try await client.call(Reminders.ListDevices.self, .init(), principal: "warm")
        var roundTrip = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
        for _ in 0..<200 {
            let begin = ContinuousClock.now
            _ = try await client.call(Reminders.ListDevices.self, .init(), principal: "warm")
            _ = roundTrip.record(UInt64((ContinuousClock.now - begin).microseconds))
        }
        let people = self.people
        func syncAll(shift: Double) async throws -> (Duration, Histogram<UInt64>, cpu: Double) {
            let begin = ContinuousClock.now
            let cpuBefore = processCPU()
            let histograms = try await withThrowingTaskGroup(of: Histogram<UInt64>.self) { group in
                for worker in 0..<16 {
                    group.addTask {
                        var histogram = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
                        for person in stride(from: worker, to: people, by: 16) {
                            let start = ContinuousClock.now
                            _ = try await client.call(Reminders.Sync.self, .init(window: window(person, shift: shift)), principal: "u\(person)")
                            _ = histogram.record(UInt64((ContinuousClock.now - start).microseconds))
                        }
                        return histogram
                    }
                }
                return try await group.reduce(into: [Histogram<UInt64>]()) { $0.append($1) }
            }
            var all = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
            for histogram in histograms { all.add(histogram) }
            return (ContinuousClock.now - begin, all, processCPU() - cpuBefore)
        }
        let first = try await syncAll(shift: 0)
        let again = try await syncAll(shift: 0)
        let moved = try await syncAll(shift: 3_600)
        print("\(people) people, windows of 64, 16 callers at once, over the bus (CPU: the whole process, callers, broker and service, per sync)")
        printTable([
            ["sync", "total s", "per sync p50 µs", "p99 µs", "p50 against a bus round trip", "CPU µs per sync"],
            ["bus round trip (devices.list, baseline)", "", "\(roundTrip.valueAtPercentile(50))", "\(roundTrip.valueAtPercentile(99))", "1.0", ""],
            row("first window (64 new)", first.0, first.1, roundTrip) + [String(format: "%.0f", first.cpu / Double(people) * 1e6)],
            row("the same window again", again.0, again.1, roundTrip) + [String(format: "%.0f", again.cpu / Double(people) * 1e6)],
            row("every occurrence moved", moved.0, moved.1, roundTrip) + [String(format: "%.0f", moved.cpu / Double(people) * 1e6)],
        ])
        await stack.shutdown()
    }

    private func row(_ name: String, _ total: Duration, _ calls: Histogram<UInt64>, _ baseline: Histogram<UInt64>) -> [String] {
        [
            name, String(format: "%.2f", total.seconds),
            "\(calls.valueAtPercentile(50))", "\(calls.valueAtPercentile(99))",
            String(format: "%.1f", Double(calls.valueAtPercentile(50)) / Double(baseline.valueAtPercentile(50))),
        ]
    }

    // MARK: - Memory

    private func memoryFigure(logger: Logger) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-remind-memory-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let settings = ReminderServiceSettings(directory: directory, runner: .init(endpoint: "tcp://127.0.0.1:1"))
        let services = try await buildReminderService(settings: settings, context: ZMQContext(), logger: logger)
        guard let dispatcher = services.lazy.compactMap({ $0 as? Dispatcher }).first else { return }
        FileHandle.standardError.write(Data("loading \(memory) pending reminders…".utf8))
        let pool = try DatabasePool(path: settings.databasePath)
        let far = Date().addingTimeInterval(30 * 86_400).timeIntervalSince1970
        try await pool.write { db in
            for index in 0..<memory {
                try db.execute(
                    sql: """
                        INSERT INTO reminders (owner, taskID, due, plantID, kind, title, fireAt, state, updatedAt) VALUES (?, ?, ?, ?, 'water', 'Water it', ?, 'pending', 0)
                        """, arguments: ["u\(index / 64)", "p\(index):water", far + Double(index), "p\(index)", far + Double(index)])
            }
        }
        try pool.close()
        FileHandle.standardError.write(Data(" done\n".utf8))
        let before = residentBytes()
        let task = Task { try await dispatcher.run() }
        while dispatcher.held.reminders < memory { try await Task.sleep(for: .milliseconds(50)) }
        try await Task.sleep(for: .milliseconds(500))
        let after = residentBytes()
        task.cancel()
        _ = try? await task.value
        print("The dispatcher holding \(memory) pending reminders")
        printTable([
            ["figure", "value"],
            ["resident memory before loading", "\(before / 1_048_576) MiB"],
            ["resident memory with them loaded", "\(after / 1_048_576) MiB"],
            ["growth", String(format: "%.1f MiB, %.1f bytes per reminder", Double(after - before) / 1_048_576, Double(after - before) / Double(memory))],
        ])
    }
}

/// canopy-remind as `serve` builds it, with a broker of its own and its store loaded first.
private struct RunningDispatcher {
    let group: ServiceGroup
    let serving: Task<Void, Error>
    let broker: BrokerServer
    let brokerTask: Task<Void, Error>
    let directory: URL

    /// With `postgres`, on that database (loaded already: `load` is not called).
    static func start(
        concurrency: Int, quickAnswer: Double = 1, allowedHosts: Set<String> = [], postgres: PostgresSettings? = nil, logger: Logger,
        load: @escaping @Sendable (Database) throws -> Void
    ) async throws -> RunningDispatcher {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-remind-\(UUID().uuidString)")
        var settings = ReminderServiceSettings(directory: directory, runner: .init(endpoint: "tcp://127.0.0.1:1"))
        settings.allowedHosts = allowedHosts.union(["127.0.0.1"])
        settings.dispatch.digestWindow = .zero
        settings.dispatch.concurrency = concurrency
        settings.dispatch.quickAnswer = .seconds(quickAnswer)
        settings.postgres = postgres
        let broker = try BrokerServer(endpoint: "tcp://127.0.0.1:*", context: ZMQContext(), logger: logger)
        settings.runner = .init(endpoint: broker.endpoint)
        let brokerTask = Task { try await broker.run() }
        if postgres == nil {
            // Loaded before the service opens it: the dispatcher reads what is pending at start.
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        }
        let services = try await buildReminderService(settings: settings, context: ZMQContext(), logger: logger).filter { !($0 is OperatingEndpoint) }
        if postgres == nil {
            let pool = try DatabasePool(path: settings.databasePath)
            try await pool.write { db in try load(db) }
        }
        let group = serviceGroup(services, signals: [], logger: logger)
        return RunningDispatcher(group: group, serving: Task { try await group.run() }, broker: broker, brokerTask: brokerTask, directory: directory)
    }

    func stop() async {
        await group.triggerGracefulShutdown()
        _ = try? await serving.value
        broker.stop()
        _ = try? await brokerTask.value
        try? FileManager.default.removeItem(at: directory)
    }
}

/// A webhook receiver that answers 200 (at once, or after `delay`) and notes each arrival with
/// the reminders' due times.
private final class Sink: Sendable {
    private final class Shared: Sendable {
        let value = Mutex<(arrivals: [(at: Double, due: Double, task: String)], count: Int, port: Int?)>(([], 0, nil))
        let arrived = Atomic<Int>(0)
        func withLock<T>(_ body: (inout (arrivals: [(at: Double, due: Double, task: String)], count: Int, port: Int?)) -> T) -> T {
            value.withLock { body(&$0) }
        }
    }

    private let state = Shared()
    private let host: String
    let application: Application<RouterResponder<BasicRequestContext>>

    init(host: String = "127.0.0.1", delay: Duration = .zero) {
        let router = Router()
        let state = self.state
        self.host = host
        let decoder = MessageCodec()
        router.post("/hook") { request, _ -> HTTPResponse.Status in
            let body = try await request.body.collect(upTo: 1024 * 1024)
            state.arrived.add(1, ordering: .relaxed)
            if delay > .zero { try await Task.sleep(for: delay) }
            let at = Date().timeIntervalSince1970
            let reminders = (try? decoder.decode(Payload.self, from: Array(body.readableBytesView)).data.reminders) ?? []
            state.withLock { state in
                state.count += 1
                for reminder in reminders { state.arrivals.append((at, reminder.due.timeIntervalSince1970, reminder.taskID)) }
            }
            return .ok
        }
        application = Application(
            router: router, configuration: .init(address: .hostname(host, port: 0), serverName: "sink"),
            onServerRunning: { channel in state.withLock { $0.port = channel.localAddress?.port } })
    }

    struct Payload: Decodable {
        struct Data: Decodable { var reminders: [Reminders.Reminder] }
        var data: Data
    }

    func url() async throws -> String {
        while true {
            if let port = state.withLock({ $0.port }) { return "http://\(host):\(port)/hook" }
            try await Task.sleep(for: .milliseconds(10))
        }
    }

    var count: Int { state.withLock { $0.count } }
    /// Requests that arrived, answered or not.
    var arrived: Int { state.arrived.load(ordering: .relaxed) }
    func reset() { state.withLock { $0 = ([], 0, $0.port) } }
    func arrivals() -> [(at: Double, due: Double, task: String)] { state.withLock { $0.arrivals } }

    /// Requests per second the sink takes from the webhooks' own client (``PinnedHTTP``, a
    /// connection a request) with `concurrency` at once.
    func capacity(url: String, requests: Int, concurrency: Int) async throws -> Double {
        let body = Array(#"{"data":{"reminders":[]},"type":"reminder.due","timestamp":"2026-01-01T00:00:00.000Z"}"#.utf8)
        var settings = PinnedHTTP.Settings()
        settings.allowedHosts = ["127.0.0.1"]
        let http = try PinnedHTTP(settings: settings)
        let begin = ContinuousClock.now
        try await withThrowingTaskGroup(of: Void.self) { group in
            for worker in 0..<concurrency {
                group.addTask {
                    for _ in stride(from: worker, to: requests, by: concurrency) {
                        _ = try await http.send(.init(url: url, method: .POST, headers: ["Content-Type": "application/json"], body: body))
                    }
                }
            }
            try await group.waitForAll()
        }
        let elapsed = ContinuousClock.now - begin
        return Double(requests) / elapsed.seconds
    }
}

/// This process's CPU time so far, in seconds.
func processCPU() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

/// This process's resident memory, from /proc/self/status.
private func residentBytes() -> Int {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
        let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") })
    else { return 0 }
    return (Int(line.split(separator: " ").dropFirst().first ?? "0") ?? 0) * 1024
}

extension Sequence {
    /// `transform` applied to each element in turn, awaiting each.
    func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var results: [T] = []
        for element in self { results.append(try await transform(element)) }
        return results
    }
}
