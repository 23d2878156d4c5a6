import CanopyImaging
import CanopySamples
import CanopyServiceKit
import Foundation

/// `canopy-bench accuracy --fit`: chooses ``FeatureModel``'s numbers on validation species
/// (1000–1199 loaded, 1200–1299 not), never on those the benchmark reports, and prints them
/// as the file's Swift.
struct FeatureFit {
    let loaded = 1_000..<1_200
    let unloaded = 1_200..<1_300
    let references = 3
    let queries = 3

    func run() throws {
        progress("  describing \(loaded.count * (references + queries) + unloaded.count) validation photos…\n")
        var referenceSpecies: [Int] = [], referenceFeatures: [PhotoFeatures] = []
        var querySpecies: [Int] = [], queryFeatures: [PhotoFeatures] = []
        for index in loaded {
            let scene = PlantScene.species(index)
            for seed in 0..<references {
                referenceSpecies.append(index - loaded.lowerBound)
                referenceFeatures.append(try PhotoFeatures.compute(from: scene.photo(seed: seed)))
            }
            for seed in 10_000..<(10_000 + queries) {
                querySpecies.append(index - loaded.lowerBound)
                queryFeatures.append(try PhotoFeatures.compute(from: scene.photo(seed: seed)))
            }
        }
        for index in unloaded {
            querySpecies.append(-1)
            queryFeatures.append(try PhotoFeatures.compute(from: PlantScene.species(index).photo(seed: 10_000)))
        }
        // Each block's L1 distance for every query and reference photo.
        let blocks = PhotoFeatures.Block.allCases
        let (q, r) = (queryFeatures.count, referenceFeatures.count)
        var blockDistances = [[Float]](repeating: [Float](repeating: 0, count: q * r), count: blocks.count)
        for (b, range) in PhotoFeatures.Block.layout.enumerated() {
            for i in 0..<q {
                for j in 0..<r {
                    var sum: Float = 0
                    for k in range { sum += abs(queryFeatures[i].values[k] - referenceFeatures[j].values[k]) }
                    blockDistances[b][i * r + j] = sum
                }
            }
        }
        let scales = blockDistances.map { max(1e-6, Self.median($0)) }
        let speciesCount = loaded.count
        /// Per query, each species' nearest reference photo's distance under `weights`.
        func speciesDistances(_ weights: [Float]) -> [[Float]] {
            var combined = [Float](repeating: 0, count: q * r)
            for b in blocks.indices where weights[b] > 0 {
                let factor = weights[b] / scales[b]
                for index in combined.indices { combined[index] += factor * blockDistances[b][index] }
            }
            return (0..<q).map { i in
                var nearest = [Float](repeating: .infinity, count: speciesCount)
                for j in 0..<r { nearest[referenceSpecies[j]] = min(nearest[referenceSpecies[j]], combined[i * r + j]) }
                return nearest
            }
        }
        /// Top-1 and top-3 among the first `species` loaded species.
        func accuracy(_ distances: [[Float]], species: Int) -> (top1: Double, top3: Double) {
            var (top1, top3, total) = (0, 0, 0)
            for (i, nearest) in distances.enumerated() where querySpecies[i] >= 0 && querySpecies[i] < species {
                let own = nearest[querySpecies[i]]
                let closer = nearest.prefix(species).filter { $0 < own }.count
                total += 1
                if closer == 0 { top1 += 1 }
                if closer < 3 { top3 += 1 }
            }
            return (Double(top1) / Double(total), Double(top3) / Double(total))
        }
        func objective(_ weights: [Float]) -> Double {
            let distances = speciesDistances(weights)
            let all = accuracy(distances, species: speciesCount), some = accuracy(distances, species: 50)
            return all.top1 + 0.5 * all.top3 + some.top1
        }
        var weights = [Float](repeating: 1, count: blocks.count)
        var best = objective(weights)
        for round in 1...4 {
            for b in blocks.indices {
                for factor: Float in [0, 0.25, 0.5, 2, 4] {
                    var trial = weights
                    trial[b] = weights[b] == 0 ? (factor > 1 ? 0.5 : 0) : weights[b] * factor
                    let score = objective(trial)
                    if score > best + 1e-9 { (best, weights) = (score, trial) }
                }
            }
            progress("  round \(round): objective \(String(format: "%.4f", best))\n")
        }
        // Scaled so that the median distance between photos of two different species is 1.
        var final = zip(weights, scales).map { $0 / $1 }
        let distances = speciesDistances(weights)
        var apart: [Float] = []
        for (i, nearest) in distances.enumerated() {
            for (s, distance) in nearest.enumerated() where s != querySpecies[i] { apart.append(distance) }
        }
        let unit = Self.median(apart)
        final = final.map { $0 / unit }
        let scaled = distances.map { $0.map { $0 / unit } }
        // Catalogues of 10, 50 and 200 species (every disjoint set), each with a third as many
        // photos of unloaded species as of loaded ones.
        var cases: [(distances: [Float], truth: Int)] = []
        let unloadedRows = querySpecies.indices.filter { querySpecies[$0] < 0 }
        var nextUnloaded = 0
        for size in [10, 50, speciesCount] {
            for first in stride(from: 0, to: speciesCount - size + 1, by: size) {
                let set = first..<(first + size)
                let known = querySpecies.indices.filter { set.contains(querySpecies[$0]) }
                for row in known { cases.append((Array(scaled[row][set]), querySpecies[row] - first)) }
                for _ in 0..<min(unloadedRows.count, known.count / 3) {
                    cases.append((Array(scaled[unloadedRows[nextUnloaded % unloadedRows.count]][set]), -1))
                    nextUnloaded += 1
                }
            }
        }
        let (temperature, noMatch) = Self.calibrate(cases)
        let beyond = Self.noMatchBeyond(cases)
        let result = accuracy(distances, species: speciesCount), result50 = accuracy(distances, species: 50)
        print(
            String(
                format: "validation: top-1 %.1f%%, top-3 %.1f%% at %d species; top-1 %.1f%% at 50", 100 * result.top1, 100 * result.top3, speciesCount,
                100 * result50.top1))
        print("// FeatureModel (Shared/CanopyImaging/FeatureModel.swift), blocks in order \(blocks.map { "\($0)" }.joined(separator: ", "))")
        print("public static let blockWeights: [Float] = [\n    " + final.map { String(format: "%.5g", $0) }.joined(separator: ", ") + ",\n]")
        print(
            String(
                format:
                    "public static let temperature: Float = %.4g\npublic static let noMatchDistance: Float = %.4g\npublic static let noMatchBeyond: Float = %.4g",
                temperature, noMatch, beyond))
    }

