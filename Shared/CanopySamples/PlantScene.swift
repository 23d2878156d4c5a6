import CanopyImaging
import CanopyMessages
import Foundation

/// Made-up species photographed the way phones photograph plants (for the identification
/// benchmark, never for anything from users): a rosette of leaves of the species' shape,
/// colour and vein pattern, in front of a background that changes from shot to shot, under
/// warmer or cooler, brighter or dimmer light, with more or fewer leaves, at another scale and
/// angle, with sensor noise, and sometimes partly hidden.
///
/// Two shots of one species share only what belongs to the plant; everything a photo of a
/// plant has besides the plant changes.
public struct PlantScene: Sendable, Equatable {
    /// The leaf's colour: OKLCh hue (degrees), lightness and chroma.
    public var hue: Double
    public var lightness: Double
    public var chroma: Double
    /// The veins' colour hue, and how strongly they show (0: none).
    public var veinHue: Double
    public var veinStrength: Double
    /// Veins per leaf length, and their angle to the midrib (degrees).
    public var veinFrequency: Double
    public var veinAngle: Double
    /// The leaf's length against its width (1: round, 4: a blade).
    public var aspect: Double
    /// How pointed the tip is (0: an ellipse, 1: a sharp tip).
    public var tip: Double
    /// Leaves in a typical shot.
    public var leaves: Int

    /// The `index`th made-up species of a set whose neighbours differ (spread like
    /// ``SyntheticPlant/species(_:)``, but green and close for many of them, as leaves are).
    public static func species(_ index: Int) -> PlantScene {
        var random = SplitMix(seed: UInt64(index) &* 0x9E37_79B9_7F4A_7C15 &+ 17)
        let greenish = index % 4 != 3 // most species green; some red, purple or variegated
        return PlantScene(
            hue: greenish ? random.uniform(105, 160) : random.uniform(0, 360),
            lightness: random.uniform(0.42, 0.72), chroma: random.uniform(0.06, 0.16),
            veinHue: random.uniform(60, 140), veinStrength: [0, 0.25, 0.5, 0.8][index % 4],
            veinFrequency: random.uniform(3, 14), veinAngle: random.uniform(20, 70),
            aspect: random.uniform(1.1, 4.0), tip: random.uniform(0, 1), leaves: 3 + Int(random.uniform(0, 6)))
    }

    /// What changes between shots, drawn from a seed (also what a benchmark may report).
    public struct Shot: Sendable, Equatable {
        public var backgroundHue: Double
        public var backgroundLightness: Double
        public var backgroundChroma: Double
        /// Colour temperature as a tint: red gain over blue gain (0.8 cool … 1.25 warm).
        public var warmth: Double
        /// Overall light level.
        public var light: Double
        public var leaves: Int
        public var scale: Double
        public var rotation: Double
        public var centre: (x: Double, y: Double)
        public var noise: Double
        /// Part of the plant hidden (by a hand, a pot's rim): a rectangle, or nil.
        public var occlusion: (x: Double, y: Double, width: Double, height: Double)?

        public static func == (lhs: Shot, rhs: Shot) -> Bool {
            lhs.backgroundHue == rhs.backgroundHue && lhs.warmth == rhs.warmth && lhs.leaves == rhs.leaves && lhs.scale == rhs.scale
        }
    }

    /// The shot `seed` makes.
    public func shot(seed: Int) -> Shot {
        var random = SplitMix(seed: UInt64(truncatingIfNeeded: seed) &* 0xBF58_476D_1CE4_E5B9 &+ UInt64(bitPattern: Int64(hue * 1_000)))
        let occluded = random.uniform(0, 1) < 0.3
        return Shot(
            backgroundHue: random.uniform(0, 360), backgroundLightness: random.uniform(0.25, 0.9), backgroundChroma: random.uniform(0, 0.08),
            warmth: random.uniform(0.8, 1.25), light: random.uniform(0.7, 1.2), leaves: max(2, leaves + Int(random.uniform(-2, 3))),
            scale: random.uniform(0.7, 1.15), rotation: random.uniform(0, 2 * .pi), centre: (random.uniform(0.4, 0.6), random.uniform(0.4, 0.6)),
            noise: random.uniform(2, 9),
            occlusion: occluded ? (random.uniform(0.1, 0.6), random.uniform(0.1, 0.6), random.uniform(0.15, 0.3), random.uniform(0.15, 0.3)) : nil)
    }

