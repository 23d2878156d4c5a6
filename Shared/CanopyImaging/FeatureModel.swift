import Foundation

/// What turns two photos' features into a distance, and distances into a confidence: numbers
/// chosen on a validation set of made-up species (`canopy-bench accuracy --fit`, species
/// 1000–1199 with 3 reference and 3 query photos each, and species 1200–1299 as ones nobody
/// loaded), never on the species the benchmark reports. Fitting again prints this file's
/// numbers. The confidence's numbers are fitted over catalogues of 10, 50 and 200 species
/// (every disjoint set of the validation species), each with a third as many photos of
/// unloaded species as of loaded ones.
///
/// - ``blockWeights``: each block's weight, over its median distance between two photos, so
///   the weights compare; found by coordinate search for the best top-1 (and top-3) accuracy.
/// - ``temperature`` and ``noMatchDistance``: the confidence of candidate `c` among the
///   candidates `j` is exp(−d_c/T) / (exp(−d₀/T) + Σ exp(−d_j/T)), where d is the candidate's
///   distance (the mean over the query photos of its nearest photo) and d₀ stands for "none of
///   these"; T and d₀ maximise the likelihood of the validation answers, unknown species
///   included (temperature scaling with a class for "none").
/// - ``noMatchBeyond``: when even the nearest candidate is further than this, the matcher
///   answers "no good match" rather than a name: the distance within which 90% of the
///   validation photos of loaded species have a photo of their own species, so it names nine
///   in ten of them however few species are loaded. How many photos of unloaded species it turns away is measured, not chosen:
///   it turns away what looks like nothing loaded, not a look-alike of a loaded species.
public enum FeatureModel {
    public static let blockWeights: [Float] = [
        0.21373, 0.19209, 0.011559, 0.12516, 0.14399, 0.13144, 0, 0.012307, 0.0262, 0.09701, 0.31546,
    ]
    public static let temperature: Float = 0.06776
    public static let noMatchDistance: Float = 0.45
    public static let noMatchBeyond: Float = 0.5798

    /// ``blockWeights`` for each value.
    public static let valueWeights: [Float] = valueWeights(for: blockWeights)

    static func valueWeights(for blocks: [Float]) -> [Float] {
        PhotoFeatures.Block.allCases.flatMap { [Float](repeating: blocks[$0.rawValue], count: $0.count) }
    }

    /// The weighted L1 distance between two feature vectors of ``PhotoFeatures/count`` values.
    @inline(__always)
    static func distance(_ a: UnsafePointer<Float>, _ b: UnsafePointer<Float>) -> Float {
        valueWeights.withUnsafeBufferPointer { weights in
            var sum: Float = 0
            for index in 0..<PhotoFeatures.count { sum += weights[index] * abs(a[index] - b[index]) }
            return sum
        }
    }

    /// The confidences of candidates at these distances (in their order), each 0 to 1, their
    /// sum below 1 by what "none of these" takes. Other numbers than the model's are for
    /// fitting them.
    public static func confidences(_ distances: [Float], temperature: Float = temperature, noMatch: Float = noMatchDistance) -> [Double] {
        guard let nearest = distances.min() else { return [] }
        // Shifted by the nearest, so that nothing underflows.
        let none = exp(Double(nearest - noMatch) / Double(temperature))
        let weights = distances.map { exp(Double(nearest - $0) / Double(temperature)) }
        let total = none + weights.reduce(0, +)
        return weights.map { $0 / total }
    }
}
