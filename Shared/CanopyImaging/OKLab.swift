import Foundation

/// A colour in OKLab (Björn Ottosson, 2020): perceptually even, so distances mean something.
public struct OKLab: Equatable, Sendable {
    public var l: Double
    public var a: Double
    public var b: Double

    public var chroma: Double { (a * a + b * b).squareRoot() }

    public init(l: Double, a: Double, b: Double) {
        self.l = l
        self.a = a
        self.b = b
    }

    /// From 8-bit sRGB components (0...255).
    public init(red: Double, green: Double, blue: Double) {
        func linear(_ value: Double) -> Double {
            let c = value / 255
            return c <= 0.04045 ? c / 12.92 : pow((c + 0.055) / 1.055, 2.4)
        }
        let r = linear(red), g = linear(green), bl = linear(blue)
        let lms = (
            cbrt(0.4122214708 * r + 0.5363325363 * g + 0.0514459929 * bl),
            cbrt(0.2119034982 * r + 0.6806995451 * g + 0.1073969566 * bl),
            cbrt(0.0883024619 * r + 0.2817188376 * g + 0.6299787005 * bl)
        )
        l = 0.2104542553 * lms.0 + 0.7936177850 * lms.1 - 0.0040720468 * lms.2
        a = 1.9779984951 * lms.0 - 2.4285922050 * lms.1 + 0.4505937099 * lms.2
        b = 0.0259040371 * lms.0 + 0.7827717662 * lms.1 - 0.8086757660 * lms.2
    }

    public func distance(to other: OKLab) -> Double {
        let dl = l - other.l, da = a - other.a, db = b - other.b
        return (dl * dl + da * da + db * db).squareRoot()
    }

    /// `other` mixed in by `weight` (0...1).
    public func mixed(with other: OKLab, weight: Double) -> OKLab {
        OKLab(l: l + (other.l - l) * weight, a: a + (other.a - a) * weight, b: b + (other.b - b) * weight)
    }

    /// Back to 8-bit sRGB, clamped.
    public var rgb: (UInt8, UInt8, UInt8) {
        let l_ = l + 0.3963377774 * a + 0.2158037573 * b
        let m_ = l - 0.1055613458 * a - 0.0638541728 * b
        let s_ = l - 0.0894841775 * a - 1.2914855480 * b
        let (lc, mc, sc) = (l_ * l_ * l_, m_ * m_ * m_, s_ * s_ * s_)
        let linear = (
            4.0767416621 * lc - 3.3077115913 * mc + 0.2309699292 * sc,
            -1.2684380046 * lc + 2.6097574011 * mc - 0.3413193965 * sc,
            -0.0041960863 * lc - 0.7034186147 * mc + 1.7076147010 * sc
        )
        func encode(_ value: Double) -> UInt8 {
            let c = max(0, min(1, value))
            let s = c <= 0.0031308 ? 12.92 * c : 1.055 * pow(c, 1 / 2.4) - 0.055
            return UInt8((s * 255).rounded())
        }
        return (encode(linear.0), encode(linear.1), encode(linear.2))
    }

    /// `#rrggbb`.
    public var hex: String {
        let (r, g, b) = rgb
        return "#" + [r, g, b].map { String(format: "%02x", $0) }.joined()
    }
}
