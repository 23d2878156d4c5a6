import CVips
import CanopyImaging
import CanopyMessages
import Foundation

/// Made-up plants for tests and benchmarks (not used on anything from users): each has its
/// colours and a leaf-vein-like stripe pattern, and ``photo(seed:width:height:)`` takes
/// another "shot" of it: the pattern shifted, turned and scaled a little, other light, new
/// sensor noise. Two shots of one plant look alike; two plants differ in colour, pattern or
/// both, as two species do.
public struct SyntheticPlant: Sendable, Equatable {
    /// The main colour's hue, in degrees (OKLCh).
    public var hue: Double
    /// The vein colour's hue, in degrees.
    public var accentHue: Double
    /// The stripes' direction, in degrees.
    public var angle: Double
    /// Stripes per 100 pixels.
    public var frequency: Double

    public init(hue: Double, accentHue: Double, angle: Double, frequency: Double) {
        self.hue = hue
        self.accentHue = accentHue
        self.angle = angle
        self.frequency = frequency
    }

    /// The `index`th of a set of well-separated species (any number; hues, patterns and
    /// directions are spread so that neighbours differ in at least two of them).
    public static func species(_ index: Int) -> SyntheticPlant {
        let golden = 137.507_764 // degrees: successive hues as far apart as they can be
        return SyntheticPlant(
            hue: (Double(index) * golden).truncatingRemainder(dividingBy: 360),
            accentHue: (Double(index) * golden + 40 + Double(index % 3) * 60).truncatingRemainder(dividingBy: 360),
            angle: Double((index * 47) % 180), frequency: [2.5, 5, 9][index % 3])
    }

    /// A shot of the plant as 8-bit sRGB pixels, three bytes each.
    public func pixels(seed: Int, width: Int = 320, height: Int = 240) -> [UInt8] {
        var random = SplitMix(seed: UInt64(truncatingIfNeeded: seed) &* 0x9E37_79B9 &+ UInt64(bitPattern: Int64(hue * 1000)))
        let turn = (angle + random.uniform(-4, 4)) * .pi / 180
        let scale = frequency * random.uniform(0.92, 1.08) / 100 * 2 * .pi
        let phase = random.uniform(0, 2 * .pi)
        let light = random.uniform(0.93, 1.07)
        let main = Self.colour(hue: hue, lightness: 0.68, chroma: 0.13)
        let accent = Self.colour(hue: accentHue, lightness: 0.42, chroma: 0.11)
        let (cosine, sine) = (cos(turn), sin(turn))
        var pixels = [UInt8](repeating: 0, count: width * height * 3)
        for y in 0..<height {
            for x in 0..<width {
                let t = 0.5 + 0.5 * sin(scale * (Double(x) * cosine + Double(y) * sine) + phase)
                let offset = (y * width + x) * 3
                for channel in 0..<3 {
                    let value = (main[channel] * (1 - t) + accent[channel] * t) * light + random.uniform(-6, 6)
                    pixels[offset + channel] = UInt8(max(0, min(255, value.rounded())))
                }
            }
        }
        return pixels
    }

    /// A shot of the plant as a JPEG.
    public func photo(seed: Int, width: Int = 320, height: Int = 240, quality: Int = 85) throws(CanopyError) -> [UInt8] {
        try Self.jpeg(pixels(seed: seed, width: width, height: height), width: width, height: height, quality: quality)
    }

    /// 8-bit sRGB pixels (three bytes each, row by row) encoded as a JPEG: every made-up photo's last step.
    public static func jpeg(_ pixels: [UInt8], width: Int, height: Int, quality: Int = 85) throws(CanopyError) -> [UInt8] {
        try Vips.start()
        let image = try VipsImage(pixels.withUnsafeBytes { canopy_vips_from_rgb($0.baseAddress, Int32(width), Int32(height)) }, "making a test photo")
        return try image.encode(.jpeg, quality: quality)
    }

    /// An OKLCh colour as sRGB components (0...255).
    static func colour(hue: Double, lightness: Double, chroma: Double) -> [Double] {
        let radians = hue * .pi / 180
        let (r, g, b) = OKLab(l: lightness, a: chroma * cos(radians), b: chroma * sin(radians)).rgb
        return [Double(r), Double(g), Double(b)]
    }
}
