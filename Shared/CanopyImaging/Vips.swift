import CVips
import CanopyMessages

/// libvips, started once per process (operation cache off, only the JPEG, PNG, WebP and
/// HEIF loaders allowed). Every entry point of this module goes through ``Vips/start()``.
public enum Vips {
    /// Starts libvips; the first call does the work, later calls return at once.
    public static func start() throws(CanopyError) {
        guard canopy_vips_start() == 0 else {
            throw CanopyError(.internal, "libvips did not start: \(lastError())")
        }
    }

    /// The libvips version.
    public static var version: String { String(cString: canopy_vips_version()) }

    /// The last libvips error on this thread, cleared.
    public static func lastError() -> String {
        var buffer = [CChar](repeating: 0, count: 1024)
        canopy_vips_error(&buffer, buffer.count)
        let text = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return text.split(separator: "\n").first.map(String.init) ?? "unknown libvips error"
    }
}

/// A decoded image (a libvips image handle). Not thread-safe; owned by one task at a time.
public final class VipsImage {
    public let handle: OpaquePointer

    /// Takes ownership of a handle returned by the shim, or throws the libvips error.
    public init(_ handle: OpaquePointer?, _ what: @autoclosure () -> String) throws(CanopyError) {
        guard let handle else { throw CanopyError(.badRequest, "\(what()): \(Vips.lastError())") }
        self.handle = handle
    }

    deinit { canopy_vips_release(handle) }

    public var width: Int { Int(canopy_vips_width(handle)) }
    public var height: Int { Int(canopy_vips_height(handle)) }

    /// Encodes with all metadata stripped.
    public func encode(_ format: Images.Format, quality: Int) throws(CanopyError) -> [UInt8] {
        var bytes: UnsafeMutableRawPointer?
        var length = 0
        guard canopy_vips_encode(handle, format.shim, Int32(quality), &bytes, &length) == 0, let bytes else {
            throw CanopyError(.internal, "encoding \(format.rawValue) failed: \(Vips.lastError())")
        }
        defer { canopy_vips_free(bytes) }
        let encoded = Array(UnsafeRawBufferPointer(start: bytes, count: length))
        // libvips 8.14's WebP saver writes a fresh EXIF block even when told to strip.
        return format == .webp ? WebP.strippingMetadata(encoded) : encoded
    }

    /// 8-bit sRGB pixels, three bytes each.
    public func rgbPixels() throws(CanopyError) -> (pixels: [UInt8], width: Int, height: Int) {
        var bytes: UnsafeMutableRawPointer?
        var length = 0
        var width: Int32 = 0
        var height: Int32 = 0
        guard canopy_vips_rgb(handle, &bytes, &length, &width, &height) == 0, let bytes else {
            throw CanopyError(.internal, "reading pixels failed: \(Vips.lastError())")
        }
        defer { canopy_vips_free(bytes) }
        return (Array(UnsafeRawBufferPointer(start: bytes, count: length)), Int(width), Int(height))
    }

    /// The image rendered into memory.
    public func inMemory() throws(CanopyError) -> VipsImage {
        try VipsImage(canopy_vips_in_memory(handle), "rendering into memory")
    }
}

extension Images.Format {
    public var shim: canopy_format {
        switch self {
        case .jpeg: CANOPY_JPEG
        case .webp: CANOPY_WEBP
        }
    }
}

/// The WebP container (RIFF): enough of it to drop metadata chunks.
public enum WebP {
    /// The file without its EXIF, XMP and ICC chunks, and with the VP8X flags that announce
    /// them cleared. Anything that is not a well-formed WebP comes back unchanged.
    public static func strippingMetadata(_ bytes: [UInt8]) -> [UInt8] {
        guard bytes.count >= 12, bytes[0..<4] == [0x52, 0x49, 0x46, 0x46], bytes[8..<12] == [0x57, 0x45, 0x42, 0x50] else { return bytes }
        var out = Array(bytes[0..<12])
        var offset = 12
        while offset + 8 <= bytes.count {
            let tag = String(decoding: bytes[offset..<offset + 4], as: UTF8.self)
            let size = Int(bytes[offset + 4]) | Int(bytes[offset + 5]) << 8 | Int(bytes[offset + 6]) << 16 | Int(bytes[offset + 7]) << 24
            let end = offset + 8 + size + (size & 1)
            guard end <= bytes.count else { return bytes }
            if !["EXIF", "XMP ", "ICCP"].contains(tag) {
                var chunk = Array(bytes[offset..<end])
                if tag == "VP8X", chunk.count > 8 { chunk[8] &= ~(0x08 | 0x04 | 0x20) } // EXIF, XMP, ICC flags
                out += chunk
            }
            offset = end
        }
        let riffSize = UInt32(out.count - 8)
        out[4] = UInt8(riffSize & 0xFF)
        out[5] = UInt8(riffSize >> 8 & 0xFF)
        out[6] = UInt8(riffSize >> 16 & 0xFF)
        out[7] = UInt8(riffSize >> 24 & 0xFF)
        return out
    }
}
