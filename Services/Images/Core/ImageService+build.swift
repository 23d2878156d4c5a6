import CVips
import CanopyBus
import CanopyImaging
import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation
import Logging
import ServiceLifecycle

/// Everything `canopy-images serve` can be told.
public struct ImageServiceSettings: Sendable {
    /// Where originals, the disk tier and the index live (`<data-dir>/images`).
    public var directory: URL
    /// How the worker reaches its broker (endpoint, credit, heartbeats, CURVE keys).
    public var runner: ServiceRunner.Configuration
    /// Where `/metrics` and `/health` listen; `nil` for nowhere.
    public var metrics: ListenAddress?
    public var maximumInputBytes = ImageServiceSettings.defaultMaximumInputBytes
    /// The time the service goes by (`--clock`).
    public var clock: ServiceClock = .system
    /// The largest input by default (25 MiB).
    public static let defaultMaximumInputBytes = ImageProcessor.Limits.defaultMaximumBytes
    public var maximumPixels = 40_000_000
    public var memoryTierBytes = 50 * 1024 * 1024
    public var memoryTierCount = 5_000
    public var diskTierBytes = 100 * 1024 * 1024
    public var variantMaximumAge: TimeInterval = 7 * 24 * 3600
    public var paletteMaximumAge: TimeInterval = 30 * 24 * 3600
    /// Resident size the process should stay under; memory pressure is judged against it.
    public var memoryBudget = 512 * 1024 * 1024
    /// How often memory pressure is read.
    public var pressureInterval: Duration = .seconds(1)
    public var warmConcurrency = 4
    /// Full-size decodes at once (uploads, full variants in another format).
    public var fullSizeConcurrency = 2
    /// Remote fetches per origin host at once.
    public var fetchesPerHost = 3
    /// Hosts remote fetches may reach even on loopback or private addresses.
    public var fetchAllowedHosts: Set<String> = []
    /// The PostgreSQL every replica shares for the index (`--database-url`), or nil for
    /// SQLite in ``directory``.
    public var postgres: PostgresSettings?
    /// Where originals are kept with PostgreSQL (`--originals-dir`): a directory every replica
    /// mounts; `<directory>/originals` when nil.
    public var originals: URL?

    /// Defaults, with the store in `directory`.
    ///
    /// - Parameters:
    ///   - directory: the store's directory.
    ///   - runner: the worker's bus settings.
    ///   - metrics: where `/metrics` and `/health` listen, `nil` for nowhere.
    public init(directory: URL, runner: ServiceRunner.Configuration, metrics: ListenAddress? = nil) {
        self.directory = directory
        self.runner = runner
        self.metrics = metrics
    }

    var library: ImageLibrary.Configuration {
        var configuration = ImageLibrary.Configuration()
        configuration.limits = .init(maximumBytes: maximumInputBytes, maximumPixels: maximumPixels)
        configuration.cache = .init(memoryBytes: memoryTierBytes, memoryCount: memoryTierCount, diskBytes: diskTierBytes, diskMaximumAge: variantMaximumAge)
        configuration.paletteMaximumAge = paletteMaximumAge
        configuration.warmConcurrency = warmConcurrency
        configuration.fullSizeConcurrency = fullSizeConcurrency
        configuration.fetch.maximumPerHost = fetchesPerHost
        configuration.fetch.allowedHosts = fetchAllowedHosts
        return configuration
    }
}

/// Builds what `canopy-images serve` runs, in start order: the memory-pressure watch, the
/// bus worker, and the `/metrics` and `/health` listener when `settings` name one.
public func buildImageService(settings: ImageServiceSettings, context: ZMQContext, logger: Logger) async throws -> [any Service] {
    try OperatingEndpoint.ensureFree(settings.metrics) // a taken port stops it before anything opens
    return try await makeImageService(settings: settings, logger: logger)
        .assembled(runner: settings.runner, bus: nil, metrics: settings.metrics, context: context, logger: logger)
}

/// canopy-images' parts: its handlers on its store (PostgreSQL and shared originals when
/// `settings` name a database, else SQLite and originals in `settings.directory`), and the
/// monitor that sheds the memory tier under pressure; with PostgreSQL, also the watch that
/// drops originals other replicas deleted from this one's caches. It calls no other service.
public func makeImageService(settings: ImageServiceSettings, logger: Logger) async throws -> ServiceParts {
    var background: [any Service] = []
    let library: ImageLibrary
    if let postgres = settings.postgres {
        let store = try await PostgresImageStore.open(
            url: postgres.url, poolSize: postgres.poolSize,
            originals: settings.originals ?? settings.directory.appendingPathComponent("originals", isDirectory: true),
            waitingUpTo: postgres.wait, logger: logger)
        library = try ImageLibrary(store: store, directory: settings.directory, configuration: settings.library, clock: settings.clock)
        background.append(await DeletedOriginalsWatch.start(store: store, library: library))
    } else {
        library = try ImageLibrary(directory: settings.directory, configuration: settings.library, clock: settings.clock)
    }
    background.append(PressureMonitor(library: library, budget: settings.memoryBudget, interval: settings.pressureInterval, logger: logger))
    return ServiceParts(
        handlers: ImageService(library: library), background: background,
        onShutdown: (library.store as? PostgresImageStore).map { [$0.database.beginShutdown] } ?? [])
}

/// Drops from this replica's memory and disk tiers every original any replica deleted (the
/// last holder let go), as soon as PostgreSQL announces it; stops with the service group.
struct DeletedOriginalsWatch: Service {
    let listening: PostgresListening

