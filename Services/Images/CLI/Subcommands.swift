import ArgumentParser
import CanopyBus
import CanopyImages
import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation

/// `canopy-images serve`: the image service as a bus worker.
struct ServeImages: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Serve images.* on the bus until SIGTERM or SIGINT.",
        discussion: "Example: canopy-images serve --endpoint tcp://127.0.0.1:5555 --data-dir ./.canopy --memory-mb 50 --disk-mb 100")

    @OptionGroup var serve: ServeOptions<CanopyImages>
    @OptionGroup var database: DatabaseOptions
    @Option(
        help: ArgumentHelp(
            "With --database-url: where originals are kept, a directory every replica mounts (a shared volume); default <data-dir>/images/originals. Env: CANOPY_ORIGINALS_DIR.",
            valueName: "dir"))
    var originalsDir: String? = Environment.string("CANOPY_ORIGINALS_DIR")
    @Option(help: ArgumentHelp("Largest input in MiB. Env: CANOPY_IMAGES_MAX_MB.", valueName: "MiB"))
    var maxMb: Int = Environment.int("CANOPY_IMAGES_MAX_MB", default: ImageServiceSettings.defaultMaximumInputBytes / (1024 * 1024))
    @Option(help: ArgumentHelp("Largest input in megapixels (as its header claims). Env: CANOPY_IMAGES_MAX_MEGAPIXELS.", valueName: "MP"))
    var maxMegapixels: Int = Environment.int("CANOPY_IMAGES_MAX_MEGAPIXELS", default: 40)
    @Option(help: ArgumentHelp("Memory tier size in MiB. Env: CANOPY_IMAGES_MEMORY_MB.", valueName: "MiB"))
    var memoryMb: Int = Environment.int("CANOPY_IMAGES_MEMORY_MB", default: 50)
    @Option(help: ArgumentHelp("Memory tier entries. Env: CANOPY_IMAGES_MEMORY_COUNT.", valueName: "count"))
    var memoryCount: Int = Environment.int("CANOPY_IMAGES_MEMORY_COUNT", default: 5_000)
    @Option(help: ArgumentHelp("Disk tier size in MiB. Env: CANOPY_IMAGES_DISK_MB.", valueName: "MiB"))
    var diskMb: Int = Environment.int("CANOPY_IMAGES_DISK_MB", default: 100)
    @Option(help: ArgumentHelp("Days a cached variant lives. Env: CANOPY_IMAGES_VARIANT_DAYS.", valueName: "days"))
    var variantDays: Int = Environment.int("CANOPY_IMAGES_VARIANT_DAYS", default: 7)
    @Option(help: ArgumentHelp("Days a palette lives. Env: CANOPY_IMAGES_PALETTE_DAYS.", valueName: "days"))
    var paletteDays: Int = Environment.int("CANOPY_IMAGES_PALETTE_DAYS", default: 30)
    @Option(help: ArgumentHelp("Remote fetches per origin host at once. Env: CANOPY_IMAGES_FETCHES_PER_HOST.", valueName: "count"))
    var fetchesPerHost: Int = Environment.int("CANOPY_IMAGES_FETCHES_PER_HOST", default: 3)
    @Option(
        help: ArgumentHelp(
            "Hosts images.fetch may reach on loopback or private addresses, comma-separated. Env: CANOPY_IMAGES_FETCH_ALLOW.", valueName: "hosts"))
    var fetchAllow: String = Environment.string("CANOPY_IMAGES_FETCH_ALLOW") ?? ""
    @Option(
        help: ArgumentHelp(
            "Full-size decodes at once (uploads, full variants in another format); each holds a whole photo. Env: CANOPY_IMAGES_FULL_SIZE_CONCURRENCY.",
            valueName: "count"))
    var fullSizeConcurrency: Int = Environment.int("CANOPY_IMAGES_FULL_SIZE_CONCURRENCY", default: 2)
    @Option(help: ArgumentHelp("Resident-size budget in MiB that memory pressure is judged against. Env: CANOPY_IMAGES_BUDGET_MB.", valueName: "MiB"))
    var budgetMb: Int = Environment.int("CANOPY_IMAGES_BUDGET_MB", default: 512)

    func validate() throws {
        try Environment.validate()
        guard maxMb >= 1, maxMegapixels >= 1 else { throw ValidationError("--max-mb and --max-megapixels must be at least 1") }
        guard memoryMb >= 0, diskMb >= 0, memoryCount >= 0 else { throw ValidationError("cache sizes cannot be negative; 0 turns a tier off") }
        guard variantDays >= 1, paletteDays >= 1 else { throw ValidationError("--variant-days and --palette-days must be at least 1") }
        guard budgetMb >= 64 else { throw ValidationError("--budget-mb must be at least 64") }
        guard fetchesPerHost >= 1 else { throw ValidationError("--fetches-per-host must be at least 1") }
        guard fullSizeConcurrency >= 1 else { throw ValidationError("--full-size-concurrency must be at least 1") }
    }

    func run() async throws {
        ImageTools.capMallocArenas()
        let logger = serve.logger()
        var settings = ImageServiceSettings(directory: serve.directory, runner: try serve.runner(), metrics: try serve.metrics())
        settings.postgres = try database.postgres(serving: true)
        settings.originals = originalsDir.map { URL(fileURLWithPath: $0, isDirectory: true) }
        settings.maximumInputBytes = maxMb * 1024 * 1024
        settings.maximumPixels = maxMegapixels * 1_000_000
        settings.memoryTierBytes = memoryMb * 1024 * 1024
        settings.memoryTierCount = memoryCount
        settings.diskTierBytes = diskMb * 1024 * 1024
        settings.variantMaximumAge = TimeInterval(variantDays * 86_400)
        settings.paletteMaximumAge = TimeInterval(paletteDays * 86_400)
        settings.memoryBudget = budgetMb * 1024 * 1024
        settings.fetchesPerHost = fetchesPerHost
        settings.fullSizeConcurrency = fullSizeConcurrency
        settings.fetchAllowedHosts = Set(fetchAllow.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).lowercased() }.filter { !$0.isEmpty })
        settings.clock = serve.worker.serviceClock
        let context = serve.common.busContext()
        guard
            let services = try await buildUnlessStopped(
                logger: logger,
                { [settings] in
                    try await buildImageService(settings: settings, context: context, logger: logger)
                })
        else { return }
        try await runUntilShutdown(services, traces: serve.traces, logger: logger)
    }
}

