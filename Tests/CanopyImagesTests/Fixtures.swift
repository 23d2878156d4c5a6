import CVips
import CanopyImaging
import CanopyTesting
import Foundation

@testable import CanopyImages

/// Real images made in the tests with libvips.
enum Fixture {
    struct Options {
        var width = 1200
        var height = 800
        var format = canopy_format(0) // JPEG
        var quality = 90
        var orientation: Int?
        var gps = false
        var progressive = false
        var cmyk = false
    }

    static func image(_ configure: (inout Options) -> Void = { _ in }) -> [UInt8] {
        var options = Options()
        configure(&options)
        _ = canopy_vips_start()
        var image = canopy_vips_pattern(Int32(options.width), Int32(options.height))!
        if options.cmyk {
            let cmyk = canopy_vips_to_cmyk(image)!
            canopy_vips_release(image)
            image = cmyk
        }
        defer { canopy_vips_release(image) }
        if let orientation = options.orientation { canopy_vips_set_orientation(image, Int32(orientation)) }
        if options.gps {
            canopy_vips_set_string(image, "exif-ifd3-GPSLatitudeRef", "N")
            canopy_vips_set_string(image, "exif-ifd3-GPSLatitude", "52/1 31/1 12/1")
            canopy_vips_set_string(image, "exif-ifd0-Make", "Canopy test camera")
        }
        var bytes: UnsafeMutableRawPointer?
        var length = 0
        precondition(
            canopy_vips_encode_keeping_metadata(image, options.format, Int32(options.quality), options.progressive ? 1 : 0, &bytes, &length) == 0,
            "fixture encode failed: \(Vips.lastError())")
        defer { canopy_vips_free(bytes) }
        return Array(UnsafeRawBufferPointer(start: bytes, count: length))
    }

    /// The kinds of photo the tests run through, named (so test logs show names, not bytes).
    enum Kind: String, CaseIterable, Sendable {
        case jpeg, png, webp, heif, progressiveJPEG, rotatedJPEG, cmykJPEG, gpsJPEG

        var bytes: [UInt8] {
            switch self {
            case .jpeg: Fixture.jpeg
            case .png: Fixture.png
            case .webp: Fixture.webp
            case .heif: Fixture.image { $0.format = canopy_format(3) }
            case .progressiveJPEG: Fixture.image { $0.progressive = true }
            case .rotatedJPEG: Fixture.image { $0.orientation = 8 }
            case .cmykJPEG: Fixture.image { $0.cmyk = true }
            case .gpsJPEG: Fixture.image { $0.gps = true }
            }
        }

        /// Width and height once upright.
        var size: (Int, Int) { self == .rotatedJPEG ? (800, 1200) : (1200, 800) }
    }

    static var jpeg: [UInt8] { image() }
    static var png: [UInt8] { image { $0.format = canopy_format(2) } }
    static var webp: [UInt8] { image { $0.format = canopy_format(1) } }

    /// What libvips reads in an encoded image's header.
    struct Header {
        var width: Int
        var height: Int
        var interpretation: String
        var hasEXIF: Bool
        var hasGPS: Bool
        var hasICC: Bool
        var orientation: Bool
    }

    static func header(_ bytes: [UInt8]) -> Header {
        let image = bytes.withUnsafeBytes { canopy_vips_open($0.baseAddress, $0.count) }!
        defer { canopy_vips_release(image) }
        return Header(
            width: Int(canopy_vips_width(image)), height: Int(canopy_vips_height(image)),
            interpretation: String(cString: canopy_vips_interpretation(image)),
            hasEXIF: canopy_vips_has_field(image, "exif-data") != 0,
            hasGPS: canopy_vips_has_field(image, "exif-ifd3-GPSLatitude") != 0,
            hasICC: canopy_vips_has_field(image, "icc-profile-data") != 0,
            orientation: canopy_vips_has_field(image, "orientation") != 0)
    }

    /// A PNG whose header claims `width` x `height` pixels (``PNGClaim``).
    static func pngClaiming(width: UInt32, height: UInt32) -> [UInt8] { PNGClaim.bytes(width: width, height: height) }

    /// A fresh directory under the system's temporary directory.
    static func directory() -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-images-\(UUID().uuidString)", isDirectory: true)
        try? FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        return url
    }
}
