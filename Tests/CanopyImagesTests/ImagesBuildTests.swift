import CanopyBus
import CanopyMessages
import CanopyServiceKit
import CanopyTesting
import Foundation
import Testing

@testable import CanopyImages

/// What `canopy-images serve` runs, built by the same function: its listener says whether it
/// is registered, and its `/metrics` count the work it did.
@Suite(.serialized)
struct ImagesBuildTests {
    @Test func whatServeBuildsIsHealthyOnlyWhileRegisteredAndCountsItsWork() async throws {
        let directory = Fixture.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        try await withLiveBus { bus in
            bus.stopBroker() // registered only once a broker answers
            let settings = ImageServiceSettings(directory: directory, runner: bus.runnerConfiguration(credit: 4), metrics: .anyLoopbackPort)
            let services = try await buildImageService(settings: settings, context: bus.context, logger: bus.logger)
            let listener = try #require(services.first(OperatingEndpoint.self))
            bus.run(services)
            let port = try await listener.boundPort(within: .seconds(60))
            let alone = try await OperatingProbe.get(port, "/health")
            #expect(alone.status == 503 && alone.body.contains("not registered"), "\(alone.body)")

            try await bus.restartBroker()
            #expect(try await OperatingProbe.waitForHealth(port, status: 200))
            #expect(try await OperatingProbe.get(port, "/health").body.contains("store"))

            let before = try await OperatingProbe.metrics(port)
            let client = try bus.client(timeout: .seconds(30))
            let photo = try await client.call(Images.Put.self, .init(plantID: "p", data: Data(Fixture.jpeg)), principal: "alice")
            for _ in 0..<3 { _ = try await client.call(Images.GetVariant.self, .init(sha256: photo.sha256, variant: .thumbnail), principal: "alice") }
            await #expect(throws: CanopyError.self) {
                try await client.call(Images.Put.self, .init(plantID: "p", data: Data("not a photo".utf8)), principal: "alice")
            }
            // Other suites of this process use the same registry at the same time: they can only add.
            // Hits in either tier: under the memory pressure of a whole test run the memory
            // tier may shed the thumbnail between two reads, and the disk tier answers.
            func hits(_ metrics: PrometheusText) -> Double {
                metrics.growth(since: before, "canopy_images_cache_hits_total", ["tier": "memory"])
                    + metrics.growth(since: before, "canopy_images_cache_hits_total", ["tier": "disk"])
            }
            let metrics = try await OperatingProbe.metrics(port) { hits($0) >= 2 } // the cache series are refreshed each second
            let handled = "canopy_service_handler_duration_seconds_count"
            #expect(metrics.growth(since: before, handled, ["service": "images", "operation": "images.put", "outcome": "ok"]) >= 1)
            #expect(metrics.growth(since: before, handled, ["service": "images", "operation": "images.put", "outcome": "badRequest"]) >= 1)
            #expect(metrics.growth(since: before, handled, ["service": "images", "operation": "images.variant", "outcome": "ok"]) >= 3)
            #expect(hits(metrics) >= 2)
            #expect(metrics.growth(since: before, "canopy_images_work_duration_seconds_count", ["work": "small_variants"]) >= 1)
            #expect(metrics.growth(since: before, "canopy_images_refused_inputs_total", ["reason": "unknown_format"]) >= 1)
            #expect(metrics.has("canopy_service_credit") && metrics.has("canopy_images_cache_bytes"))

            bus.stopBroker()
            #expect(try await OperatingProbe.waitForHealth(port, status: 503, within: .seconds(10)))
        }
    }

    /// A photo store that cannot take a new original is unhealthy, named with what to do (a
    /// compose volume the image never created was root-owned: every upload failed while
    /// `/health` said healthy). Here the directory is replaced by a file, which stops root too.
    @Test func healthIsBadWhenNoOriginalCanBeWritten() async throws {
        let directory = Fixture.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        try await withLiveBus { bus in
            let settings = ImageServiceSettings(directory: directory, runner: bus.runnerConfiguration(credit: 4), metrics: .anyLoopbackPort)
            let services = try await buildImageService(settings: settings, context: bus.context, logger: bus.logger)
            let listener = try #require(services.first(OperatingEndpoint.self))
            bus.run(services)
            let port = try await listener.boundPort(within: .seconds(60))
            #expect(try await OperatingProbe.waitForHealth(port, status: 200))
            #expect(try await OperatingProbe.get(port, "/health").body.contains("writable"))

            let originals = directory.appendingPathComponent("originals")
            try FileManager.default.removeItem(at: originals)
            try Data().write(to: originals)
            let broken = try await OperatingProbe.get(port, "/health")
            let report = try JSONDecoder().decode(HealthReport.self, from: Data(broken.body.utf8))
            #expect(broken.status == 503 && !report.healthy, "\(broken.body)")
            #expect(report.checks["originals"]?.hasPrefix("cannot create files in \(originals.path) (Not a directory)") == true, "\(broken.body)")
        }
    }
}
