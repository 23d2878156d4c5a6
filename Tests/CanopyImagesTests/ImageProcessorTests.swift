import CVips
import CanopyImaging
import CanopyMessages
import CanopyServiceKit
import Foundation
import Testing

@testable import CanopyImages

/// Checking input and making variants with libvips, on real images made in the tests.
struct ImageProcessorTests {
    let processor = try! ImageProcessor()

    @Test(arguments: [Fixture.Kind.jpeg, .png, .webp, .progressiveJPEG])
    func everyAcceptedFormatMakesAllFourVariants(kind: Fixture.Kind) throws {
        let name = kind.rawValue, bytes = kind.bytes
        let inspected = try processor.inspect(bytes)
        #expect(inspected.width == 1200 && inspected.height == 800, "\(name)")
        let made = try processor.make([.thumbnail, .gallery, .small, .full], format: .jpeg, from: bytes)
        let sizes = Dictionary(uniqueKeysWithValues: made.map { ($0.variant, ($0.width, $0.height)) })
        #expect(sizes[.thumbnail]! == (150, 150))
        #expect(sizes[.gallery]! == (800, 533))
        #expect(sizes[.small]! == (400, 267))
        #expect(sizes[.full]! == (1200, 800))
        for variant in made {
            let header = Fixture.header(variant.bytes)
            #expect(header.width == variant.width && header.height == variant.height)
            #expect(!header.hasEXIF && !header.hasICC, "\(name) \(variant.variant) carries no metadata")
        }
    }

    @Test func webpOutputIsWebPWithoutMetadata() throws {
        for variant in try processor.make([.thumbnail, .gallery, .full], format: .webp, from: Fixture.image { $0.gps = true }) {
            #expect(ImageKind(sniffing: variant.bytes) == .webp)
            let header = Fixture.header(variant.bytes)
            #expect(!header.hasEXIF && !header.hasGPS && !header.hasICC)
        }
    }

    @Test func smallImagesAreNeverEnlarged() throws {
        let tiny = Fixture.image {
            $0.width = 300
            $0.height = 200
        }
        let made = try processor.make([.gallery, .thumbnail], format: .jpeg, from: tiny)
        #expect(made.first { $0.variant == .gallery }.map { ($0.width, $0.height) }! == (300, 200))
    }

    @Test func exifOrientationIsAppliedThenRemoved() throws {
        let rotated = Fixture.image { $0.orientation = 6 } // 90° clockwise
        #expect(Fixture.header(rotated).orientation)
        let stored = try processor.normalized(rotated, keeping: .jpeg)
        #expect((stored.width, stored.height) == (800, 1200))
        let header = Fixture.header(stored.bytes)
        #expect((header.width, header.height) == (800, 1200))
        #expect(!header.orientation && !header.hasEXIF)
        let gallery = try processor.make([.gallery], format: .jpeg, from: rotated)[0]
        #expect((gallery.width, gallery.height) == (400, 600))
    }

    @Test func gpsAndEveryOtherPieceOfMetadataAreStripped() throws {
        let located = Fixture.image { $0.gps = true }
        let input = Fixture.header(located)
        #expect(input.hasEXIF && input.hasGPS, "the fixture carries GPS EXIF")
        let stored = try processor.normalized(located, keeping: .jpeg)
        let made = try processor.make([.thumbnail, .gallery, .small, .full], format: .jpeg, from: located)
        for bytes in [stored.bytes] + made.map(\.bytes) {
            let header = Fixture.header(bytes)
            #expect(!header.hasGPS && !header.hasEXIF && !header.hasICC)
            #expect(!String(decoding: bytes, as: UTF8.self).contains("Canopy test camera"))
        }
    }

    @Test func cmykPhotosComeOutInSRGB() throws {
        let cmyk = Fixture.image { $0.cmyk = true }
        #expect(Fixture.header(cmyk).interpretation == "cmyk")
        let stored = try processor.normalized(cmyk, keeping: .jpeg)
        #expect(Fixture.header(stored.bytes).interpretation == "srgb")
        for variant in try processor.make([.thumbnail, .gallery], format: .jpeg, from: cmyk) {
            #expect(Fixture.header(variant.bytes).interpretation == "srgb")
        }
        // The colours survive: the palette of the CMYK copy is close to the sRGB one.
        let original = try processor.palettePixels(from: Fixture.jpeg)
        let converted = try processor.palettePixels(from: cmyk)
        let difference = Self.meanDifference(original.bytes, converted.bytes)
        #expect(difference < 25, "mean channel difference \(difference)")
    }