/// `canopy-images thumbnail IN -o OUT`: one thumbnail, made as the service makes them.
struct Thumbnail: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Make a thumbnail (or another variant) of an image file.",
        discussion: "Example: canopy-images thumbnail monstera.jpg -o thumb.webp --size 150 --format webp")

    @Argument(help: "The image file (JPEG, PNG, WebP or HEIF).") var input: String
    @Option(name: .shortAndLong, help: "Where to write the result.") var output: String
    @Option(help: "Edge of the square thumbnail in pixels.") var size: Int = 150
    @Option(help: "thumbnail, gallery, small or full.") var variant: String = "thumbnail"
    @Option(help: "jpeg or webp.") var format: String = "jpeg"

    func validate() throws {
        guard Images.Variant(rawValue: variant) != nil else { throw ValidationError("--variant is thumbnail, gallery, small or full") }
        guard Images.Format(rawValue: format) != nil else { throw ValidationError("--format is jpeg or webp") }
    }

    func run() async throws {
        let bytes = try readImage(input)
        do {
            let made = try ImageTools.variant(bytes, Images.Variant(rawValue: variant)!, format: Images.Format(rawValue: format)!, size: size)
            try Data(made.bytes).write(to: URL(fileURLWithPath: output))
            print("\(output): \(made.width)x\(made.height), \(made.bytes.count) bytes, metadata stripped")
        } catch let error as CanopyError {
            throw CommandFailure("\(input): \(error.message)")
        }
    }
}

/// `canopy-images palette IN`: the swatches as a table.
struct PaletteCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "palette",
        abstract: "Print an image file's dominant colours by role.",
        discussion: "Example: canopy-images palette monstera.jpg")

    @Argument(help: "The image file (JPEG, PNG, WebP or HEIF).") var input: String

    func run() async throws {
        let bytes = try readImage(input)
        do {
            let swatches = try ImageTools.palette(bytes)
            var table = Table("ROLE", "COLOUR", "SHARE", "OKLAB L", "A", "B")
            for swatch in swatches {
                table.append([
                    swatch.role, swatch.hex, String(format: "%.1f%%", swatch.population * 100),
                    String(format: "%.3f", swatch.oklab[0]), String(format: "%.3f", swatch.oklab[1]), String(format: "%.3f", swatch.oklab[2]),
                ])
            }
            print(table.render())
        } catch let error as CanopyError {
            throw CommandFailure("\(input): \(error.message)")
        }
    }
}

/// `canopy-images stats`: the running service's caches, over the bus.
struct StatsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stats",
        abstract: "Print the cache tiers and the store of the running service.",
        discussion: "Example: canopy-images stats --endpoint tcp://127.0.0.1:5555")

    @OptionGroup var common: CommonOptions

    func run() async throws {
        let logger = LogSetup.logger(label: "canopy-images", level: .error)
        let bus = try BusClient(configuration: try common.clientConfiguration(), context: ZMQContext(), logger: logger)
        defer { bus.close() }
        let stats: Images.Stats.Reply
        do {
            stats = try await bus.call(Images.Stats.self, .init(), timeout: .seconds(15))
        } catch let error as CanopyError {
            throw CommandFailure("\(error.message). Is canopy-images serving at \(common.endpoint)?")
        }
        var table = Table("TIER", "ENTRIES", "MiB", "LIMIT MiB", "HITS", "MISSES", "HIT RATIO", "EVICTIONS")
        for (name, tier) in [("memory", stats.memory), ("disk", stats.disk)] {
            table.append([
                name, "\(tier.entries)", String(format: "%.1f", Double(tier.bytes) / 1_048_576), "\(tier.limitBytes / 1_048_576)",
                "\(tier.hits)", "\(tier.misses)", String(format: "%.2f", tier.hitRatio), "\(tier.evictions)",
            ])
        }
        print(table.render())
        print(
            "originals: \(stats.originals) (\(String(format: "%.1f", Double(stats.originalBytes) / 1_048_576)) MiB), palettes: \(stats.palettes), memory pressure: \(stats.memoryPressure)"
        )
    }
}

func readImage(_ path: String) throws -> [UInt8] {
    guard let data = FileManager.default.contents(atPath: path) else {
        throw CommandFailure("cannot read \(path); check the path")
    }
    return [UInt8](data)
}
