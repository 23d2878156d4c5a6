import CanopyMessages

/// The one limit on photos, wherever they are read: canopy-images on upload and fetch, and
/// canopy-identify's features (its service and its offline CLIs, `submit` and `reference
/// add`). Checked on the file's size and on the pixels its header claims, before anything is
/// decoded.
public enum PhotoLimits {
    /// The largest photo file: 25 MiB, a phone's largest photo with room to spare.
    public static let maximumBytes = 25 * 1024 * 1024
    /// The most pixels a photo's header may claim: 40 megapixels.
    public static let maximumPixels = 40_000_000

    /// Throws `tooLarge` when a photo of `bytes` bytes claiming `width` × `height` pixels is
    /// over either limit.
    public static func check(
        bytes: Int, width: Int, height: Int, maximumBytes: Int = maximumBytes,
        maximumPixels: Int = maximumPixels
    ) throws(CanopyError) {
        guard bytes <= maximumBytes else {
            throw CanopyError(.tooLarge, "the image is \(bytes) bytes; the limit is \(maximumBytes) bytes")
        }
        guard width.multipliedReportingOverflow(by: height).partialValue <= maximumPixels, width <= maximumPixels, height <= maximumPixels else {
            throw CanopyError(.tooLarge, "the image claims \(width)x\(height) pixels; the limit is \(maximumPixels / 1_000_000) megapixels")
        }
    }
}