    /// Mean absolute difference per channel of two pixel buffers.
    static func meanDifference(_ a: [UInt8], _ b: [UInt8]) -> Int {
        var total = 0
        for (x, y) in zip(a, b) { total += abs(Int(x) - Int(y)) }
        return total / max(1, min(a.count, b.count))
    }

    /// Heavy libvips work runs off the cooperative pool (see ``offThePool(_:)``).
    func offloaded<T: Sendable>(_ work: @escaping @Sendable (ImageProcessor) throws -> T) async throws -> T {
        let processor = self.processor
        return try await offThePool { try work(processor) }
    }

    enum Shape: String, CaseIterable {
        case largeLandscape, landscape, portrait, panorama, tower, tiny
        var size: (width: Int, height: Int) {
            switch self {
            case .largeLandscape: (3200, 2400) // shrinks by 4 on load for the gallery
            case .landscape: (1200, 800)
            case .portrait: (1500, 2000)
            case .panorama: (3200, 400) // its thumbnail needs more height than the gallery has
            case .tower: (400, 3200)
            case .tiny: (120, 90)
            }
        }
    }

    /// What the variants of one photo came out as, made together and each alone.
    struct Compared: Sendable {
        var together: [Images.Variant: (width: Int, height: Int)] = [:]
        var alone: [Images.Variant: (width: Int, height: Int)] = [:]
        var difference: [Images.Variant: Int] = [:]
        var sharedPixels = (width: 0, height: 0), ownPixels = (width: 0, height: 0)
        var pixelDifference = 0
    }

    /// Made together (one decode, each variant from the one before it) or each alone, a
    /// variant has the same size and the same pixels, whatever the photo's shape.
    @Test(arguments: Shape.allCases)
    func variantsFromOneDecodeMatchVariantsMadeAlone(shape: Shape) async throws {
        let (width, height) = shape.size
        let result = try await offloaded { processor in
            let bytes = Fixture.image {
                $0.width = width
                $0.height = height
            }
            var result = Compared()
            for made in try processor.make([.thumbnail, .gallery, .small], format: .jpeg, from: bytes) {
                let alone = try processor.make([made.variant], format: .jpeg, from: bytes)[0]
                result.together[made.variant] = (made.width, made.height)
                result.alone[made.variant] = (alone.width, alone.height)
                let a = try processor.decode(made.bytes).rgbPixels(), b = try processor.decode(alone.bytes).rgbPixels()
                result.difference[made.variant] = Self.meanDifference(a.pixels, b.pixels)
            }
            // The small image palettes use: from the shared decode and from its own.
            let shared = try processor.makeWithPalettePixels(format: .jpeg, from: bytes).pixels
            let own = try processor.palettePixels(from: bytes)
            result.sharedPixels = (shared.width, shared.height)
            result.ownPixels = (own.width, own.height)
            result.pixelDifference = Self.meanDifference(shared.bytes, own.bytes)
            return result
        }
        #expect(Set(result.together.keys) == [.thumbnail, .gallery, .small])
        for (variant, size) in result.together {
            #expect(size == result.alone[variant]!, "\(shape) \(variant)")
            #expect(result.difference[variant]! <= 3, "\(shape) \(variant): the cascade keeps the picture")
        }
        #expect(result.together[.thumbnail]! == (min(150, width), min(150, height)), "\(shape): a thumbnail fills 150x150, cropped")
        let gallery = min(1, 800 / Double(width), 600 / Double(height))
        #expect(result.together[.gallery]! == (Int((Double(width) * gallery).rounded()), Int((Double(height) * gallery).rounded())), "\(shape)")
        #expect(result.sharedPixels == result.ownPixels)
        #expect(result.pixelDifference <= 2, "\(shape)")
    }

