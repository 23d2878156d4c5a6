import CVips
import CanopyMessages
import Foundation

/// What the plant in a photo looks like, as numbers that can be compared: computed once per
/// photo from its pixels and stored, so matching never decodes an image again.
///
/// The plant is found first (``PlantMask``: whatever differs clearly from the background the
/// frame's border shows), and every descriptor is computed on the plant's pixels only, in
/// terms that do not change with the light or the distance:
///
/// - **Colour, without the light** (``Block/chromaticity``): the histogram of each plant
///   pixel's log(R·B/G²). A light that is warmer or cooler scales red up and blue down (or the
///   reverse) by one factor, and a brighter or dimmer one scales all three, so this value does
///   not change with either; what is left is the leaf's own colour along the other axis.
/// - **Colour against the background** (``Block/balanced``): red and blue over green after
///   dividing by the background's colour at the same height (grey world over the background).
///   It keeps the axis the first one drops, and is as good as the background is grey.
/// - **Light and dark within the plant** (``Block/shading``, ``Block/chromaticityShading``):
///   each pixel's brightness against the plant's median (veins lighter or darker than the
///   leaf, and of which colour), which a dimmer light does not change.
/// - **Shape** (``Block/radial``, ``Block/coverage``, ``Block/leafCount``, ``Block/perLeaf``,
///   ``Block/area``): how much of each ring around the plant's centre is plant, out to the
///   plant's radius (so distance does not matter), the number of leaves seen from the angular
///   rhythm of that coverage, the coverage per leaf (leaf width along its length: round,
///   pointed or a blade), and how much of the disc the plant fills.
/// - **Pattern at two scales** (``Block/patternFine``, ``Block/patternCoarse``): the plant
///   brought to a radius of 48 pixels, blurred at two scales, and its gradients' orientations
///   against the direction from the plant's centre (so turning the plant changes nothing):
///   veins across a leaf, along it, or at the species' angle; weighted by strength.
///
/// Two photos compare by ``distance(to:)``: a weighted sum of the blocks' L1 distances, the
/// weights chosen on photos of other made-up species than those measured (see
/// ``FeatureModel``).
public struct PhotoFeatures: Sendable, Equatable {
    /// The descriptors, block after block (``Block/layout``).
    public var values: [Float]

    /// The descriptors, in their order in ``values``.
    public enum Block: Int, CaseIterable, Sendable {
        case chromaticity, chromaticityShading, balanced, shading, radial, coverage, leafCount, perLeaf, area, patternFine, patternCoarse

        /// How many values the block has.
        public var count: Int {
            switch self {
            case .chromaticity: 24
            case .chromaticityShading: 50
            case .balanced: 36
            case .shading, .radial, .perLeaf: 10
            case .coverage, .leafCount, .area: 1
            case .patternFine, .patternCoarse: 6
            }
        }

        /// Each block's range in ``PhotoFeatures/values``.
        public static let layout: [Range<Int>] = {
            var start = 0
            return allCases.map { block in
                defer { start += block.count }
                return start..<(start + block.count)
            }
        }()
    }

    /// How many values a photo's features have.
    public static let count = Block.layout.last!.upperBound
    /// The long side, in pixels, photos are brought to before the features are computed.
    public static let side = 192
    /// The side, in pixels, of the plant brought to a standard size for its pattern.
    static let patternSide = 112
    static let patternRadius: Float = 48

    public init(values: [Float]) {
        precondition(values.count == Self.count, "features have \(Self.count) values")
        self.values = values
    }

    /// One block's values.
    public subscript(block: Block) -> ArraySlice<Float> { values[Block.layout[block.rawValue]] }

    // MARK: - Distance

    /// How far apart two photos' plants look: the weighted sum of the blocks' L1 distances
    /// (``FeatureModel/weights``). 0 for the same features; 1 is about the distance at which
    /// two photos are of another species as often as not. A weighted sum of metrics is a
    /// metric, which ``ReferenceIndex`` relies on.
    @inline(__always)
    public func distance(to other: PhotoFeatures) -> Float {
        values.withUnsafeBufferPointer { a in
            other.values.withUnsafeBufferPointer { b in
                FeatureModel.distance(a.baseAddress!, b.baseAddress!)
            }
        }
    }

    // MARK: - Computing

    /// The features of an encoded photo (JPEG, PNG, WebP or HEIF), decoded with shrink-on-load
    /// to about ``side`` pixels.
    ///
    /// - Throws: `badRequest` when the bytes are not a photo libvips can decode, `tooLarge`
    ///   when they are over ``PhotoLimits``.
    public static func compute(from bytes: [UInt8]) throws(CanopyError) -> PhotoFeatures {
        let rgb = try pixels(of: bytes, side: side, cropping: false)
        guard rgb.width >= 8, rgb.height >= 8 else {
            throw CanopyError(.badRequest, "the photo is too small to show a plant (\(rgb.width)x\(rgb.height) pixels)")
        }
        return compute(pixels: rgb.pixels, width: rgb.width, height: rgb.height)
    }

    /// A photo's 8-bit sRGB pixels brought to `side`: the whole frame fitting `side` x `side`
    /// with its aspect kept, or (`cropping`) its centre square at `side` x `side`. Decoded with
    /// shrink-on-load, so a 12 MP JPEG is read at an eighth of its size.
    ///
    /// - Throws: `badRequest` when the bytes are not a photo libvips can decode, `tooLarge`
    ///   when they are over ``PhotoLimits``.
    public static func pixels(of bytes: [UInt8], side: Int, cropping: Bool) throws(CanopyError) -> (pixels: [UInt8], width: Int, height: Int) {
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
                let scale = Double(side) / Double(cropping ? min(header.width, header.height) : max(header.width, header.height))
                let shrink = [8, 4, 2].first { 1 / Double($0) >= scale } ?? 1
                return canopy_vips_decode(buffer.baseAddress, buffer.count, Int32(shrink))
            }
        }
        let source = try VipsImage(decoded, "the photo cannot be decoded (not a JPEG, PNG, WebP or HEIF, or truncated)")
        // After autorotation the sides may have swapped.
        let long = max(source.width, source.height)
        let (width, height) =
            cropping
            ? (side, side)
            : long <= side ? (source.width, source.height) : (max(1, source.width * side / long), max(1, source.height * side / long))
        let image = try VipsImage(
            canopy_vips_resize(source.handle, Int32(width), Int32(height), cropping ? 1 : 0), "the photo cannot be decoded (truncated or corrupt?)")
        do {
            return try image.rgbPixels()
        } catch {
            throw CanopyError(.badRequest, "the photo cannot be decoded (truncated or corrupt?): \(error.message)")
        }
    }

    /// The features of 8-bit sRGB pixels (three bytes each, row by row), at least 8x8.
    public static func compute(pixels: [UInt8], width: Int, height: Int) -> PhotoFeatures {
        precondition(pixels.count == width * height * 3 && width >= 8 && height >= 8, "pixels must be width x height x 3 bytes, at least 8x8")
        return PlantDescriptors(pixels: pixels, width: width, height: height).features
    }
}
