import CVips
import CanopyMessages

/// What an input's first bytes say it is. Only these four are ever decoded; the declared
/// type of an upload is never trusted.
enum ImageKind: String, Sendable {
    case jpeg, png, webp, heif

    /// Recognises JPEG, PNG, WebP and HEIF (including AVIF) by their magic bytes.
    init?(sniffing bytes: [UInt8]) {
        func matches(_ prefix: [UInt8], at offset: Int = 0) -> Bool {
            bytes.count >= offset + prefix.count && Array(bytes[offset..<offset + prefix.count]) == prefix
        }
        if matches([0xFF, 0xD8, 0xFF]) {
            self = .jpeg
        } else if matches([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]) {
            self = .png
        } else if matches(Array("RIFF".utf8)) && matches(Array("WEBP".utf8), at: 8) {
            self = .webp
        } else if matches(Array("ftyp".utf8), at: 4), bytes.count >= 12,
                  ["heic", "heix", "hevc", "hevx", "heim", "heis", "mif1", "msf1", "avif", "avis"].contains(String(decoding: bytes[8..<12], as: UTF8.self)) {
            self = .heif
        } else {
            return nil
        }
    }
}

/// Checks inputs and makes variants with libvips. Stateless and thread-safe: every call
/// works on its own images.
struct ImageProcessor: Sendable {
    /// Limits on input.
    struct Limits: Sendable {
        /// Largest input file.
        var maximumBytes = 25 * 1024 * 1024
        /// Largest pixel count an input's header may claim.
        var maximumPixels = 40_000_000
    }

    /// A checked input.
    struct Inspected: Sendable {
        var kind: ImageKind
        var width: Int
        var height: Int
    }

    /// The four variants' sizes and qualities (seed 001).
    static func spec(_ variant: Images.Variant) -> (width: Int, height: Int, crop: Bool, quality: Int) {
        switch variant {
        case .thumbnail: (150, 150, true, 70)
        case .gallery: (800, 600, false, 80)
        case .small: (400, 400, false, 80)
        case .full: (0, 0, false, 90)
        }
    }

    let limits: Limits

    init(limits: Limits = Limits()) throws {
        try Vips.start()
        self.limits = limits
    }

    /// Refuses, with nothing decoded, what is too large, not one of the four formats, or
    /// claims too many pixels.
    func inspect(_ bytes: [UInt8]) throws -> Inspected {
        guard bytes.count <= limits.maximumBytes else {
            throw CanopyError(.tooLarge, "the image is \(bytes.count) bytes; the limit is \(limits.maximumBytes) bytes")
        }
        guard let kind = ImageKind(sniffing: bytes) else {
            throw CanopyError(.badRequest, "not a JPEG, PNG, WebP or HEIF image (judged by its first bytes); convert it to one of those")
        }
        var width: Int32 = 0
        var height: Int32 = 0
        var loader = [CChar](repeating: 0, count: 64)
        let read = bytes.withUnsafeBytes { canopy_vips_header($0.baseAddress, $0.count, &width, &height, &loader, loader.count) }
        guard read == 0 else {
            throw CanopyError(.badRequest, "the \(kind.rawValue) image cannot be read: \(Vips.lastError())")
        }
        guard Int(width) * Int(height) <= limits.maximumPixels else {
            throw CanopyError(.tooLarge, "the image claims \(width)x\(height) pixels; the limit is \(limits.maximumPixels / 1_000_000) megapixels")
        }
        return Inspected(kind: kind, width: Int(width), height: Int(height))
    }

    /// The original as stored: decoded, auto-rotated, sRGB, every piece of metadata
    /// stripped; WebP stays WebP, everything else becomes JPEG at quality 92. Truncated or
    /// corrupt input fails here.
    func normalized(_ bytes: [UInt8], keeping kind: ImageKind) throws -> (bytes: [UInt8], width: Int, height: Int) {
        try decoding {
            let image = try decode(bytes)
            return (try image.encode(kind == .webp ? .webp : .jpeg, quality: 92), image.width, image.height)
        }
    }

