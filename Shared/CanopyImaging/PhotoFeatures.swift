import CVips
import CanopyMessages
import Foundation

/// What a photo looks like, as numbers that can be compared: computed once per photo from its
/// pixels and stored, so matching never decodes an image again.
///
/// Three descriptors, each normalised so that it compares by plain distances (see
/// ``distance(to:)``):
/// - **colour**: a histogram of the photo's pixels in OKLab, 4 lightness by 6 hue bins for
///   coloured pixels and 4 lightness bins for grey ones (28 bins, summing to 1). OKLab is
///   perceptually even, so neighbouring bins are neighbouring colours.
/// - **texture**: a histogram of gradient orientations weighted by gradient strength, 8
///   orientation bins at each of 2 scales, plus the share of strong edges at each scale
///   (18 values, L1-normalised per scale). It tells fine from coarse, striped from speckled.
/// - **hash**: a 64-bit difference hash (dHash) of the 9x8 grey thumbnail: near-identical
///   photos (the same shot re-encoded, resized, slightly recoloured) differ in a few bits.
///
/// These are honest *similarities* of appearance, not botany: two species that look alike
/// score alike, and one plant photographed in other light or from another side may score
/// lower than a different plant on the same windowsill. `docs/IDENTIFICATION.md` says how to
/// read the scores.
public struct PhotoFeatures: Codable, Sendable, Equatable {
    /// The colour histogram (``colourBins`` values summing to 1).
    public var colour: [Float]
    /// The texture descriptor (``textureBins`` values).
    public var texture: [Float]
    /// The difference hash.
    public var hash: UInt64

    public static let colourBins = 28
    public static let textureBins = 18
    /// The side, in pixels, photos are brought to before the features are computed.
    public static let side = 128

    public init(colour: [Float], texture: [Float], hash: UInt64) {
        self.colour = colour
        self.texture = texture
        self.hash = hash
    }

    // MARK: - Similarity

    /// How alike two photos look, 0 (nothing alike) to 1 (the same picture): 1 − ``distance(to:)``.
    public func similarity(to other: PhotoFeatures) -> Double {
        1 - Double(distance(to: other))
    }

    /// How far apart two photos look, 0 to 1: a weighted sum of the colour histograms' L1
    /// distance (halved: 0 to 1; equal to 1 − their intersection), the texture descriptors'
    /// (quartered: two scales), and the hashes' Hamming distance over 32 bits, capped at 1
    /// (unrelated photos differ in about half of the 64 bits, so only near copies score).
    /// Each part is a metric, and so is the sum: ``ReferenceIndex`` relies on the triangle
    /// inequality to search without comparing against every photo.
    public func distance(to other: PhotoFeatures) -> Float {
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
    public static func compute(from bytes: [UInt8]) throws(CanopyError) -> PhotoFeatures {
        try Vips.start()
        let header = bytes.withUnsafeBytes { buffer -> (width: Int32, height: Int32)? in
            var width: Int32 = 0, height: Int32 = 0
            var loader = [CChar](repeating: 0, count: 64)
            guard canopy_vips_header(buffer.baseAddress, buffer.count, &width, &height, &loader, loader.count) == 0, width > 0, height > 0 else {
                return nil
            }
            return (width, height)
        }
        // The project's one photo limit, before anything is decoded.
        if let header { try PhotoLimits.check(bytes: bytes.count, width: Int(header.width), height: Int(header.height)) }
        let decoded = header.flatMap { header in
            bytes.withUnsafeBytes { buffer -> OpaquePointer? in
                let scale = Double(side) / Double(min(header.width, header.height))
                let shrink = [8, 4, 2].first { 1 / Double($0) >= scale } ?? 1
                return canopy_vips_decode(buffer.baseAddress, buffer.count, Int32(shrink))
            }
        }
        let source = try VipsImage(decoded, "the photo cannot be decoded (not a JPEG, PNG, WebP or HEIF, or truncated)")
        let image = try VipsImage(canopy_vips_resize(source.handle, Int32(side), Int32(side), 1), "the photo cannot be decoded (truncated or corrupt?)")
        let rgb: (pixels: [UInt8], width: Int, height: Int)
        do {
            rgb = try image.rgbPixels()
        } catch {
            throw CanopyError(.badRequest, "the photo cannot be decoded (truncated or corrupt?): \(error.message)")
        }
        return compute(pixels: rgb.pixels, width: rgb.width, height: rgb.height)
    }

    /// The features of 8-bit sRGB pixels (three bytes each, row by row).
    public static func compute(pixels: [UInt8], width: Int, height: Int) -> PhotoFeatures {
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
        let texture = textureDescriptor(grey, width: width, height: height, step: 1)
            + textureDescriptor(grey, width: width, height: height, step: 4)
        return PhotoFeatures(colour: colour, texture: texture, hash: differenceHash(grey, width: width, height: height))
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
