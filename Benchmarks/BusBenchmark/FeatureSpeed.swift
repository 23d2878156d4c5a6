import CanopyIdentify
import CanopyImaging
import CanopySamples
import CanopyServiceKit
import Foundation

/// `canopy-bench accuracy --speed`: a 12 MP photo's features against the baseline's on the
/// same photo, and the reference index's search at 10,000 photos against scanning them all.
struct FeatureSpeed {
    func run() throws {
        progress("  making a 4000x3000 photo…\n")
        let large = try PlantScene.species(7).photo(seed: 10_000, width: 4_000, height: 3_000, quality: 90)
        var (today, before): ([Double], [Double]) = ([], [])
        for _ in 0..<12 {
            // Alternating, so that the machine's moods fall on both alike.
            today.append(try Self.milliseconds { _ = try PhotoFeatures.compute(from: large) })
            before.append(try Self.milliseconds { _ = try BaselineFeatures.compute(from: large) })
        }
        let (todayP50, beforeP50) = (Self.percentile(today, 0.5), Self.percentile(before, 0.5))
        print(
            String(
                format: "12 MP JPEG (%d KB): features p50 %.1f ms, the baseline's %.1f ms: ratio %.2f", large.count / 1_000, todayP50, beforeP50,
                todayP50 / beforeP50))

        let photos = 10_000, perSpecies = 5
        progress("  describing \(photos) reference photos…\n")
        var items: [PhotoFeatures] = []
        items.reserveCapacity(photos)
        for index in 0..<(photos / perSpecies) {
            for seed in 0..<perSpecies { items.append(try PhotoFeatures.compute(from: PlantScene.species(index).photo(seed: seed, width: 240, height: 180))) }
            if index % 200 == 199 { progress("    \((index + 1) * perSpecies)\n") }
        }
        let built = ContinuousClock.now
        let index = ReferenceIndex(items)
        let buildSeconds = (ContinuousClock.now - built).seconds
        let queries = try (0..<300).map { try PhotoFeatures.compute(from: PlantScene.species($0 * 6).photo(seed: 10_000, width: 240, height: 180)) }
        var (tree, scan): ([Double], [Double]) = ([], [])
        var agree = 0
        for query in queries {
            var found: [ReferenceIndex.Neighbour] = []
            tree.append(Self.milliseconds { found = index.nearest(to: query, count: 32) })
            var scanned: [Float] = []
            var simd: [ReferenceIndex.Neighbour] = []
            scan.append(Self.milliseconds { simd = index.scanned(to: query, count: 32) })
            scanned = simd.map(\.distance)
            if found.map(\.distance) == scanned { agree += 1 }
        }
        print(
            String(
                format:
                    "index of %d photos (built in %.0f ms): 32 nearest p50 %.3f ms, p99 %.3f ms; scanning all p50 %.3f ms, p99 %.3f ms; same answer %d of %d",
                photos, buildSeconds * 1_000, Self.percentile(tree, 0.5), Self.percentile(tree, 0.99), Self.percentile(scan, 0.5), Self.percentile(scan, 0.99),
                agree, queries.count))
    }

    static func milliseconds(_ body: () throws -> Void) rethrows -> Double {
        let started = ContinuousClock.now
        try body()
        return (ContinuousClock.now - started).seconds * 1_000
    }

    static func percentile(_ values: [Double], _ share: Double) -> Double {
        let sorted = values.sorted()
        return sorted[min(sorted.count - 1, Int(Double(sorted.count - 1) * share))]
    }
}
