import CanopyBroker
import ArgumentParser
import CanopyBus
import CanopyMessages
import CareScheduling
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

    func run() async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-care-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let stack = try await BenchStack(logger: logger) { endpoint, context in
            try await buildCareService(settings: .init(directory: directory, runner: .init(endpoint: endpoint)), context: context, logger: logger)
        }
        let client = stack.client
        while (try? await client.call(Care.CatalogSearch.self, .init(text: "", limit: 1), timeout: .seconds(1))) == nil {
            try await Task.sleep(for: .milliseconds(50))
        }
        let catalog = CareTools.catalog.species
        func plant(_ index: Int) -> Care.Plant {
            let species = catalog[index % catalog.count]
            return Care.Plant(scientificName: species.scientificName, customName: index % 7 == 0 ? "Plant \(index)" : nil, favourite: index % 5 == 0,
                              identificationSource: index % 2 == 0 ? .plantnet : .manual, identificationConfidence: 0.8)
        }

        progress("seeding 500 plants for one person and 1,000 for another (timing each save)…\n")
        var rows = [["request", "plants", "p50 µs", "p99 µs", "p99 vs round trip", "target p99"]]
        var saves = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
        for index in 0..<500 {
            let start = ContinuousClock.now
            _ = try await client.call(Care.AddPlant.self, plant(index), principal: "five-hundred")
            _ = saves.record(UInt64((ContinuousClock.now - start).microseconds))
        }
        for index in 0..<1_000 { _ = try await client.call(Care.AddPlant.self, plant(index), principal: "thousand") }

        let roundTrip = try await measure { _ = try await client.call(Care.CatalogSearch.self, .init(text: "zz", limit: 1)) }
        let baseline = Double(roundTrip.valueAtPercentile(99))
        func row(_ name: String, _ plants: String, _ histogram: Histogram<UInt64>, _ target: String) {
            rows.append([name, plants, "\(histogram.valueAtPercentile(50))", "\(histogram.valueAtPercentile(99))",
                         String(format: "%.1f", Double(histogram.valueAtPercentile(99)) / baseline), target])
        }
        row("catalog.search one result (baseline round trip)", "-", roundTrip, "-")
        row("plants.add (save, schedule, outbox)", "0-500", saves, "5,000")
        row("plants.list first page of 50", "500", try await measure {
            _ = try await client.call(Care.ListPlants.self, .init(limit: 50), principal: "five-hundred")
        }, "20,000")
        row("plants.list all 500", "500", try await measure {
            _ = try await client.call(Care.ListPlants.self, .init(limit: 500), principal: "five-hundred")
        }, "20,000")
        let words = ["mon", "fern", "araceae", "palm", "swiss", "ficus", "jade", "lily"]
        var word = 0
        row("plants.list search (8 terms in turn)", "1,000", try await measure {
            word += 1
            _ = try await client.call(Care.ListPlants.self, .init(search: words[word % words.count], limit: 50), principal: "thousand")
        }, "10,000")
        row("tasks.upcoming 7 days", "500", try await measure {
            _ = try await client.call(Care.UpcomingTasks.self, .init(days: 7), principal: "five-hundred")
        }, "10,000")
        print("canopy-bench care: over the bus (client to broker to canopy-care and back), \(repeats) requests each, SQLite in a temporary directory")
        printTable(rows)

        // A year of tasks for 10,000 plants, with the scheduler the service uses.
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
        print(String(format: "\na year of tasks for 10,000 plants: %d tasks in %.3f s (best of 3; target under 1 s), %.1f µs per plant", count, seconds, seconds * 1e6 / 10_000))
        await stack.shutdown()
    }

    private func measure(_ body: () async throws -> Void) async throws -> Histogram<UInt64> {
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
