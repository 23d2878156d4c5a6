import ArgumentParser
import CanopyBroker
import CanopyBus
import CanopyCare
import CanopyMessages
import CanopyStore
import CanopyTesting
import Foundation
import Histogram
import Logging

/// canopy-care end to end over the bus (seed 003's targets, stricter for a server), against a
/// bus round trip to the same service measured in the same run.
struct CareBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "care",
        abstract: "Collection list, search, upcoming tasks and plant saves over the bus; a year of tasks for 10,000 plants.",
        discussion: "Example: canopy-bench care --repeats 300")

    @Option(help: "Timed requests per measurement.") var repeats = 300
    @Option(help: "The stores to measure, in turn: sqlite, postgres or both (postgres: a throwaway server, or --database-url).") var backends =
        "sqlite,postgres"
    @Option(help: "A PostgreSQL to measure on instead of a throwaway server (an empty database).") var databaseURL: String?
    @Option(help: "Concurrent callers for the same requests measured again at once (0: not measured).") var callers = 64

    /// One backend's figures: each request's latencies, the round trip, and CPU per request.
    struct Figures {
        var backend: String
        var roundTrip: Histogram<UInt64>
        var rows: [(name: String, plants: String, latency: Histogram<UInt64>, target: String)] = []
        /// The same requests from ``CareBenchmark/callers`` callers at once, with requests a second.
        var together: [(name: String, latency: Histogram<UInt64>, perSecond: Double)] = []
        /// CPU seconds per request: this process (client, broker, canopy-care) and PostgreSQL's processes.
        var processCPU: Double = 0
        var databaseCPU: Double = 0
        var requests = 0
    }

    func run() async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        var figures: [Figures] = []
        for backend in backends.split(separator: ",").map(String.init) {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-care-\(UUID().uuidString)")
            defer { try? FileManager.default.removeItem(at: directory) }
            var settings = CareServiceSettings(directory: directory, runner: .init(endpoint: ""))
            var server: PostgresServer?
            switch backend {
            case "sqlite": break
            case "postgres":
                if let databaseURL {
                    settings.postgres = PostgresSettings(url: try DatabaseURL(parsing: databaseURL))
                } else {
                    progress("starting a throwaway PostgreSQL (Debian's postgresql)…\n")
                    let started = try await PostgresServer()
                    server = started
                    settings.postgres = PostgresSettings(url: try await started.database("canopy_bench"))
                }
            default: throw ValidationError("--backends lists sqlite and postgres; got \(backend)")
            }
            defer { server?.stop() }
            figures.append(try await measure(backend, settings: settings, postgres: server, logger: logger))
        }
        for figure in figures {
            var rows = [["request", "plants", "p50 µs", "p99 µs", "p99 vs round trip", "target p99"]]
            let baseline = Double(figure.roundTrip.valueAtPercentile(99))
            for row in [("catalog.search one result (baseline round trip)", "-", figure.roundTrip, "-")] + figure.rows {
                rows.append([
                    row.0, row.1, "\(row.2.valueAtPercentile(50))", "\(row.2.valueAtPercentile(99))",
                    String(format: "%.1f", Double(row.2.valueAtPercentile(99)) / baseline), row.3,
                ])
            }
            print("canopy-bench care on \(figure.backend): over the bus (client to broker to canopy-care and back), \(repeats) requests each")
            printTable(rows)
            print(
                String(
                    format: "CPU per request: %.0f µs in this process (client, broker, canopy-care), %.0f µs in PostgreSQL\n",
                    figure.processCPU * 1e6 / Double(max(1, figure.requests)), figure.databaseCPU * 1e6 / Double(max(1, figure.requests))))
        }
        if figures.count == 2 {
            var rows = [["request", "\(figures[0].backend) p99 µs", "\(figures[1].backend) p99 µs", "ratio"]]
            for (first, second) in zip(figures[0].rows, figures[1].rows) {
                let (a, b) = (first.latency.valueAtPercentile(99), second.latency.valueAtPercentile(99))
                rows.append([first.name, "\(a)", "\(b)", String(format: "%.2f", Double(b) / Double(max(1, a)))])
            }
            print("the same requests, \(figures[1].backend) against \(figures[0].backend) in this run:")
            printTable(rows)
        }
        if callers > 0 {
            var rows = [["request", "callers"] + figures.flatMap { ["\($0.backend) requests/s", "\($0.backend) p50 µs", "\($0.backend) p99 µs"] }]
            for (index, name) in (figures.first?.together.map(\.name) ?? []).enumerated() {
                rows.append(
                    [name, "\(callers)"]
                        + figures.flatMap { figure in
                            let row = figure.together[index]
                            return [String(format: "%.0f", row.perSecond), "\(row.latency.valueAtPercentile(50))", "\(row.latency.valueAtPercentile(99))"]
                        })
            }
            print("\nthe same requests from \(callers) callers at once (each saving for a person of their own; reading the same people), in this run:")
            printTable(rows)
        }

        // A year of tasks for 10,000 plants, with the scheduler the service uses.
        let catalog = CareTools.catalog.species
        let profiles = (0..<10_000).map { catalog[$0 % catalog.count].profile }
        let preferences = Care.Preferences(timeZone: "Europe/Berlin", preferredMinute: 9 * 60)
        let start = Date()
        var best = Duration.seconds(1_000)
        var count = 0
        for _ in 0..<3 {
            let began = ContinuousClock.now
            count = try CareTools.plan(profiles: profiles, preferences: preferences, from: start, days: 365)
            best = min(best, ContinuousClock.now - began)
        }
        let seconds = best.seconds
        print(
            String(
                format: "\na year of tasks for 10,000 plants: %d tasks in %.3f s (best of 3; target under 1 s), %.1f µs per plant", count, seconds,
                seconds * 1e6 / 10_000))
    }

    /// canopy-care on `settings`' store behind a broker: 500 and 1,000 plants seeded through
    /// the bus, then each request timed `repeats` times.
    private func measure(_ backend: String, settings: CareServiceSettings, postgres: PostgresServer?, logger: Logger) async throws -> Figures {
        let stack = try await BenchStack(logger: logger) { endpoint, context in
            var settings = settings
            settings.runner = .init(endpoint: endpoint)
            return try await buildCareService(settings: settings, context: context, logger: logger)
        }
        let client = stack.client
        while (try? await client.call(Care.CatalogSearch.self, .init(text: "", limit: 1), timeout: .seconds(1))) == nil {
            try await Task.sleep(for: .milliseconds(50))
        }
        let catalog = CareTools.catalog.species
        @Sendable func plant(_ index: Int) -> Care.Plant {
            let species = catalog[index % catalog.count]
            return Care.Plant(
                scientificName: species.scientificName, customName: index % 7 == 0 ? "Plant \(index)" : nil, favourite: index % 5 == 0,
                identificationSource: index % 2 == 0 ? .plantnet : .manual, identificationConfidence: 0.8)
        }
        progress("\(backend): seeding 500 plants for one person and 1,000 for another (timing each save)…\n")
        let cpuBefore = (process: processCPU(), database: postgres.map { databaseCPUSeconds($0.pid) } ?? 0)
        var saves = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
        for index in 0..<500 {
            let start = ContinuousClock.now
            _ = try await client.call(Care.AddPlant.self, plant(index), principal: "five-hundred")
            _ = saves.record(UInt64((ContinuousClock.now - start).microseconds))
        }
        for index in 0..<1_000 { _ = try await client.call(Care.AddPlant.self, plant(index), principal: "thousand") }
        var figures = Figures(backend: backend, roundTrip: try await timed { _ = try await client.call(Care.CatalogSearch.self, .init(text: "zz", limit: 1)) })
        figures.rows.append(("plants.add (save, schedule, outbox)", "0-500", saves, "5,000"))
        figures.rows.append(
            (
                "plants.list first page of 50", "500",
                try await timed {
                    _ = try await client.call(Care.ListPlants.self, .init(limit: 50), principal: "five-hundred")
                }, "20,000"
            ))
        figures.rows.append(
            (
                "plants.list all 500", "500",
                try await timed {
                    _ = try await client.call(Care.ListPlants.self, .init(limit: 500), principal: "five-hundred")
                }, "20,000"
            ))
        let words = ["mon", "fern", "araceae", "palm", "swiss", "ficus", "jade", "lily"]
        var word = 0
        figures.rows.append(
            (
                "plants.list search (8 terms in turn)", "1,000",
                try await timed {
                    word += 1
                    _ = try await client.call(Care.ListPlants.self, .init(search: words[word % words.count], limit: 50), principal: "thousand")
                }, "10,000"
            ))
        let week = try await client.call(Care.UpcomingTasks.self, .init(days: 7), principal: "five-hundred")
        progress("\(backend): tasks.upcoming 7 days answers \(week.overdue.count) overdue and \(week.upcoming.count) upcoming tasks\n")
        figures.rows.append(
            (
                "tasks.upcoming 7 days", "500",
                try await timed {
                    _ = try await client.call(Care.UpcomingTasks.self, .init(days: 7), principal: "five-hundred")
                }, "10,000"
            ))
        figures.requests = 1_500 + 6 * (repeats + 20)
        if callers > 0 {
            progress("\(backend): the same requests from \(callers) callers at once…\n")
            var added = 0
            let (perCaller, callers) = (max(10, repeats / callers), callers)
            let together: [(String, @Sendable (Int) async throws -> Void)] = [
                (
                    "plants.add",
                    { caller in
                        _ = try await client.call(Care.AddPlant.self, plant(caller), principal: "caller-\(caller)")
                    }
                ),
                ("plants.list first page of 50", { _ in _ = try await client.call(Care.ListPlants.self, .init(limit: 50), principal: "five-hundred") }),
                (
                    "plants.list search",
                    { caller in
                        _ = try await client.call(Care.ListPlants.self, .init(search: words[caller % words.count], limit: 50), principal: "thousand")
                    }
                ),
                ("tasks.upcoming 7 days", { _ in _ = try await client.call(Care.UpcomingTasks.self, .init(days: 7), principal: "five-hundred") }),
            ]
            for (name, call) in together {
                let (latency, perSecond) = try await Self.atOnce(callers: callers, each: perCaller, call)
                figures.together.append((name, latency, perSecond))
                added += callers * perCaller
            }
            figures.requests += added
        }
        figures.processCPU = processCPU() - cpuBefore.process
        figures.databaseCPU = (postgres.map { databaseCPUSeconds($0.pid) } ?? 0) - cpuBefore.database
        await stack.shutdown()
        return figures
    }

    /// `callers` tasks each making `each` calls one after another (the first of each not
    /// timed): every call's latency, and calls a second over the whole.
    private static func atOnce(callers: Int, each: Int, _ call: @escaping @Sendable (Int) async throws -> Void) async throws -> (
        Histogram<UInt64>, Double
    ) {
        let start = ContinuousClock.now
        let latency = try await withThrowingTaskGroup(of: Histogram<UInt64>.self) { group in
            for caller in 0..<callers {
                group.addTask {
                    var histogram = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
                    try await call(caller)
                    for _ in 1..<each {
                        let began = ContinuousClock.now
                        try await call(caller)
                        _ = histogram.record(UInt64((ContinuousClock.now - began).microseconds))
                    }
                    return histogram
                }
            }
            var all = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
            for try await histogram in group { all.add(histogram) }
            return all
        }
        return (latency, Double(callers * each) / (ContinuousClock.now - start).seconds)
    }

    private func timed(_ body: () async throws -> Void) async throws -> Histogram<UInt64> {
        var histogram = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
        for _ in 0..<20 { try await body() } // warm up
        for _ in 0..<repeats {
            let start = ContinuousClock.now
            try await body()
            _ = histogram.record(UInt64((ContinuousClock.now - start).microseconds))
        }
        return histogram
    }
}

/// CPU seconds PostgreSQL's processes have used: the server `pid` and every process it started
/// (one per connection), read from /proc.
func databaseCPUSeconds(_ pid: Int32) -> Double {
    var ticks = 0
    for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
        guard let process = Int32(entry), let stat = ProcStat(path: "/proc/\(entry)/stat"), process == pid || stat.parent == pid else { continue }
        ticks += stat.cpuTicks
    }
    return Double(ticks) / Double(sysconf(Int32(_SC_CLK_TCK)))
}