    /// Listens (returns once PostgreSQL does) for the originals `store` deletes on any replica,
    /// and purges them from `library`'s caches.
    static func start(store: PostgresImageStore, library: ImageLibrary) async -> DeletedOriginalsWatch {
        let cache = library.cache
        return DeletedOriginalsWatch(
            listening: await store.observeDeletedOriginals { ids in
                Task { for id in ids { await cache.purge(id) } }
            })
    }

    func run() async throws {
        defer { listening.stop() }
        try? await gracefulShutdown()
    }
}

/// Reads memory pressure every interval and sheds the memory tier; reports the store's and
/// the memory's state for `/health`.
struct PressureMonitor: Service, HealthReporting {
    func healthChecks() async -> [(name: String, healthy: Bool, detail: String)] {
        let store: (String, Bool, String)
        do {
            _ = try library.store.originalTotals()
            store = ("store", true, "answering")
        } catch {
            store = ("store", false, "not answering: \(error)")
        }
        let originals: (String, Bool, String)
        do {
            try library.store.checkOriginalsWritable()
            originals = ("originals", true, "writable")
        } catch {
            originals = ("originals", false, "\(error)")
        }
        let pressure = (try? await library.statistics().memoryPressure) ?? "unknown"
        return [store, originals, ("memory", true, "pressure \(pressure)")]
    }

    let library: ImageLibrary
    let budget: Int
    let interval: Duration
    let logger: Logger

    func run() async throws {
        var last = MemoryPressure.normal
        while !Task.isCancelledOrShuttingDown {
            let level = await library.checkPressure(budget: budget)
            if level != last {
                logger.notice("images.memory.pressure", metadata: ["images.pressure": "\(level.rawValue)"])
                last = level
            }
            try? await Task.sleep(for: interval)
        }
    }
}

extension Task where Success == Never, Failure == Never {
    static var isCancelledOrShuttingDown: Bool { Task.isCancelled || Task.isShuttingDownGracefully }
}

/// One-shot image work for the CLI, with the service's own code.
public enum ImageTools {
    /// What copying originals did: copied, already there (the same bytes), and bytes copied.
    public struct OriginalsCopy: Sendable, Equatable {
        public var copied = 0
        public var present = 0
        public var bytes = 0
    }

    /// Copies the originals named `sha256s` from one originals directory to another (the
    /// shared one replicas mount), each written to a temporary name, synced and renamed, then
    /// read back and compared; one already there with the same bytes is left as it is, so a
    /// copy that stopped half-way runs again from where it was. Throws, naming the photo,
    /// when a source file is missing or a copy differs.
    public static func copyOriginals(
        _ sha256s: [String], from source: URL, to target: URL,
        progress: (_ done: Int, _ total: Int) -> Void = { _, _ in }
    ) throws -> OriginalsCopy {
        let (from, to) = (try PhotoFiles(directory: source), try PhotoFiles(directory: target))
        var result = OriginalsCopy()
        for (index, sha256) in sha256s.enumerated() {
            guard from.exists(sha256) else {
                throw CanopyError(.notFound, "the original \(sha256) that the images store counts is not in \(source.path); restore it from a backup first")
            }
            let bytes = try from.read(sha256)
            if to.exists(sha256), try to.read(sha256) == bytes {
                result.present += 1
            } else {
                try to.write(bytes, as: sha256)
                guard try to.read(sha256) == bytes else {
                    throw CanopyError(.internal, "the copy of \(sha256) in \(target.path) differs from its source; check the volume and run it again")
                }
                result.copied += 1
                result.bytes += bytes.count
            }
            progress(index + 1, sha256s.count)
        }
        return result
    }

    /// Caps glibc's malloc arenas at two for this process. glibc gives each thread that
    /// allocates its own arena, and libvips' worker threads each keep theirs full of freed
    /// image buffers: with two, the peak of concurrent decodes stays far lower. `serve` calls
    /// it first thing.
    public static func capMallocArenas() {
        _ = canopy_malloc_arenas(2)
    }

    /// A variant of an image file's bytes, checked as the service checks uploads.
    public static func variant(_ bytes: [UInt8], _ variant: Images.Variant, format: Images.Format, size: Int? = nil) throws -> (
        bytes: [UInt8], width: Int, height: Int
    ) {
        let processor = try ImageProcessor()
        _ = try processor.inspect(bytes)
        if let size, variant == .thumbnail {
            return try processor.thumbnail(bytes, size: size, format: format)
        }
        guard let made = try processor.make([variant], format: format, from: bytes).first else {
            throw CanopyError(.internal, "no variant was made")
        }
        return (made.bytes, made.width, made.height)
    }

    /// Several variants from one decode, checked as ``variant(_:_:format:size:)`` checks.
    public static func variants(_ bytes: [UInt8], _ variants: Set<Images.Variant>, format: Images.Format = .jpeg) throws -> [(
        variant: Images.Variant, bytes: [UInt8]
    )] {
        let processor = try ImageProcessor()
        _ = try processor.inspect(bytes)
        return try processor.make(variants, format: format, from: bytes).map { ($0.variant, $0.bytes) }
    }

    /// An image file's bytes as canopy-images stores them (and serves them as the full
    /// variant): upright, sRGB, no metadata, quality 90.
    public static func normalized(_ bytes: [UInt8]) throws -> [UInt8] {
        let processor = try ImageProcessor()
        return try processor.normalized(bytes, keeping: try processor.inspect(bytes).kind).bytes
    }

    /// The palette of an image file's bytes.
    public static func palette(_ bytes: [UInt8]) throws -> [Images.Swatch] {
        let processor = try ImageProcessor()
        _ = try processor.inspect(bytes)
        let image = try processor.palettePixels(from: bytes)
        return PaletteExtractor.swatches(pixels: image.bytes, width: image.width, height: image.height)
    }
}