    /// A shot as 8-bit sRGB pixels, three bytes each.
    public func pixels(seed: Int, width: Int = 320, height: Int = 240) -> [UInt8] {
        let shot = shot(seed: seed)
        var random = SplitMix(seed: UInt64(truncatingIfNeeded: seed) &+ 0x5851_F42D_4C95_7F2D)
        let size = Double(min(width, height))
        let leafLength = 0.42 * size * shot.scale
        let leafWidth = leafLength / aspect
        let leaf = SyntheticPlant.colour(hue: hue, lightness: lightness, chroma: chroma)
        let vein = SyntheticPlant.colour(hue: veinHue, lightness: max(0.2, lightness - 0.2), chroma: chroma * 0.8)
        let backgroundHue = shot.backgroundHue
        let tint = [shot.warmth, 1.0, 1 / shot.warmth].map { $0 * shot.light }
        // Each leaf: its angle around the centre (its midrib's direction).
        let angles = (0..<shot.leaves).map { shot.rotation + Double($0) * 2 * .pi / Double(shot.leaves) + random.uniform(-0.25, 0.25) }
        let (cx, cy) = (shot.centre.x * Double(width), shot.centre.y * Double(height))
        var pixels = [UInt8](repeating: 0, count: width * height * 3)
        for y in 0..<height {
            // The background: its colour, lighter or darker across the frame.
            let gradient = 0.85 + 0.3 * Double(y) / Double(height)
            let background = SyntheticPlant.colour(hue: backgroundHue, lightness: min(0.95, shot.backgroundLightness * gradient), chroma: shot.backgroundChroma)
            for x in 0..<width {
                var colour = background
                let (dx, dy) = (Double(x) - cx, Double(y) - cy)
                for angle in angles {
                    // Along the midrib (u, from the centre out) and across it (v).
                    let u = dx * cos(angle) + dy * sin(angle), v = -dx * sin(angle) + dy * cos(angle)
                    guard u > 0, u < leafLength else { continue }
                    let along = u / leafLength // 0 at the stalk, 1 at the tip
                    let taper = sin(.pi * pow(along, 0.8 + tip * 0.6)) * (1 - tip * along * along * 0.6)
                    guard abs(v) < leafWidth / 2 * taper else { continue }
                    // Veins: lines from the midrib at the species' angle.
                    let slant = tan(veinAngle * .pi / 180)
                    let phase = (u - abs(v) / max(0.1, slant)) / leafLength * veinFrequency
                    let onVein = abs(v) < leafWidth * 0.03 || (0.5 + 0.5 * cos(2 * .pi * phase)) > 0.92
                    let shade = 0.85 + 0.15 * (1 - abs(v) / (leafWidth / 2)) // a little light on the middle of the leaf
                    colour = (0..<3).map { channel in
                        let base = leaf[channel] * shade
                        return onVein ? base * (1 - veinStrength) + vein[channel] * veinStrength : base
                    }
                    break
                }
                if let occlusion = shot.occlusion, Double(x) >= occlusion.x * Double(width), Double(x) < (occlusion.x + occlusion.width) * Double(width),
                    Double(y) >= occlusion.y * Double(height), Double(y) < (occlusion.y + occlusion.height) * Double(height)
                {
                    colour = [205, 170, 150] // a hand
                }
                let offset = (y * width + x) * 3
                for channel in 0..<3 {
                    let value = colour[channel] * tint[channel] + random.uniform(-shot.noise, shot.noise)
                    pixels[offset + channel] = UInt8(max(0, min(255, value.rounded())))
                }
            }
        }
        return pixels
    }

    /// A shot as a JPEG.
    public func photo(seed: Int, width: Int = 320, height: Int = 240, quality: Int = 85) throws(CanopyError) -> [UInt8] {
        try SyntheticPlant.jpeg(pixels(seed: seed, width: width, height: height), width: width, height: height, quality: quality)
    }
}
