import ArgumentParser
import CVips
import CanopyBroker
import CanopyBus
import CanopyImages
import CanopyImaging
import CanopyMessages
import CanopyServiceKit
import Foundation
import Histogram
import Logging

/// canopy-images: variant making against `vipsthumbnail`, cache hits over the bus against a
/// bus round trip, and peak resident memory under concurrent 12-megapixel requests.
struct ImagesBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "images",
        abstract: "Variant generation against vipsthumbnail, cache-hit latency over the bus, peak memory.",
        discussion: "Needs vipsthumbnail (Debian libvips-tools). Example: canopy-bench images --photos 12 --hits 2000")

    @Option(help: "12-megapixel photos per timing run.") var photos = 12
    @Option(help: "Cache hits timed per tier.") var hits = 2_000
    @Option(help: "Concurrent requests for the memory measurement.") var concurrent = 16

    /// What the test photos look like.
    enum Content: String, CaseIterable, ExpressibleByArgument {
        /// Texture and sensor noise over colour: about 2.5 MB at quality 90, as a phone's 12 MP photo.
        case photo
        /// A smooth colour sweep: about 0.6 MB, the easiest case for the decoder.
        case smooth
    }

    @Option(help: "Test photos: photo (photo-like, ~2.5 MB), smooth (a colour sweep, ~0.6 MB); repeat for both.")
    var content: [Content] = [.photo, .smooth]

    func run() async throws {
        guard let vipsthumbnail = which("vipsthumbnail") else {
            throw CommandFailure("vipsthumbnail is not installed; apt-get install libvips-tools, then run again")
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-images-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        print("canopy-bench images: 4000x3000 JPEGs at quality 90, libvips \(String(cString: canopy_vips_version()))")
        var photoLike: [[UInt8]] = []
        for kind in content {
            progress("making \(photos) 12-megapixel \(kind.rawValue) JPEGs…\n")
            let images = try twelveMegapixelJPEGs(kind)
            if kind == .photo || photoLike.isEmpty { photoLike = images }
            try variantTimes(images, kind: kind, directory: directory.appendingPathComponent(kind.rawValue), vipsthumbnail: vipsthumbnail)
        }
        try await cacheHits(photoLike[0], directory: directory)
        try await peakMemory(photoLike, directory: directory)
    }

    // MARK: - (1) Variants against vipsthumbnail

    private func variantTimes(_ images: [[UInt8]], kind: Content, directory: URL, vipsthumbnail: String) throws {
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let files = try images.enumerated().map { index, bytes in
            let url = directory.appendingPathComponent("photo\(index).jpg")
            try Data(bytes).write(to: url)
            return url.path
        }
        // What canopy-images stores: the normalized originals (they are the full variant).
        let stored = try images.enumerated().map { index, bytes in
            let url = directory.appendingPathComponent("stored\(index).jpg")
            try Data(try ImageTools.normalized(bytes)).write(to: url)
            return url
        }
        // Warm both sides up once.
        _ = try ImageTools.variant(images[0], .thumbnail, format: .jpeg)
        try runProcess(vipsthumbnail, [files[0], "--size", "150x150", "--smartcrop", "centre", "-o", "\(directory.path)/%s_t.jpg[Q=70,strip]"])

        progress("timing vipsthumbnail and canopy-images…\n")
        var best: [String: Double] = [:]
        let sample = Array(images.prefix(3)), scale = Double(images.count) / Double(sample.count)
        for _ in 0..<3 {
            var round: [String: Double] = [:]
            round["vips"] = try time {
                try runProcess(vipsthumbnail, files + ["--size", "150x150", "--smartcrop", "centre", "-o", "\(directory.path)/%s_t.jpg[Q=70,strip]"])
            }
            round["thumbnail"] = try time { for image in images { _ = try ImageTools.variant(image, .thumbnail, format: .jpeg) } }
            round["gallery"] = try time { for image in images { _ = try ImageTools.variant(image, .gallery, format: .jpeg) } }
            round["three"] = try time { for image in images { _ = try ImageTools.variants(image, [.thumbnail, .gallery, .small]) } }
            round["separately"] = try time {
                for image in images {
                    for variant in [Images.Variant.thumbnail, .gallery, .small] { _ = try ImageTools.variant(image, variant, format: .jpeg) }
                }
            }
            round["original"] = try time { for url in stored { _ = try Data(contentsOf: url) } }
            round["four"] = try time { for image in sample { _ = try ImageTools.variants(image, Set(Images.Variant.allCases)) } } * scale
            round["full"] = try time { for image in sample { _ = try ImageTools.variant(image, .full, format: .jpeg) } } * scale
            round["normalize"] = try time { for image in sample { _ = try ImageTools.normalized(image) } } * scale
            for (name, seconds) in round { best[name] = min(best[name] ?? .infinity, seconds / Double(images.count)) }
        }
        let vips = best["vips"]!, thumbnail = best["thumbnail"]!
        best["three+original"] = best["three"]! + best["original"]!
        var rows = [["what", "ms per photo", "vs vipsthumbnail", "vs canopy thumbnail"]]
        func row(_ label: String, _ key: String) {
            rows.append([
                label, String(format: "%.1f", best[key]! * 1000), String(format: "%.2f", best[key]! / vips), String(format: "%.2f", best[key]! / thumbnail),
            ])
        }
        row("vipsthumbnail 150x150 centre crop, Q70 (one process, all photos)", "vips")
        row("canopy-images thumbnail", "thumbnail")
        row("canopy-images gallery alone (800x600)", "gallery")
        row("thumbnail + gallery + small, one decode", "three")
        row("thumbnail + gallery + small, a decode each", "separately")
        row("full: reading the stored original", "original")
        row("all four: the three above + full from the stored original", "three+original")
        row("all four from one full-size decode (not used)", "four")
        row("full from a full-size decode (not used)", "full")
        row("upload: normalizing (full decode, Q90 encode), once", "normalize")
        let kibibytes = images.map(\.count).reduce(0, +) / images.count / 1024
        let described = kind == .photo ? "photo-like JPEGs (texture and noise)" : "smooth JPEGs (a colour sweep)"
        print("\n(1) variant generation, \(described), \(kibibytes) KiB each, best of 3 runs over \(images.count) photos")
        printTable(rows)
        print(
            String(
                format:
                    "thumbnail vs vipsthumbnail: %.2f (target at most 1.2); all four variants vs one thumbnail: %.2f (target at most 1.5); the three small ones from one decode vs a decode each: %.2f",
                thumbnail / vips, best["three+original"]! / thumbnail, best["three"]! / best["separately"]!))
    }

    // MARK: - (2) Cache hits over the bus

    private func cacheHits(_ image: [UInt8], directory: URL) async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        var rows = [["request", "p50 µs", "p99 µs", "p99 vs round trip"]]
        var baseline: UInt64 = 1
        var paletteComputed = Duration.zero
        for (tier, memoryBytes) in [("memory", 50 * 1024 * 1024), ("disk", 0)] {
            let stack = try await BenchStack(logger: logger) { endpoint, context in
                var settings = ImageServiceSettings(directory: directory.appendingPathComponent("service-\(tier)"), runner: .init(endpoint: endpoint))
                settings.memoryTierBytes = memoryBytes
                settings.memoryTierCount = memoryBytes == 0 ? 0 : 5_000
                return try await buildImageService(settings: settings, context: context, logger: logger)
            }
            let client = stack.client
            let photo = try await client.call(Images.Put.self, .init(plantID: "bench", data: Data(image)), principal: "bench")
            let request = Images.GetVariant.Request(sha256: photo.sha256, variant: .thumbnail)
            _ = try await client.call(Images.GetVariant.self, request, principal: "bench") // made and cached
            progress("  timing \(hits) \(tier)-tier hits…\n")
            if tier == "memory" {
                let roundTrip = try await measure(hits) { _ = try await client.call(Images.Stats.self, .init()) }
                baseline = roundTrip.valueAtPercentile(99)
                rows.append(["images.stats (bus round trip, baseline)", "\(roundTrip.valueAtPercentile(50))", "\(baseline)", "1.00"])
            }
            var sources: Set<String> = []
            let histogram = try await measure(hits) {
                sources.insert(try await client.call(Images.GetVariant.self, request, principal: "bench").source)
            }
            precondition(sources == [tier], "expected \(tier) hits, saw \(sources)")
            rows.append([
                "images.variant thumbnail, \(tier) hit", "\(histogram.valueAtPercentile(50))", "\(histogram.valueAtPercentile(99))",
                String(format: "%.2f", Double(histogram.valueAtPercentile(99)) / Double(baseline)),
            ])
            if tier == "memory" {
                // A palette: computed once (a 400 px decode and the multi-scale histogram), then cached.
                let computing = ContinuousClock.now
                let computed = try await client.call(Images.Palette.self, .init(sha256: photo.sha256), principal: "bench")
                precondition(!computed.cached, "expected the first palette to be computed")
                paletteComputed = ContinuousClock.now - computing
                var allCached = true
                let palettes = try await measure(hits) {
                    let cached = try await client.call(Images.Palette.self, .init(sha256: photo.sha256), principal: "bench").cached
                    allCached = allCached && cached
                }
                precondition(allCached, "expected every palette from the cache")
                rows.append([
                    "images.palette, cached", "\(palettes.valueAtPercentile(50))", "\(palettes.valueAtPercentile(99))",
                    String(format: "%.2f", Double(palettes.valueAtPercentile(99)) / Double(baseline)),
                ])
            }
            await stack.shutdown()
        }
        print("\n(2) cache hits end to end over the bus (client to broker to canopy-images and back), \(hits) each")
        printTable(rows)
        print("targets: memory-tier p99 under 1,000 µs; disk-tier p99 under 20,000 µs; the palette was computed once in \(paletteComputed.microseconds) µs")
    }

    private func measure(_ count: Int, _ body: () async throws -> Void) async throws -> Histogram<UInt64> {
        var histogram = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
        for _ in 0..<count {
            let start = ContinuousClock.now
            try await body()
            _ = histogram.record(UInt64((ContinuousClock.now - start).microseconds))
        }
        return histogram
    }

    // MARK: - (3) Peak memory

    private func peakMemory(_ images: [[UInt8]], directory: URL) async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        let context = ZMQContext()
        var brokerConfiguration = BrokerConfiguration()
        brokerConfiguration.maximumFrameBytes = 64 * 1024 * 1024
        let broker = try BrokerServer(endpoint: "tcp://127.0.0.1:*", configuration: brokerConfiguration, context: context, logger: logger)
        let brokerTask = Task { try await broker.run() }
        let service = Process()
        service.executableURL = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("canopy-images")
        service.arguments = ["serve", "--endpoint", broker.endpoint, "--data-dir", directory.appendingPathComponent("peak").path, "--log-level", "error"]
        try service.run()
        defer {
            service.terminate()
            service.waitUntilExit()
            broker.stop()
        }
        var clientConfiguration = BusClient.Configuration(endpoint: broker.endpoint)
        clientConfiguration.defaultTimeout = .seconds(120)
        let client = try BusClient(configuration: clientConfiguration, context: context, logger: logger)
        defer { client.close() }
        while (try? await client.call(Images.Stats.self, .init(), timeout: .seconds(1))) == nil { try await Task.sleep(for: .milliseconds(100)) }
        let idle = processMemoryKiB(service.processIdentifier)
        var rows = [
            ["moment", "seconds", "resident MiB", "peak so far MiB"],
            ["idle after start (baseline)", "", String(format: "%.0f", Double(idle.rss) / 1024), String(format: "%.0f", Double(idle.peak) / 1024)],
        ]
        func row(_ label: String, since start: ContinuousClock.Instant) {
            let now = processMemoryKiB(service.processIdentifier), elapsed = ContinuousClock.now - start
            rows.append([
                label, String(format: "%.2f", elapsed.seconds),
                String(format: "%.0f", Double(now.rss) / 1024), String(format: "%.0f", Double(now.peak) / 1024),
            ])
        }
        let sources = (0..<concurrent).map { index in images[index % images.count] + Array("\(index)".utf8) } // distinct photos
        progress("  \(concurrent) concurrent uploads of 12-megapixel photos…\n")
        let uploading = ContinuousClock.now
        let photos = try await withThrowingTaskGroup(of: Images.Photo.self) { group in
            for (index, bytes) in sources.enumerated() {
                group.addTask { try await client.call(Images.Put.self, .init(plantID: "p\(index)", data: Data(bytes)), principal: "bench") }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        row("\(concurrent) concurrent 12 MP uploads", since: uploading)
        progress("  \(concurrent) concurrent gallery, full and full WebP variants…\n")
        // Full in WebP needs a full-size decode and encode: the heaviest request there is.
        for (variant, format) in [(Images.Variant.gallery, Images.Format.jpeg), (.full, .jpeg), (.full, .webp)] {
            let start = ContinuousClock.now
            try await withThrowingTaskGroup(of: Void.self) { group in
                for photo in photos {
                    group.addTask {
                        _ = try await client.call(Images.GetVariant.self, .init(sha256: photo.sha256, variant: variant, format: format), principal: "bench")
                    }
                }
                try await group.waitForAll()
            }
            row("\(concurrent) concurrent \(variant.rawValue) \(format.rawValue)", since: start)
        }
        let end = processMemoryKiB(service.processIdentifier)
        let fullSize = ProcessInfo.processInfo.environment["CANOPY_IMAGES_FULL_SIZE_CONCURRENCY"] ?? "default"
        print("\n(3) canopy-images resident memory (its own process, default options: credit 8, memory tier 50 MiB; full-size concurrency \(fullSize))")
        printTable(rows)
        print(
            String(
                format: "peak %.0f MiB (target under 300 MB = 286 MiB), %.1fx the idle process", Double(end.peak) / 1024,
                Double(end.peak) / Double(max(1, idle.rss))))
        _ = brokerTask
    }

    // MARK: - Helpers

    private func twelveMegapixelJPEGs(_ kind: Content) throws -> [[UInt8]] {
        try makeTwelveMegapixelJPEGs(kind, count: photos)
    }

    private func time(_ work: () throws -> Void) rethrows -> Double {
        let start = ContinuousClock.now
        try work()
        let elapsed = ContinuousClock.now - start
        return elapsed.seconds
    }

    private func runProcess(_ path: String, _ arguments: [String]) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        try process.run()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { throw CommandFailure("\(path) failed with status \(process.terminationStatus)") }
    }

}

/// `count` distinct 4000x3000 JPEGs at quality 90, made by libvips: photo-like (texture and
/// noise, about 2.5 MB) or a smooth sweep (about 0.6 MB).
func makeTwelveMegapixelJPEGs(_ kind: ImagesBenchmark.Content, count: Int) throws -> [[UInt8]] {
    _ = canopy_vips_start()
    let texture = kind == .photo ? canopy_vips_texture(4000, 3000) : nil
    defer { canopy_vips_release(texture) }
    return try (0..<count).map { seed in
        // Distinct photos: the smooth ones differ in width, the photo-like ones in texture.
        guard let image = kind == .photo ? canopy_vips_photo(texture, Int32(seed)) : canopy_vips_pattern(4000 + Int32(seed), 3000) else {
            throw CommandFailure("libvips could not make a test photo")
        }
        defer { canopy_vips_release(image) }
        var bytes: UnsafeMutableRawPointer?
        var length = 0
        guard canopy_vips_encode(image, CANOPY_JPEG, 90, &bytes, &length) == 0 else { throw CommandFailure("encoding a test photo failed") }
        defer { canopy_vips_free(bytes) }
        return Array(UnsafeRawBufferPointer(start: bytes, count: length))
    }
}