    /// Stored originals are JPEG or WebP: both shrink while decoding, to the same sizes.
    @Test func jpegAndWebPShrinkOnLoadAlike() async throws {
        struct Result: Sendable {
            var decoded: [String] = []
            var variants: [[String]] = []
            var pixelDifference = 0
        }
        let result = try await offloaded { processor in
            var result = Result()
            var pixels: [ImageProcessor.Pixels] = []
            for format in [canopy_format(0), canopy_format(1)] {
                let bytes = Fixture.image {
                    $0.width = 2401
                    $0.height = 1600
                    $0.format = format
                }
                for shrink in [1, 2, 4, 8] {
                    let decoded = try processor.decode(bytes, shrink: shrink)
                    let expected = (Int((2401.0 / Double(shrink)).rounded(.up)), 1600 / shrink)
                    let close = abs(decoded.width - expected.0) <= 1 && abs(decoded.height - expected.1) <= 1
                    result.decoded.append("\(format.rawValue) shrink \(shrink): \(close ? "as expected" : "\(decoded.width)x\(decoded.height)")")
                }
                result.variants.append(
                    try processor.make([.gallery, .small, .thumbnail], format: .jpeg, from: bytes).map { "\($0.variant) \($0.width)x\($0.height)" })
                pixels.append(try processor.palettePixels(from: bytes))
            }
            result.pixelDifference = Self.meanDifference(pixels[0].bytes, pixels[1].bytes)
            return result
        }
        #expect(result.decoded.allSatisfy { $0.hasSuffix("as expected") }, "\(result.decoded)")
        #expect(result.variants[0] == result.variants[1], "JPEG and WebP give the same variants")
        #expect(result.pixelDifference <= 4)
    }

    @Test func shrinkOnLoadKeepsAtLeastThePixelsAVariantNeeds() {
        #expect(ImageProcessor.shrinkOnLoad(for: 0.1) == 8)
        #expect(ImageProcessor.shrinkOnLoad(for: 0.125) == 8)
        #expect(ImageProcessor.shrinkOnLoad(for: 0.2) == 4) // 800 px of 4000
        #expect(ImageProcessor.shrinkOnLoad(for: 0.3) == 2)
        #expect(ImageProcessor.shrinkOnLoad(for: 0.5) == 2)
        #expect(ImageProcessor.shrinkOnLoad(for: 0.51) == 1)
        #expect(ImageProcessor.shrinkOnLoad(for: 1) == 1)
    }

    @Test func theStoredOriginalIsTheFullVariant() throws {
        let input = Fixture.image { $0.gps = true }
        let stored = try processor.normalized(input, keeping: .jpeg)
        let full = try processor.make([.full], format: .jpeg, from: input)[0]
        #expect((stored.width, stored.height) == (full.width, full.height))
        let a = try processor.decode(stored.bytes).rgbPixels(), b = try processor.decode(full.bytes).rgbPixels()
        #expect(Self.meanDifference(a.pixels, b.pixels) <= 1, "same quality, same pixels")
    }

    @Test func truncatedFilesAreRefused() throws {
        let jpeg = Fixture.jpeg
        let cut = Array(jpeg.prefix(jpeg.count / 2))
        #expect(throws: CanopyError.self) { _ = try processor.normalized(cut, keeping: .jpeg) }
        #expect(throws: CanopyError.self) { _ = try processor.make([.thumbnail], format: .jpeg, from: cut) }
    }

    @Test func aHeaderClaimingFourHundredMegapixelsIsRefusedBeforeDecoding() throws {
        let bomb = Fixture.pngClaiming(width: 20_000, height: 20_000)
        #expect(bomb.count < 100)
        let error = #expect(throws: CanopyError.self) { _ = try processor.inspect(bomb) }
        #expect(error?.code == .tooLarge)
        #expect(error?.message.contains("20000x20000") == true)
    }

    @Test func otherFormatsAreRefusedByTheirFirstBytes() throws {
        let svg = Array(#"<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>"#.utf8)
        let gif = Array("GIF89a".utf8) + [UInt8](repeating: 0, count: 20)
        let pdf = Array("%PDF-1.7\n".utf8)
        let tiff: [UInt8] = [0x49, 0x49, 0x2A, 0x00, 8, 0, 0, 0]
        for bytes in [svg, gif, pdf, tiff, []] {
            let error = #expect(throws: CanopyError.self) { _ = try processor.inspect(bytes) }
            #expect(error?.code == .badRequest)
        }
    }

    @Test func blockedLoadersCannotBeReachedEvenWhenAskedDirectly() {
        // A PNG-looking file is handed to libvips; an SVG is not decodable at all.
        let svg = Array(#"<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>"#.utf8)
        #expect(throws: CanopyError.self) { _ = try processor.decode(svg) }
    }

    @Test func filesOverTheSizeLimitAreRefused() throws {
        let small = try ImageProcessor(limits: .init(maximumBytes: 1_000, maximumPixels: 40_000_000))
        let error = #expect(throws: CanopyError.self) { _ = try small.inspect(Fixture.jpeg) }
        #expect(error?.code == .tooLarge)
    }
}
