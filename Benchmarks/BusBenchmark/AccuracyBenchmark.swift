import ArgumentParser
import CanopySamples
import CanopyServiceKit
import Foundation
import Identification

/// How often the offline matcher names the right species on photos that vary as phone photos
/// do (``PlantScene``: background, light temperature and level, leaf count, scale, rotation,
/// noise, occlusion), reference and query photos drawn separately: top-1 and top-3 accuracy
/// for each species count, through canopy-identify's own matching (`reference add`, then
/// `match` as the CLI does).
struct AccuracyBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "accuracy",
        abstract: "The offline matcher's top-1 and top-3 accuracy on made-up species photographed with varying background, light, leaves, scale, angle, noise and occlusion.",
        discussion: "Example: canopy-bench accuracy --species 10,50,200 --references 3 --queries 3")

    @Option(help: "Species counts, comma-separated.") var species = "10,50,200"
    @Option(help: "Reference photos per species.") var references = 3
    @Option(help: "Query photos per species (drawn apart from the references).") var queries = 3
    @Option(help: "Also write the first species' shots here as JPEGs, to look at.") var samples: String?

    func run() async throws {
        let counts = species.split(separator: ",").compactMap { Int($0) }
        guard !counts.isEmpty, counts.allSatisfy({ $0 > 0 }), references > 0, queries > 0 else {
            throw ValidationError("--species, --references and --queries must be positive")
        }
        if let samples {
            try FileManager.default.createDirectory(atPath: samples, withIntermediateDirectories: true)
            for index in 0..<3 {
                for seed in [0, 1, 10_000] {
                    try Data(try PlantScene.species(index).photo(seed: seed)).write(to: URL(fileURLWithPath: samples).appendingPathComponent("species\(index)-shot\(seed).jpg"))
                }
            }
        }
        var rows = [["species", "reference photos", "queries", "top-1", "top-3", "no answer", "match p50 ms"]]
        for count in counts {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-accuracy-\(UUID().uuidString)")
            defer { try? FileManager.default.removeItem(at: directory) }
            let tools = try IdentificationTools(databasePath: directory.appendingPathComponent("identify.sqlite").path)
            progress("  \(count) species: adding \(count * references) reference photos…\n")
            for index in 0..<count {
                let scene = PlantScene.species(index)
                let photos = try (0..<references).map { try scene.photo(seed: $0) }
                try tools.addReferences(.init(scientificName: Self.name(index), family: "Inventaceae"), photos: photos)
            }
            var (top1, top3, none) = (0, 0, 0)
            var timings: [Double] = []
            for index in 0..<count {
                let scene = PlantScene.species(index)
                for query in 0..<queries {
                    let photo = try scene.photo(seed: 10_000 + query)
                    let started = ContinuousClock.now
                    let candidates = try tools.match(photos: [photo])
                    timings.append((ContinuousClock.now - started).seconds * 1_000)
                    let names = candidates.map(\.scientificName)
                    if names.isEmpty { none += 1 }
                    if names.first == Self.name(index) { top1 += 1 }
                    if names.prefix(3).contains(Self.name(index)) { top3 += 1 }
                }
            }
            let total = count * queries
            timings.sort()
            rows.append(["\(count)", "\(count * references)", "\(total)", String(format: "%.1f%%", 100 * Double(top1) / Double(total)),
                         String(format: "%.1f%%", 100 * Double(top3) / Double(total)), "\(none)", String(format: "%.1f", timings[timings.count / 2])])
        }
        print("the offline matcher on PlantScene photos (backgrounds, light, leaves, scale, angle, noise, occlusion vary)")
        printTable(rows)
    }

    /// A made-up species' name: a genus and an epithet of its own.
    static func name(_ index: Int) -> String { "Inventa species\(index)" }
}
