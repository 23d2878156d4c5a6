import CanopyImaging
import CanopyMessages
import Foundation

/// The offline matcher's features as they were before issue 30 (a colour histogram of the
/// whole frame, gradient orientations, a difference hash), kept only so that
/// `canopy-bench accuracy` measures the matcher of today against them in the same run.
struct BaselineFeatures: Sendable {
    /// The colour histogram (``colourBins`` values summing to 1).
    var colour: [Float]
    /// The texture descriptor (``textureBins`` values).
    var texture: [Float]
    /// The difference hash.
    var hash: UInt64

    static let colourBins = 28
    static let textureBins = 18
    /// The side, in pixels, photos are brought to before the features are computed.
    static let side = 128

    init(colour: [Float], texture: [Float], hash: UInt64) {
        self.colour = colour
        self.texture = texture
        self.hash = hash
    }

    // MARK: - Similarity

    /// How alike two photos look, 0 (nothing alike) to 1 (the same picture): 1 − ``distance(to:)``.
    func similarity(to other: BaselineFeatures) -> Double {
        1 - Double(distance(to: other))
    }

    /// How far apart two photos look, 0 to 1: a weighted sum of the colour histograms' L1
    /// distance (halved: 0 to 1; equal to 1 − their intersection), the texture descriptors'
    /// (quartered: two scales), and the hashes' Hamming distance over 32 bits, capped at 1
    /// (unrelated photos differ in about half of the 64 bits, so only near copies score).
    /// Each part is a metric, and so is the sum: ``ReferenceIndex`` relies on the triangle
    /// inequality to search without comparing against every photo.
    func distance(to other: BaselineFeatures) -> Float {
        var colourL1: Float = 0
        for index in 0..<min(colour.count, other.colour.count) { colourL1 += abs(colour[index] - other.colour[index]) }
        var textureL1: Float = 0
        for index in 0..<min(texture.count, other.texture.count) { textureL1 += abs(texture[index] - other.texture[index]) }
        let hamming = Float((hash ^ other.hash).nonzeroBitCount)
        return 0.55 * min(1, colourL1 / 2) + 0.3 * min(1, textureL1 / 4) + 0.15 * min(1, hamming / 32)
    }

    // MARK: - Computing

    /// The features of an encoded photo (JPEG, PNG, WebP or HEIF), decoded with shrink-on-load
    /// to about ``side`` pixels.
    ///
    /// - Throws: `badRequest` when the bytes are not a photo libvips can decode, `tooLarge`
    ///   when they are over ``PhotoLimits``.
    static func compute(from bytes: [UInt8]) throws(CanopyError) -> BaselineFeatures {
        let rgb = try PhotoFeatures.pixels(of: bytes, side: side, cropping: true)
        return compute(pixels: rgb.pixels, width: rgb.width, height: rgb.height)
    }

    /// The features of 8-bit sRGB pixels (three bytes each, row by row).
    static func compute(pixels: [UInt8], width: Int, height: Int) -> BaselineFeatures {
        precondition(pixels.count == width * height * 3 && width > 0 && height > 0, "pixels must be width x height x 3 bytes")
        var colour = [Float](repeating: 0, count: colourBins)
        var grey = [Float](repeating: 0, count: width * height)
        for index in 0..<(width * height) {
            let r = Double(pixels[index * 3]), g = Double(pixels[index * 3 + 1]), b = Double(pixels[index * 3 + 2])
            let lab = OKLab(red: r, green: g, blue: b)
            let lightness = min(3, max(0, Int(lab.l * 4)))
            if lab.chroma < 0.03 {
                colour[24 + lightness] += 1
            } else {
                let angle = atan2(lab.b, lab.a) // -π...π
                let hue = min(5, Int((angle + .pi) / (2 * .pi) * 6))
                colour[lightness * 6 + hue] += 1
            }
            grey[index] = Float(lab.l)
        }
        let count = Float(width * height)
        colour = colour.map { $0 / count }
        let texture =
            textureDescriptor(grey, width: width, height: height, step: 1)
            + textureDescriptor(grey, width: width, height: height, step: 4)
        return BaselineFeatures(colour: colour, texture: texture, hash: differenceHash(grey, width: width, height: height))
    }

    /// 8 gradient-orientation bins weighted by strength and the share of strong edges, at
    /// pixel distance `step`; the 9 values sum to 1.
    static func textureDescriptor(_ grey: [Float], width: Int, height: Int, step: Int) -> [Float] {
        var bins = [Float](repeating: 0, count: 9)
        var total: Float = 0
        var strong: Float = 0
        var samples: Float = 0
        var y = step
        while y < height - step {
            var x = step
            while x < width - step {
                let dx = grey[y * width + x + step] - grey[y * width + x - step]
                let dy = grey[(y + step) * width + x] - grey[(y - step) * width + x]
                let magnitude = (dx * dx + dy * dy).squareRoot()
                samples += 1
                if magnitude > 0.01 {
                    // Orientation without sign (an edge and its opposite are one edge): 0...π.
                    var angle = atan2(dy, dx)
                    if angle < 0 { angle += .pi }
                    bins[min(7, Int(angle / .pi * 8))] += magnitude
                    total += magnitude
                    if magnitude > 0.1 { strong += 1 }
                }
                x += step
            }
            y += step
        }
        let edgeShare = samples > 0 ? strong / samples : 0
        guard total > 0 else { return [0, 0, 0, 0, 0, 0, 0, 0, 1] } // flat: no edges at all
        // The orientation bins share what the edge share leaves.
        let scale = (1 - edgeShare) / total
        for index in 0..<8 { bins[index] *= scale }
        bins[8] = edgeShare
        return bins
    }

    /// dHash: the grey image averaged down to 9x8, one bit per horizontal neighbour pair.
    static func differenceHash(_ grey: [Float], width: Int, height: Int) -> UInt64 {
        var cells = [Float](repeating: 0, count: 72)
        var counts = [Float](repeating: 0, count: 72)
        for y in 0..<height {
            let row = min(7, y * 8 / height)
            for x in 0..<width {
                let column = min(8, x * 9 / width)
                cells[row * 9 + column] += grey[y * width + x]
                counts[row * 9 + column] += 1
            }
        }
        var hash: UInt64 = 0
        for row in 0..<8 {
            for column in 0..<8 {
                let left = cells[row * 9 + column] / max(1, counts[row * 9 + column])
                let right = cells[row * 9 + column + 1] / max(1, counts[row * 9 + column + 1])
                hash = hash << 1 | (left > right ? 1 : 0)
            }
        }
        return hash
    }
}
