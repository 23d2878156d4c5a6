import ArgumentParser
import CanopyBroker
import CanopyBus
import CanopyImages
import CanopyMessages
import CanopyServiceKit
import Foundation
import Histogram
import Logging

/// What it costs to move a 12-megapixel photo over the bus: `images.put` (the photo is
/// stored the first time; again, the same bytes are only carried, hashed and found) and
/// `images.variant` full from the memory tier, against a bus round trip with no payload
/// (`images.stats`) in the same run. Run it before and after a change to the bus's framing.
struct TransferBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "transfer",
        abstract: "images.put of a 12 MP photo and images.variant full over the bus, against a bus round trip.",
        discussion: "Example: canopy-bench transfer --calls 30")

    @Option(help: "Calls timed per operation.") var calls = 30

    func run() async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-transfer-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let photo = try makeTwelveMegapixelJPEGs(.photo, count: 1)[0]
        var configuration = BrokerConfiguration()
        configuration.maximumFrameBytes = 64 * 1024 * 1024 // a 12 MP original fits whole, in either framing
        let stack = try await BenchStack(configuration: configuration, logger: logger) { endpoint, context in
            var settings = ImageServiceSettings(directory: directory, runner: .init(endpoint: endpoint))
            settings.maximumInputBytes = 64 * 1024 * 1024
            return try await buildImageService(settings: settings, context: context, logger: logger)
        }
        let client = stack.client

        let stored = try await client.call(Images.Put.self, .init(plantID: "bench", data: Data(photo)), principal: "bench")
        let full = try await client.wholeVariant(.init(sha256: stored.sha256, variant: .full), principal: "bench")
        print("canopy-bench transfer: a \(photo.count)-byte 12 MP JPEG (stored as \(full.data.count) bytes), \(calls) calls each, one at a time")
        let roundTrip = try await measure { _ = try await client.call(Images.Stats.self, .init()) }
        let puts = try await measure {
            _ = try await client.call(Images.Put.self, .init(plantID: "bench", data: Data(photo)), principal: "bench")
        }
        let variants = try await measure {
            let reply = try await client.wholeVariant(.init(sha256: stored.sha256, variant: .full), principal: "bench")
            precondition(reply.data.count == full.data.count)
        }
        printTable([
            ["call", "p50 µs", "p99 µs", "p50 against the round trip"],
            ["images.stats (round trip, baseline)", "\(roundTrip.valueAtPercentile(50))", "\(roundTrip.valueAtPercentile(99))", "1.0"],
            [
                "images.put, 12 MP, known photo", "\(puts.valueAtPercentile(50))", "\(puts.valueAtPercentile(99))",
                String(format: "%.1f", Double(puts.valueAtPercentile(50)) / Double(roundTrip.valueAtPercentile(50))),
            ],
            [
                "images.variant full, memory tier", "\(variants.valueAtPercentile(50))", "\(variants.valueAtPercentile(99))",
                String(format: "%.1f", Double(variants.valueAtPercentile(50)) / Double(roundTrip.valueAtPercentile(50))),
            ],
        ])
        await stack.shutdown()
    }

    private func measure(_ body: () async throws -> Void) async throws -> Histogram<UInt64> {
        var histogram = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
        for _ in 0..<3 { try await body() } // warm
        for _ in 0..<calls {
            let start = ContinuousClock.now
            try await body()
            _ = histogram.record(UInt64((ContinuousClock.now - start).microseconds))
        }
        return histogram
    }
}
