import ArgumentParser
import CanopyBroker
import CanopyBus
import CanopyCare
import CanopyIdentify
import CanopyImages
import CanopyImaging
import CanopyMessages
import CanopySamples
import CanopyServiceKit
import Foundation
import Histogram
import Logging
import Synchronization

/// canopy-identify with the reference provider over the bus, with canopy-images and
/// canopy-care beside it, each figure against a baseline measured in the same run:
/// - submit to result, 1 and 5 new photos, against `images.put` of as many new photos of
///   the same size (the storing a submission does first);
/// - identifications per second with 16 submitters at once, against `images.put`s per second
///   with 16 putters;
/// - a repeated submission against a new one;
/// - finding the nearest reference photos as the set grows from 100 to 10,000, the index
///   against comparing with every photo.
struct IdentifyBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "identify",
        abstract: "canopy-identify's submit latency, throughput with 16 submitters, repeats and reference matching as the set grows.",
        discussion: "Example: canopy-bench identify --calls 30 --seconds 5")

    @Option(help: "Calls timed per latency figure.") var calls = 30
    @Option(help: "Seconds of each throughput measurement.") var seconds = 5.0
    @Option(help: "Concurrent submitters (and putters) for throughput.") var concurrency = 16
    @Option(help: "Photo width in pixels (height is three quarters).") var width = 1600
    @Option(help: "Reference set sizes for the matching figure, comma-separated.") var sizes = "100,1000,10000"
    @Option(help: "Figures to measure, comma-separated: latency, repeat, throughput, matching.") var figures = "latency,repeat,throughput,matching"

    private func wants(_ figure: String) -> Bool { figures.split(separator: ",").contains { $0 == figure } }

    func run() async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-identify-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let height = width * 3 / 4
        let settings = IdentificationServiceSettings(directory: directory.appendingPathComponent("identify"), runner: .init(endpoint: ""))
        let tools = try IdentificationTools(databasePath: settings.databasePath)
        for species in 0..<20 {
            try tools.addReferences(
                .init(scientificName: "Benchus species\(species)"), photos: try (1...3).map { try SyntheticPlant.species(species).photo(seed: $0) })
        }
        let stack = try await BenchStack(logger: logger) { endpoint, context in
            var runner = ServiceRunner.Configuration(endpoint: endpoint)
            runner.credit = 16
            var identify = settings
            identify.runner = runner
            let care = try await buildCareService(
                settings: CareServiceSettings(directory: directory.appendingPathComponent("care"), runner: runner),
                context: context, logger: logger)
            let identification = try await buildIdentificationService(settings: identify, context: context, logger: logger)
            return try await buildImageService(
                settings: ImageServiceSettings(directory: directory.appendingPathComponent("images"), runner: runner), context: context, logger: logger)
                + care + identification
        }
        let client = stack.client
        // Fresh photos for every call: a photo seen before is answered from the store.
        var nextSeed = 1_000
        func photos(_ count: Int) throws -> [Data] {
            defer { nextSeed += count }
            return try (0..<count).map { Data(try SyntheticPlant.species((nextSeed + $0) % 20).photo(seed: nextSeed + $0, width: width, height: height)) }
        }
        @Sendable func submit(_ data: [Data], as owner: String = "bench") async throws -> Identification.Record {
            try await client.call(Identification.Submit.self, .init(photos: data.map { _ in .init(organ: .leaf) }, data: data), principal: owner)
        }
        @Sendable func put(_ data: [Data]) async throws {
            let plant = UUID().uuidString.lowercased()
            for photo in data { _ = try await client.call(Images.Put.self, .init(plantID: plant, data: photo), principal: "bench") }
        }
        _ = try await submit(try photos(1)) // warm
        print(
            "canopy-bench identify: reference provider, 20 species x 3 reference photos, \(width)x\(height) JPEG photos (\(try photos(1)[0].count) bytes each), \(calls) calls per figure"
        )

        var rows = [["figure", "p50 µs", "p99 µs", "baseline", "p50 µs", "p99 µs", "ratio (p50)"]]
        for count in [1, 5] where wants("latency") {
            var submits = histogram(), puts = histogram()
            for _ in 0..<calls {
                let (forPut, forSubmit) = (try photos(count), try photos(count))
                try await time(&puts) { try await put(forPut) }
                try await time(&submits) { _ = try await submit(forSubmit) }
            }
            rows.append(row("submit, \(count) new photo(s)", submits, "images.put x\(count)", puts))
        }
        if wants("repeat") {
            var repeats = histogram(), news = histogram(), known = histogram()
            for _ in 0..<calls {
                let data = try photos(1)
                try await time(&news) { _ = try await submit(data) }
                try await time(&repeats) { _ = try await submit(data) }
                // What carrying and hashing the photo costs: canopy-images finding a photo it has.
                try await time(&known) { _ = try await client.call(Images.Put.self, .init(plantID: "known", data: data[0]), principal: "bench") }
            }
            rows.append(row("submit, the same photo again", repeats, "submit, a new photo", news))
            rows.append(row("submit, the same photo again", repeats, "images.put, a stored photo", known))
        }
        printTable(rows)

        if wants("throughput") {
            // Fresh photos made beforehand, so the generator only sends.
            let batch = try (0..<(concurrency * 40)).map { _ in try photos(1) }
            let putRate = try await throughput(batch) { try await put($0) }
            let submitRate = try await throughput(batch.map { _ in try photos(1) }) { _ = try await submit($0) }
            print("")
            printTable([
                ["\(concurrency) at once", "per second", "against images.put"],
                ["images.put (baseline)", String(format: "%.1f", putRate), "1.00"],
                ["identifications.submit", String(format: "%.1f", submitRate), String(format: "%.2f", submitRate / putRate)],
            ])
        }
        await stack.shutdown()
        if wants("matching") {
            print("")
            try matching()
        }
    }

    /// Nearest 32 reference photos: the index against a full scan, as the set grows.
    private func matching() throws {
        let counts = sizes.split(separator: ",").compactMap { Int($0) }
        let largest = counts.max() ?? 0
        var all: [PhotoFeatures] = []
        all.reserveCapacity(largest)
        FileHandle.standardError.write(Data("making \(largest) reference features…".utf8))
        for index in 0..<largest {
            // 1,000 species, photos of each a little different.
            let plant = SyntheticPlant.species(index % 1_000)
            all.append(PhotoFeatures.compute(pixels: plant.pixels(seed: index, width: 48, height: 48), width: 48, height: 48))
        }
        FileHandle.standardError.write(Data(" done\n".utf8))
        let queries = (0..<200).map { index in
            PhotoFeatures.compute(pixels: SyntheticPlant.species(index * 7 % 1_000).pixels(seed: 90_000 + index, width: 48, height: 48), width: 48, height: 48)
        }
        var rows = [["reference photos", "index p50 µs", "index p99 µs", "full scan p50 µs", "full scan p99 µs", "scan / index (p50)"]]
        for count in counts {
            let items = Array(all.prefix(count))
            let index = ReferenceIndex(items)
            var indexed = histogram(), scanned = histogram()
            for query in queries {
                var start = ContinuousClock.now
                let found = index.nearest(to: query, count: 32)
                _ = indexed.record(UInt64(max(1, (ContinuousClock.now - start).nanoseconds / 1_000)))
                start = ContinuousClock.now
                let scan = index.scanned(to: query, count: 32)
                _ = scanned.record(UInt64(max(1, (ContinuousClock.now - start).nanoseconds / 1_000)))
                precondition(found.map(\.distance) == scan.map(\.distance), "the index must find what a full scan finds")
            }
            rows.append([
                "\(count)", "\(indexed.valueAtPercentile(50))", "\(indexed.valueAtPercentile(99))",
                "\(scanned.valueAtPercentile(50))", "\(scanned.valueAtPercentile(99))",
                String(format: "%.1f", Double(scanned.valueAtPercentile(50)) / Double(indexed.valueAtPercentile(50))),
            ])
        }
        printTable(rows)
    }

    private func histogram() -> Histogram<UInt64> {
        Histogram<UInt64>(highestTrackableValue: 600_000_000, numberOfSignificantValueDigits: .three)
    }

    private func time(_ histogram: inout Histogram<UInt64>, _ body: () async throws -> Void) async throws {
        let start = ContinuousClock.now
        try await body()
        _ = histogram.record(UInt64((ContinuousClock.now - start).microseconds))
    }

    private func row(_ name: String, _ measured: Histogram<UInt64>, _ baselineName: String, _ baseline: Histogram<UInt64>) -> [String] {
        [
            name, "\(measured.valueAtPercentile(50))", "\(measured.valueAtPercentile(99))", baselineName,
            "\(baseline.valueAtPercentile(50))", "\(baseline.valueAtPercentile(99))",
            String(format: "%.2f", Double(measured.valueAtPercentile(50)) / Double(baseline.valueAtPercentile(50))),
        ]
    }

    /// Calls per second with ``concurrency`` callers taking work from `items` until the time is up.
    private func throughput(_ items: [[Data]], _ call: @escaping @Sendable ([Data]) async throws -> Void) async throws -> Double {
        let queue = WorkQueue(items)
        let start = ContinuousClock.now
        let deadline = start + .seconds(seconds)
        let done = try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<concurrency {
                group.addTask {
                    var count = 0
                    while ContinuousClock.now < deadline, let item = queue.next() {
                        try await call(item)
                        count += 1
                    }
                    return count
                }
            }
            return try await group.reduce(0, +)
        }
        let elapsed = ContinuousClock.now - start
        return Double(done) / elapsed.seconds
    }
}

/// Hands out items to concurrent callers, each once.
private final class WorkQueue: Sendable {
    private let state: Mutex<(items: [[Data]], next: Int)>

    init(_ items: [[Data]]) { state = Mutex((items, 0)) }

    func next() -> [Data]? {
        state.withLock { state in
            guard state.next < state.items.count else { return nil }
            defer { state.next += 1 }
            return state.items[state.next]
        }
    }
}
