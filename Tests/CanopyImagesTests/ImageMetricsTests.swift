import CanopyMessages
import CanopyServiceKit
import CanopyTesting
import Foundation
import Testing

@testable import CanopyImages

/// canopy-images' series reach Prometheus: refusals by reason, work times, cache tiers.
struct ImageMetricsTests {
    /// The value of one series in the process's registry (labels as written), or 0.
    func value(_ series: String) -> Double {
        let text = Observability.registry.emitToString()
        for line in text.split(separator: "\n") where line.hasPrefix(series + " ") {
            return Double(line.dropFirst(series.count + 1)) ?? 0
        }
        return 0
    }

    @Test func refusalsWorkAndTiersAreCounted() async throws {
        _ = Observability.registry // bound to Prometheus before the library makes its metrics
        let directory = Fixture.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let images = InProcessBus(serving: ImageService(library: try ImageLibrary(directory: directory)))
        let library = try ImageLibrary(directory: directory.appendingPathComponent("second"))
        let refusedBefore = value(#"canopy_images_refused_inputs_total{reason="unknown_format"}"#)
        let normalizedBefore = value(#"canopy_images_work_duration_seconds_count{work="normalize"}"#)
        let smallBefore = value(#"canopy_images_work_duration_seconds_count{work="small_variants"}"#)
        await #expect(throws: CanopyError.self) {
            try await images.call(Images.Put.self, .init(plantID: "p", data: Data("not an image".utf8)), principal: "alice")
        }
        let photo = try await library.put(Fixture.jpeg, owner: "alice", plantID: "p")
        _ = try await library.variant(.init(sha256: photo.sha256, variant: .thumbnail), owner: "alice")
        _ = try await library.variant(.init(sha256: photo.sha256, variant: .thumbnail), owner: "alice")
        _ = await library.checkPressure(budget: 1 << 40) // brings the counters and gauges up to date

        #expect(value(#"canopy_images_refused_inputs_total{reason="unknown_format"}"#) >= refusedBefore + 1)
        #expect(value(#"canopy_images_work_duration_seconds_count{work="normalize"}"#) >= normalizedBefore + 1)
        #expect(value(#"canopy_images_work_duration_seconds_count{work="small_variants"}"#) >= smallBefore + 1)
        #expect(value(#"canopy_images_cache_hits_total{tier="memory"}"#) >= 1)
        // The entries gauge is one series for the whole process, and other suites' libraries
        // (with empty memory tiers) record it too: this library's own figure decides, and the
        // gauge shows it after one of a few of this library's records.
        #expect(try await library.statistics().memory.entries >= 1)
        var recorded = 0.0
        for _ in 0..<20 where recorded < 1 {
            _ = await library.checkPressure(budget: 1 << 40)
            recorded = value(#"canopy_images_cache_entries{tier="memory"}"#)
        }
        #expect(recorded >= 1)
    }
}
