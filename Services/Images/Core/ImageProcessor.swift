import CVips
import CanopyImaging
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
            ["heic", "heix", "hevc", "hevx", "heim", "heis", "mif1", "msf1", "avif", "avis"].contains(String(decoding: bytes[8..<12], as: UTF8.self))
        {
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
        /// The largest input by default (``PhotoLimits``, the project's one limit).
        static let defaultMaximumBytes = PhotoLimits.maximumBytes
        /// Largest input file.
        var maximumBytes = Limits.defaultMaximumBytes
        /// Largest pixel count an input's header may claim.
        var maximumPixels = PhotoLimits.maximumPixels
    }

    /// A checked input, sized as shown (after its EXIF orientation).
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
    /// Where refusals are counted.
    let metrics: ImageMetrics

    init(limits: Limits = Limits(), metrics: ImageMetrics = ImageMetrics()) throws {
        try Vips.start()
        self.limits = limits
        self.metrics = metrics
    }

    /// Refuses, with nothing decoded, what is too large, not one of the four formats, or
    /// claims too many pixels.
    func inspect(_ bytes: [UInt8]) throws -> Inspected {
        guard bytes.count <= limits.maximumBytes else {
            metrics.refused(.tooManyBytes)
            throw CanopyError(.tooLarge, "the image is \(bytes.count) bytes; the limit is \(limits.maximumBytes) bytes")
        }
        guard let kind = ImageKind(sniffing: bytes) else {
            metrics.refused(.unknownFormat)
            throw CanopyError(.badRequest, "not a JPEG, PNG, WebP or HEIF image (judged by its first bytes); convert it to one of those")
        }
        let shown: Inspected
        do {
            shown = try header(bytes, kind: kind)
        } catch {
            metrics.refused(.unreadableHeader)
            throw error
        }
        do {
            try PhotoLimits.check(
                bytes: bytes.count, width: shown.width, height: shown.height, maximumBytes: limits.maximumBytes, maximumPixels: limits.maximumPixels)
        } catch {
            metrics.refused(.tooManyPixels)
            throw error
        }
        return shown
    }

    /// The header alone: kind and size as shown, no limits applied (for stored originals,
    /// which passed them on the way in).
    private func header(_ bytes: [UInt8], kind: ImageKind? = nil) throws -> Inspected {
        guard let kind = kind ?? ImageKind(sniffing: bytes) else {
            throw CanopyError(.badRequest, "not a JPEG, PNG, WebP or HEIF image (judged by its first bytes)")
        }
        var width: Int32 = 0
        var height: Int32 = 0
        var loader = [CChar](repeating: 0, count: 64)
        let read = bytes.withUnsafeBytes { canopy_vips_header($0.baseAddress, $0.count, &width, &height, &loader, loader.count) }
        guard read == 0 else {
            throw CanopyError(.badRequest, "the \(kind.rawValue) image's header cannot be read (truncated or corrupt?): \(Vips.lastError())")
        }
        return Inspected(kind: kind, width: Int(width), height: Int(height))
    }

    /// The original as stored: decoded, auto-rotated, sRGB, every piece of metadata
    /// stripped, encoded as the full variant is (quality 90): WebP stays WebP, everything
    /// else becomes JPEG. So the stored original *is* the full variant in its format, made by
    /// the one full-size decode a photo ever needs. Truncated or corrupt input fails here.
    func normalized(_ bytes: [UInt8], keeping kind: ImageKind) throws -> (bytes: [UInt8], width: Int, height: Int) {
        try decoding {
            let image = try decode(bytes)
            return (try image.encode(Self.storedFormat(kind), quality: Self.spec(.full).quality), image.width, image.height)
        }
    }

    /// The format an original of `kind` is stored in.
    static func storedFormat(_ kind: ImageKind) -> Images.Format { kind == .webp ? .webp : .jpeg }

    /// libvips decodes lazily, so a truncated or corrupt input fails while encoding: such a
    /// failure is the input's fault and says so.
    private func decoding<T>(_ work: () throws -> T) throws -> T {
        do {
            return try work()
        } catch let error as CanopyError where error.code == .internal {
            throw CanopyError(.badRequest, "the image cannot be decoded (truncated or corrupt?): \(error.message)")
        }
    }

    /// Decodes, shrinking on load by `shrink` (1, 2, 4 or 8).
    func decode(_ bytes: [UInt8], shrink: Int = 1) throws -> VipsImage {
        try bytes.withUnsafeBytes { (buffer) throws -> VipsImage in
            try VipsImage(canopy_vips_decode(buffer.baseAddress, buffer.count, Int32(shrink)), "the image cannot be decoded (truncated or corrupt?)")
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

    /// 8-bit sRGB pixels, three bytes each.
    struct Pixels: Sendable {
        var bytes: [UInt8]
        var width: Int
        var height: Int
    }

    /// Makes the requested variants from one decode of `original`.
    func make(_ variants: Set<Images.Variant>, format: Images.Format, from original: [UInt8]) throws -> [Made] {
        try decoding {
            var made: [Made] = []
            try render(variants, from: original) { variant, image in made.append(try encode(variant, image, format)) }
            return made
        }
    }

    private func encode(_ variant: Images.Variant, _ image: VipsImage, _ format: Images.Format) throws -> Made {
        Made(variant: variant, format: format, bytes: try image.encode(format, quality: Self.spec(variant).quality), width: image.width, height: image.height)
    }

    /// Makes thumbnail, gallery and small (JPEG or WebP) from one decode, and keeps the small
    /// one's pixels too: the 400 px image palettes are computed from.
    func makeWithPalettePixels(format: Images.Format, from original: [UInt8]) throws -> (made: [Made], pixels: Pixels) {
        try decoding {
            var made: [Made] = []
            var pixels: Pixels?
            try render([.gallery, .small, .thumbnail], from: original, keeping: .small) { variant, image in
                made.append(try encode(variant, image, format))
                if variant == .small {
                    let rgb = try image.rgbPixels()
                    pixels = Pixels(bytes: rgb.pixels, width: rgb.width, height: rgb.height)
                }
            }
            return (made, pixels!)
        }
    }

    /// One variant to make: its size as a share of the picture as shown.
    private struct Step {
        var variant: Images.Variant
        var scale: Double
        var width: Int
        var height: Int
        var crop: Bool
    }

    /// Renders each variant of one decode and hands it to `visit`, largest first.
    ///
    /// The decode shrinks on load as far as the largest variant allows (a 12 MP JPEG for a
    /// gallery image decodes at a quarter of its size, for a thumbnail at an eighth). Each
    /// smaller variant is then made from the smallest image already made that is at least
    /// its size, not from the decode again: small from gallery, thumbnail from small. An image
    /// that later variants are made from is rendered into memory once; the rest stream.
    /// A `keeping` variant is rendered into memory too (its pixels are read after encoding).
    private func render(
        _ variants: Set<Images.Variant>, from original: [UInt8], keeping: Images.Variant? = nil,
        visit: (Images.Variant, VipsImage) throws -> Void
    ) throws {
        let shown = try header(original)
        let steps = variants.map { Self.step($0, width: shown.width, height: shown.height) }
        // Fitted variants largest first (each can feed the next); cropped ones last, as
        // nothing is made from a cropped image.
        let ordered = steps.filter { !$0.crop }.sorted { $0.scale > $1.scale } + steps.filter(\.crop)
        guard let first = ordered.first else { return }
        let largest = ordered.map(\.scale).max()!
        var decoded = try decode(original, shrink: Self.shrinkOnLoad(for: largest))
        // The stream of the decode is read once, unless something other than the first
        // variant needs more pixels than the first one has.
        if ordered.count > 1 && (first.crop || ordered.contains { $0.scale > first.scale }) {
            decoded = try decoded.inMemory()
        }
        var sources = [(image: decoded, scale: Double(decoded.width) / Double(shown.width))]
        for (index, step) in ordered.enumerated() {
            // The smallest image made so far that has the pixels this variant needs.
            let source = sources.last { $0.scale >= step.scale * 0.999 }?.image ?? decoded
            var image =
                step.crop || source.width != step.width || source.height != step.height
                ? try VipsImage(canopy_vips_resize(source.handle, Int32(step.width), Int32(step.height), step.crop ? 1 : 0), "resizing")
                : source
            if (!step.crop && index < ordered.count - 1) || step.variant == keeping {
                image = try image.inMemory()
                sources.append((image, step.scale))
            }
            try visit(step.variant, image)
        }
    }

    /// The size of a variant of a `width` x `height` picture. Nothing is ever enlarged.
    private static func step(_ variant: Images.Variant, width: Int, height: Int) -> Step {
        let spec = spec(variant)
        guard variant != .full else { return Step(variant: variant, scale: 1, width: width, height: height, crop: false) }
        let across = Double(spec.width) / Double(width), down = Double(spec.height) / Double(height)
        if spec.crop {
            // Scaled to fill the box, then its centre kept.
            return Step(variant: variant, scale: min(1, max(across, down)), width: spec.width, height: spec.height, crop: true)
        }
        let scale = min(1, across, down)
        return Step(
            variant: variant, scale: scale, width: max(1, Int((Double(width) * scale).rounded())),
            height: max(1, Int((Double(height) * scale).rounded())), crop: false)
    }

    /// The largest shrink-on-load factor (8, 4, 2 or 1) that still decodes at least `scale`
    /// of the picture.
    static func shrinkOnLoad(for scale: Double) -> Int {
        [8, 4, 2].first { 1 / Double($0) >= scale } ?? 1
    }

    /// A square thumbnail of any size (the CLI's `--size`), cropped to fill, quality 70.
    func thumbnail(_ bytes: [UInt8], size: Int, format: Images.Format) throws -> (bytes: [UInt8], width: Int, height: Int) {
        guard size >= 1, size <= 4096 else { throw CanopyError(.badRequest, "a thumbnail is 1 to 4096 pixels") }
        return try decoding {
            let shown = try header(bytes)
            let scale = min(1, max(Double(size) / Double(shown.width), Double(size) / Double(shown.height)))
            let decoded = try decode(bytes, shrink: Self.shrinkOnLoad(for: scale))
            let image = try VipsImage(canopy_vips_resize(decoded.handle, Int32(size), Int32(size), 1), "resizing")
            return (try image.encode(format, quality: Self.spec(.thumbnail).quality), image.width, image.height)
        }
    }

    /// The pixels palettes are computed from: the image fitted into 400x400, 8-bit sRGB.
    func palettePixels(from bytes: [UInt8]) throws -> Pixels {
        try decoding {
            var pixels: Pixels?
            try render([.small], from: bytes) { _, image in
                let rgb = try image.rgbPixels()
                pixels = Pixels(bytes: rgb.pixels, width: rgb.width, height: rgb.height)
            }
            return pixels!
        }
    }
}
