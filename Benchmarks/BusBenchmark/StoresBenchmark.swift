import ArgumentParser
import CanopyBus
import CanopyCare
import CanopyIdentify
import CanopyImages
import CanopyMessages
import CanopySamples
import CanopyServiceKit
import CanopyStore
import CanopyTesting
import Foundation
import Histogram
import Logging

/// What canopy-images' and canopy-identify's requests cost on SQLite and on PostgreSQL in the
/// same run: latency and CPU per request (this process: client, broker and services; and
/// PostgreSQL's processes), each against a bus round trip measured the same way.
/// (canopy-care's and canopy-remind's are `canopy-bench care` and `remind --parts replicas`.)
struct StoresBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stores",
        abstract: "canopy-images and canopy-identify on SQLite against PostgreSQL: latency and CPU per request.",
        discussion: "Example: canopy-bench stores --requests 200")

    @Option(help: "Requests timed per operation.") var requests = 200
    @Option(help: "The stores to measure, in turn: sqlite, postgres or both.") var backends = "sqlite,postgres"

    /// One operation's figures on one backend.
    struct Row {
        var operation: String
        var latency: Histogram<UInt64>
        /// CPU seconds per request: this process, and PostgreSQL's processes.
        var processCPU: Double
        var databaseCPU: Double
    }

    func run() async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        // Distinct phone-sized photos (640x480), made before anything is timed.
        progress("making \(requests * 2) photos…\n")
        let photos = try (0..<(requests * 2)).map { try SyntheticPlant.species($0 % 10).photo(seed: 10_000 + $0, width: 640, height: 480) }
        var results: [(backend: String, rows: [Row])] = []
        for backend in backends.split(separator: ",").map(String.init) {
            guard backend == "sqlite" || backend == "postgres" else { throw ValidationError("--backends lists sqlite and postgres; got \(backend)") }
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-stores-\(UUID().uuidString)")
            defer { try? FileManager.default.removeItem(at: directory) }
            var server: PostgresServer?
            defer { server?.stop() }
            var postgres: PostgresSettings?
            if backend == "postgres" {
                progress("starting a throwaway PostgreSQL (Debian's postgresql)…\n")
                let started = try await PostgresServer()
                server = started
                postgres = PostgresSettings(url: try await started.database("canopy_bench"))
            }
            progress("\(backend): canopy-images, canopy-identify and canopy-care behind a broker…\n")
            results.append((backend, try await measure(photos: photos, directory: directory, postgres: postgres, server: server, logger: logger)))
        }
        for (backend, rows) in results {
            var table = [["request", "p50 µs", "p99 µs", "p99 vs round trip", "CPU µs (process)", "CPU µs (PostgreSQL)", "CPU vs round trip"]]
            let baseline = rows[0]
            for row in rows {
                table.append([
                    row.operation, "\(row.latency.valueAtPercentile(50))", "\(row.latency.valueAtPercentile(99))",
                    String(format: "%.1f", Double(row.latency.valueAtPercentile(99)) / Double(max(1, baseline.latency.valueAtPercentile(99)))),
                    String(format: "%.0f", row.processCPU * 1e6), String(format: "%.0f", row.databaseCPU * 1e6),
                    String(format: "%.1f", (row.processCPU + row.databaseCPU) / max(1e-9, baseline.processCPU + baseline.databaseCPU)),
                ])
            }
            print("canopy-bench stores on \(backend): \(requests) requests each, one at a time, over the bus (client to broker to the service and back)")
            printTable(table)
            print("")
        }
        if results.count == 2 {
            var table = [
                [
                    "request", "\(results[0].backend) p99 µs", "\(results[1].backend) p99 µs", "p99 ratio",
                    "\(results[0].backend) CPU µs", "\(results[1].backend) CPU µs (process + PostgreSQL)", "CPU ratio",
                ]
            ]
            for (first, second) in zip(results[0].rows, results[1].rows) {
                let (a, b) = (first.processCPU + first.databaseCPU, second.processCPU + second.databaseCPU)
                table.append([
                    first.operation, "\(first.latency.valueAtPercentile(99))", "\(second.latency.valueAtPercentile(99))",
                    String(format: "%.2f", Double(second.latency.valueAtPercentile(99)) / Double(max(1, first.latency.valueAtPercentile(99)))),
                    String(format: "%.0f", a * 1e6), String(format: "%.0f", b * 1e6), String(format: "%.2f", b / max(1e-9, a)),
                ])
            }
            print("the same requests, \(results[1].backend) against \(results[0].backend) in this run:")
            printTable(table)
        }
    }

    private func measure(photos: [[UInt8]], directory: URL, postgres: PostgresSettings?, server: PostgresServer?, logger: Logger) async throws -> [Row] {
        var identify = IdentificationServiceSettings(directory: directory.appendingPathComponent("identify"), runner: .init(endpoint: ""))
        identify.postgres = postgres
        let tools = try await IdentificationTools(databasePath: identify.databasePath, postgres: postgres, logger: logger)
        for species in 0..<10 {
            try tools.addReferences(
                .init(scientificName: "Benchus species\(species)"), photos: try (1...3).map { try SyntheticPlant.species(species).photo(seed: $0) })
        }
        // The client stands in for canopy-care too (images.purge is its call to canopy-images).
        let stack = try await BenchStack(logger: logger, asService: true) { endpoint, context in
            var runner = ServiceRunner.Configuration(endpoint: endpoint)
            runner.credit = 16
            var images = ImageServiceSettings(directory: directory.appendingPathComponent("images"), runner: runner)
            images.postgres = postgres
            var care = CareServiceSettings(directory: directory.appendingPathComponent("care"), runner: runner)
            care.postgres = postgres
            var identification = identify
            identification.runner = runner
            return try await buildImageService(settings: images, context: context, logger: logger)
                + buildCareService(settings: care, context: context, logger: logger)
                + buildIdentificationService(settings: identification, context: context, logger: logger)
        }
        do {
            let rows = try await measure(stack.client, photos: photos, server: server)
            await stack.shutdown()
            return rows
        } catch {
            await stack.shutdown()
            throw error
        }
    }

    private func measure(_ client: BusClient, photos: [[UInt8]], server: PostgresServer?) async throws -> [Row] {
        while (try? await client.call(Images.Stats.self, .init(), timeout: .seconds(1))) == nil { try await Task.sleep(for: .milliseconds(50)) }
        for service in [Identification.service, Care.service] {
            while !((try? await client.call(Broker.Services.self, .init(), timeout: .seconds(1)))?.contains { $0.name == service && $0.workers > 0 } ?? false) {
                try await Task.sleep(for: .milliseconds(50))
            }
        }

        /// Times `requests` calls of `body` (given the call's index), with the CPU they cost.
        func timed(_ operation: String, _ body: (Int) async throws -> Void) async throws -> Row {
            try await body(-1) // once untimed: connections open, caches warm
            var latency = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
            let (process, database) = (processCPU(), server.map { databaseCPUSeconds($0.pid) } ?? 0)
            for index in 0..<requests {
                let start = ContinuousClock.now
                try await body(index)
                _ = latency.record(UInt64((ContinuousClock.now - start).microseconds))
            }
            let count = Double(requests)
            return Row(
                operation: operation, latency: latency, processCPU: (processCPU() - process) / count,
                databaseCPU: ((server.map { databaseCPUSeconds($0.pid) } ?? 0) - database) / count)
        }
        func photo(_ index: Int, _ half: Int) -> Data {
            index < 0 ? Data(photos[photos.count - 1 - half]) : Data(photos[half * requests + index])
        }
        var stored: [String] = []
        var rows: [Row] = []
        // The baseline: a request that reads no store (canopy-care's catalog is in memory).
        rows.append(
            try await timed("care.catalog.search one result (bus round trip, baseline)") { _ in
                _ = try await client.call(Care.CatalogSearch.self, .init(text: "zz", limit: 1))
            })
        rows.append(
            try await timed("images.put, a new 640x480 photo") { index in
                let put = try await client.call(Images.Put.self, .init(plantID: "plant-\(index % 20)", data: photo(index, 0)), principal: "bench")
                if index >= 0 { stored.append(put.sha256) }
            })
        rows.append(
            try await timed("images.variant thumbnail, made") { index in
                _ = try await client.call(Images.GetVariant.self, .init(sha256: stored[max(0, index)], variant: .thumbnail), principal: "bench")
            })
        rows.append(
            try await timed("images.variant thumbnail, memory hit") { index in
                _ = try await client.call(Images.GetVariant.self, .init(sha256: stored[max(0, index)], variant: .thumbnail), principal: "bench")
            })
        rows.append(
            try await timed("images.list, a plant's 10 photos") { index in
                _ = try await client.call(Images.List.self, .init(plantID: "plant-\(max(0, index) % 20)"), principal: "bench")
            })
        rows.append(
            try await timed("identifications.submit, a new photo") { index in
                _ = try await client.call(Identification.Submit.self, .init(photos: [.init(organ: .leaf)], data: [photo(index, 1)]), principal: "bench")
            })
        rows.append(
            try await timed("images.purge, one photo") { index in
                guard index >= 0 else { return }
                _ = try await client.call(Images.Purge.self, .init(plantID: "plant-\(index % 20)", sha256: stored[index]), principal: "bench")
            })
        return rows
    }
}