    /// T and d₀ of the greatest likelihood: the right species for loaded ones, "none" for others.
    static func calibrate(_ cases: [(distances: [Float], truth: Int)]) -> (temperature: Float, noMatch: Float) {
        // Only the 32 nearest candidates matter (the rest weigh next to nothing), as in service.
        let nearest = cases.map { Array($0.distances.enumerated().sorted { $0.element < $1.element }.prefix(32)) }
        var best = (likelihood: -Double.infinity, temperature: Float(0.1), noMatch: Float(1))
        for t in 0..<48 {
            let temperature = Float(0.005 * pow(1.12, Double(t)))
            for n in 0..<60 {
                let noMatch = Float(n) * 0.025
                var likelihood = 0.0
                for (i, candidates) in nearest.enumerated() {
                    let confidences = FeatureModel.confidences(candidates.map(\.element), temperature: temperature, noMatch: noMatch)
                    let truth = cases[i].truth
                    let p = truth < 0 ? 1 - confidences.reduce(0, +) : candidates.firstIndex { $0.offset == truth }.map { confidences[$0] } ?? 1e-9
                    likelihood += log(max(1e-9, p))
                }
                if likelihood > best.likelihood { best = (likelihood, temperature, noMatch) }
            }
        }
        return (best.temperature, best.noMatch)
    }

    /// The distance within which 90% of the loaded species' photos have a photo of their own
    /// species, whatever the catalogue's size.
    static func noMatchBeyond(_ cases: [(distances: [Float], truth: Int)]) -> Float {
        let own = cases.filter { $0.truth >= 0 }.map { $0.distances[$0.truth] }.sorted()
        return own[min(own.count - 1, Int(Double(own.count - 1) * 0.9))]
    }

    static func median(_ values: [Float]) -> Float {
        let sorted = values.sorted()
        return sorted.isEmpty ? 0 : sorted[sorted.count / 2]
    }
}