    /// libvips decodes lazily, so a truncated or corrupt input fails while encoding: such a
    /// failure is the input's fault and says so.
    private func decoding<T>(_ work: () throws -> T) throws -> T {
        do {
            return try work()
        } catch let error as CanopyError where error.code == .internal {
            throw CanopyError(.badRequest, "the image cannot be decoded (truncated or corrupt?): \(error.message)")
        }
    }

    func decode(_ bytes: [UInt8]) throws -> VipsImage {
        try bytes.withUnsafeBytes { (buffer) throws -> VipsImage in
            try VipsImage(canopy_vips_decode(buffer.baseAddress, buffer.count), "the image cannot be decoded (truncated or corrupt?)")
        }
    }

    /// An encoded variant.
    struct Made: Sendable {
        var variant: Images.Variant
        var format: Images.Format
        var bytes: [UInt8]
        var width: Int
        var height: Int
    }

    /// Makes the requested variants. Thumbnail, gallery and small come from one
    /// shrink-on-load decode (at the largest size asked for), the smaller ones derived from
    /// it in memory; full decodes at full size.
    func make(_ variants: Set<Images.Variant>, format: Images.Format, from original: [UInt8]) throws -> [Made] {
        try decoding { try makeDecoded(variants, format: format, from: original) }
    }

    private func makeDecoded(_ variants: Set<Images.Variant>, format: Images.Format, from original: [UInt8]) throws -> [Made] {
        var made: [Made] = []
        if variants.contains(.full) {
            let image = try decode(original)
            made.append(Made(variant: .full, format: format, bytes: try image.encode(format, quality: Self.spec(.full).quality), width: image.width, height: image.height))
        }
        let small = [Images.Variant.gallery, .small, .thumbnail].filter(variants.contains)
        guard let largest = small.first else { return made }
        let spec = Self.spec(largest)
        let base = try original.withUnsafeBytes { (buffer) throws -> VipsImage in
            try VipsImage(canopy_vips_thumbnail(buffer.baseAddress, buffer.count, Int32(spec.width), Int32(spec.height), spec.crop ? 1 : 0),
                          "the image cannot be decoded (truncated or corrupt?)")
        }
        let decoded = small.count > 1 ? try base.inMemory() : base
        for variant in small {
            let spec = Self.spec(variant)
            let image = variant == largest
                ? decoded
                : try VipsImage(canopy_vips_thumbnail_image(decoded.handle, Int32(spec.width), Int32(spec.height), spec.crop ? 1 : 0), "resizing")
            made.append(Made(variant: variant, format: format, bytes: try image.encode(format, quality: spec.quality), width: image.width, height: image.height))
        }
        return made
    }

    /// A square thumbnail of any size (the CLI's `--size`), cropped to fill, quality 70.
    func thumbnail(_ bytes: [UInt8], size: Int, format: Images.Format) throws -> (bytes: [UInt8], width: Int, height: Int) {
        guard size >= 1, size <= 4096 else { throw CanopyError(.badRequest, "a thumbnail is 1 to 4096 pixels") }
        let image = try bytes.withUnsafeBytes { (buffer) throws -> VipsImage in
            try VipsImage(canopy_vips_thumbnail(buffer.baseAddress, buffer.count, Int32(size), Int32(size), 1), "the image cannot be decoded")
        }
        return (try image.encode(format, quality: Self.spec(.thumbnail).quality), image.width, image.height)
    }

    /// The pixels palettes are computed from: the image fitted into 400x400, 8-bit sRGB.
    func palettePixels(from bytes: [UInt8]) throws -> (pixels: [UInt8], width: Int, height: Int) {
        let spec = Self.spec(.small)
        let image = try bytes.withUnsafeBytes { (buffer) throws -> VipsImage in
            try VipsImage(canopy_vips_thumbnail(buffer.baseAddress, buffer.count, Int32(spec.width), Int32(spec.height), 0), "the image cannot be decoded")
        }
        return try image.rgbPixels()
    }
}
