import ArgumentParser
import CanopyIdentify
import CanopyImaging
import CanopySamples
import CanopyServiceKit
import Foundation

/// How often the offline matcher names the right species on photos that vary as phone photos
/// do (``PlantScene``: background, light temperature and level, leaf count, scale, rotation,
/// noise, occlusion), reference and query photos drawn separately: top-1 and top-3 accuracy
/// for each species count, through canopy-identify's own matching (`reference add`, then
/// `match` as the CLI does), beside the matcher before issue 30 (``BaselineFeatures``) on the
/// same photos; how sure it says it is against how often it is right; and how often it
/// answers "no good match" for species nobody loaded.
struct AccuracyBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "accuracy",
        abstract:
            "The offline matcher's top-1 and top-3 accuracy on made-up species photographed with varying background, light, leaves, scale, angle, noise and occlusion.",
        discussion: """
            Example: canopy-bench accuracy --species 10,50,200 --references 3 --queries 5
            --fit chooses FeatureModel's numbers on validation species (1000–1299, never the ones measured) and prints them.
            --speed times a 12 MP photo's features and the index at 10,000 reference photos.
            """)

    @Option(help: "Species counts, comma-separated.") var species = "10,50,200"
    @Option(help: "Reference photos per species.") var references = 3
    @Option(help: "Query photos per species (drawn apart from the references).") var queries = 5
    @Option(help: "Species nobody loaded, whose photos should get no good match (per set).") var unknown = 20
    @Option(help: "Each species count is measured on every disjoint set of that many among the first this many species.") var within = 200
    @Option(help: "Also write the first species' shots here as JPEGs, to look at.") var samples: String?
    @Flag(help: "Choose FeatureModel's weights and calibration on the validation species and print them.") var fit = false
    @Flag(help: "Time a 12 MP photo's features (against the baseline's) and the index at 10,000 photos.") var speed = false

    func run() async throws {
        let counts = species.split(separator: ",").compactMap { Int($0) }
        guard !counts.isEmpty, counts.allSatisfy({ $0 > 0 }), references > 0, queries > 0, unknown >= 0, within > 0 else {
            throw ValidationError("--species, --references and --queries must be positive, --unknown not negative")
        }
        if let samples { try writeSamples(to: samples) }
        if fit { return try FeatureFit().run() }
        if speed { return try FeatureSpeed().run() }
        try measure(counts)
    }

    private func measure(_ counts: [Int]) throws {
        var rows = [
            [
                "species", "sets", "queries", "top-1", "top-3", "no good match", "right if named", "unloaded refused", "baseline top-1", "baseline top-3",
                "match p50 ms",
            ]
        ]
        var reliability: [(confidence: Double, right: Bool)] = []
        for count in counts {
            // Every disjoint set of `count` species among the first `--within` (at least one):
            // a figure for 10 species is not the luck of 10 of them.
            let sets = max(1, within / count)
            var (top1, top3, answered, answeredRight, baseline1, baseline3, refused) = (0, 0, 0, 0, 0, 0, 0)
            var timings: [Double] = []
            for set in 0..<sets {
                let first = set * count
                let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-accuracy-\(UUID().uuidString)")
                defer { try? FileManager.default.removeItem(at: directory) }
                let tools = try IdentificationTools(databasePath: directory.appendingPathComponent("identify.sqlite").path)
                progress("  \(count) species (\(first)–\(first + count - 1)): adding \(count * references) reference photos…\n")
                var baseline: [(species: Int, features: BaselineFeatures)] = []
                for index in first..<(first + count) {
                    let photos = try (0..<references).map { try PlantScene.species(index).photo(seed: $0) }
                    try tools.addReferences(.init(scientificName: Self.name(index), family: "Inventaceae"), photos: photos)
                    baseline += try photos.map { (index, try BaselineFeatures.compute(from: $0)) }
                }
                for index in first..<(first + count) {
                    for query in 0..<queries {
                        let photo = try PlantScene.species(index).photo(seed: 10_000 + query)
                        let started = ContinuousClock.now
                        let candidates = try tools.match(photos: [photo], refusingFar: false)
                        timings.append((ContinuousClock.now - started).seconds * 1_000)
                        let names = candidates.map(\.scientificName)
                        if try !tools.match(photos: [photo]).isEmpty, let first = candidates.first {
                            answered += 1
                            if first.scientificName == Self.name(index) { answeredRight += 1 }
                            reliability.append((first.score, first.scientificName == Self.name(index)))
                        }
                        if names.first == Self.name(index) { top1 += 1 }
                        if names.prefix(3).contains(Self.name(index)) { top3 += 1 }
                        let rank = Self.baselineRank(of: index, for: try BaselineFeatures.compute(from: photo), among: baseline)
                        if rank == 0 { baseline1 += 1 }
                        if rank < 3 { baseline3 += 1 }
                    }
                }
                // Species nobody loaded: the matcher should say it has no good match.
                for index in 0..<unknown {
                    let photo = try PlantScene.species(5_000 + index).photo(seed: 10_000 + set)
                    if let first = try tools.match(photos: [photo]).first {
                        reliability.append((first.score, false))
                    } else {
                        refused += 1
                    }
                }
            }
            let total = sets * count * queries
            timings.sort()
            rows.append([
                "\(count)", "\(sets)", "\(total)", Self.percent(top1, total), Self.percent(top3, total), Self.percent(total - answered, total),
                Self.percent(answeredRight, answered), Self.percent(refused, sets * unknown),
                Self.percent(baseline1, total), Self.percent(baseline3, total), String(format: "%.2f", timings[timings.count / 2]),
            ])
        }
        print(
            "the offline matcher on PlantScene photos (backgrounds, light, leaves, scale, angle, noise, occlusion vary), \(references) reference photos a species"
        )
        print(
            "(top-1/top-3: the candidates' order; \"no good match\": the known species' photos it refused to name; the baseline is the matcher before issue 30, on the same photos, always answering)"
        )
        printTable(rows)
        print("\nconfidence of the first candidate against how often it was right (all species counts, unloaded species' photos included):")
        var table = [["confidence", "answers", "right"]]
        var calibrationError = 0.0
        for (low, high) in [(0.0, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 0.9), (0.9, 0.97), (0.97, 1.01)] {
            let bin = reliability.filter { $0.confidence >= low && $0.confidence < high }
            guard !bin.isEmpty else { continue }
            let right = Double(bin.filter(\.right).count) / Double(bin.count)
            let stated = bin.map(\.confidence).reduce(0, +) / Double(bin.count)
            calibrationError += Double(bin.count) / Double(reliability.count) * abs(right - stated)
            table.append([String(format: "%.2f–%.2f (mean %.2f)", low, min(1, high), stated), "\(bin.count)", String(format: "%.1f%%", 100 * right)])
        }
        printTable(table)
        print(String(format: "expected calibration error: %.3f", calibrationError))
    }

    /// The rank of the right species for the baseline: species ordered by their nearest photo.
    static func baselineRank(of species: Int, for query: BaselineFeatures, among references: [(species: Int, features: BaselineFeatures)]) -> Int {
        var nearest: [Int: Float] = [:]
        for reference in references {
            nearest[reference.species] = min(nearest[reference.species] ?? .infinity, query.distance(to: reference.features))
        }
        let own = nearest[species] ?? .infinity
        return nearest.values.filter { $0 < own }.count
    }

    private func writeSamples(to samples: String) throws {
        try FileManager.default.createDirectory(atPath: samples, withIntermediateDirectories: true)
        for index in 0..<3 {
            for seed in [0, 1, 10_000] {
                try Data(try PlantScene.species(index).photo(seed: seed)).write(
                    to: URL(fileURLWithPath: samples).appendingPathComponent("species\(index)-shot\(seed).jpg"))
            }
        }
    }

    static func percent(_ part: Int, _ whole: Int) -> String {
        whole > 0 ? String(format: "%.1f%%", 100 * Double(part) / Double(whole)) : "–"
    }

    /// A made-up species' name: a genus and an epithet of its own.
    static func name(_ index: Int) -> String { "Inventa species\(index)" }
}
