import CanopyImaging
import CanopyMessages
import Foundation

/// Dominant colours of a photo (seed 001's multi-scale ColorCube, merged in OKLab).
///
/// Pure: pixels in, swatches out. The 400 px image is read at three scales (full, half,
/// quarter, weighted 0.5, 0.3, 0.2); at each scale an 8x8x8 colour histogram keeps the
/// buckets holding more than 0.1% of the pixels, with the mean colour of their pixels.
/// Bucket colours are merged when they are closer than ``mergeDistance`` in OKLab, and the
/// clusters are given roles by lightness and chroma, as Android's Palette does.
enum PaletteExtractor {
    /// OKLab distance under which two colours count as one.
    static let mergeDistance = 0.08

    struct Cluster {
        var lab: OKLab
        var weight: Double
    }

    /// The palette of 8-bit sRGB pixels (three bytes each).
    static func swatches(pixels: [UInt8], width: Int, height: Int) -> [Images.Swatch] {
        precondition(pixels.count == width * height * 3, "pixels must be width x height x 3 bytes")
        var clusters: [Cluster] = []
        var image = (pixels: pixels, width: width, height: height)
        for weight in [0.5, 0.3, 0.2] {
            for (lab, share) in histogramPeaks(image.pixels, count: image.width * image.height) {
                merge(Cluster(lab: lab, weight: share * weight), into: &clusters)
            }
            image = halved(image)
            if image.width == 0 || image.height == 0 { break }
        }
        let total = clusters.reduce(0) { $0 + $1.weight }
        guard total > 0 else { return [] }
        clusters.sort { $0.weight > $1.weight }
        return assignRoles(clusters, total: total)
    }

    /// Buckets of the 8x8x8 cube with more than 0.1% of the pixels: mean colour and share.
    static func histogramPeaks(_ pixels: [UInt8], count: Int) -> [(OKLab, Double)] {
        guard count > 0 else { return [] }
        var population = [Int](repeating: 0, count: 512)
        var sums = [Int](repeating: 0, count: 512 * 3)
        pixels.withUnsafeBufferPointer { bytes in
            var offset = 0
            for _ in 0..<count {
                let r = Int(bytes[offset]), g = Int(bytes[offset + 1]), b = Int(bytes[offset + 2])
                let bucket = (r >> 5) << 6 | (g >> 5) << 3 | (b >> 5)
                population[bucket] += 1
                sums[bucket * 3] += r
                sums[bucket * 3 + 1] += g
                sums[bucket * 3 + 2] += b
                offset += 3
            }
        }
        let threshold = count / 1000
        return (0..<512).compactMap { bucket in
            let n = population[bucket]
            guard n > threshold, n > 0 else { return nil }
            let mean = (Double(sums[bucket * 3]) / Double(n), Double(sums[bucket * 3 + 1]) / Double(n), Double(sums[bucket * 3 + 2]) / Double(n))
            return (OKLab(red: mean.0, green: mean.1, blue: mean.2), Double(n) / Double(count))
        }
    }

    /// Merges `cluster` into the nearest existing one within ``mergeDistance``, or adds it.
    static func merge(_ cluster: Cluster, into clusters: inout [Cluster]) {
        var nearest: Int?
        var best = mergeDistance
        for index in clusters.indices {
            let distance = clusters[index].lab.distance(to: cluster.lab)
            if distance < best {
                best = distance
                nearest = index
            }
        }
        guard let index = nearest else { return clusters.append(cluster) }
        let total = clusters[index].weight + cluster.weight
        clusters[index].lab = clusters[index].lab.mixed(with: cluster.lab, weight: cluster.weight / total)
        clusters[index].weight = total
    }

    /// Half the width and height, each new pixel the mean of four.
    static func halved(_ image: (pixels: [UInt8], width: Int, height: Int)) -> (pixels: [UInt8], width: Int, height: Int) {
        let width = image.width / 2, height = image.height / 2
        var out = [UInt8](repeating: 0, count: width * height * 3)
        for y in 0..<height {
            for x in 0..<width {
                for channel in 0..<3 {
                    let top = (2 * y * image.width + 2 * x) * 3 + channel
                    let bottom = ((2 * y + 1) * image.width + 2 * x) * 3 + channel
                    let sum = Int(image.pixels[top]) + Int(image.pixels[top + 3]) + Int(image.pixels[bottom]) + Int(image.pixels[bottom + 3])
                    out[(y * width + x) * 3 + channel] = UInt8(sum / 4)
                }
            }
        }
        return (out, width, height)
    }

    /// Targets for each role: OKLab lightness and chroma.
    static let roles: [(name: String, lightness: ClosedRange<Double>, chroma: ClosedRange<Double>, targetL: Double, targetC: Double)] = [
        ("vibrant", 0.45...0.8, 0.10...1, 0.65, 0.20),
        ("lightVibrant", 0.75...1, 0.08...1, 0.85, 0.16),
        ("darkVibrant", 0...0.5, 0.08...1, 0.35, 0.16),
        ("muted", 0.45...0.8, 0...0.10, 0.65, 0.05),
        ("lightMuted", 0.75...1, 0...0.08, 0.88, 0.03),
        ("darkMuted", 0...0.5, 0...0.08, 0.30, 0.03),
    ]

    /// Every cluster holding at least 1% of the photo (at most 12), most populous first, so
    /// the first is the dominant colour. The best cluster for each role (closeness to the
    /// role's lightness and chroma, and population; each cluster used once) carries that
    /// role's name; the rest are `other`.
    static func assignRoles(_ clusters: [Cluster], total: Double) -> [Images.Swatch] {
        let kept = Array(clusters.filter { $0.weight / total >= 0.01 }.prefix(12))
        guard let largest = kept.first?.weight else { return [] }
        var names = [String](repeating: "other", count: kept.count)
        for role in roles {
            var bestIndex: Int?
            var bestScore = -Double.infinity
            for (index, cluster) in kept.enumerated() where names[index] == "other" {
                let l = cluster.lab.l, c = cluster.lab.chroma
                guard role.lightness.contains(l), role.chroma.contains(c) else { continue }
                let score = 0.52 * (1 - abs(l - role.targetL)) + 0.24 * (1 - min(1, abs(c - role.targetC) * 4)) + 0.24 * (cluster.weight / largest)
                if score > bestScore {
                    bestScore = score
                    bestIndex = index
                }
            }
            if let index = bestIndex { names[index] = role.name }
        }
        return zip(kept, names).map { cluster, role in
            Images.Swatch(
                role: role, hex: cluster.lab.hex, population: (cluster.weight / total * 1000).rounded() / 1000,
                oklab: [cluster.lab.l, cluster.lab.a, cluster.lab.b].map { ($0 * 10_000).rounded() / 10_000 })
        }
    }
}
