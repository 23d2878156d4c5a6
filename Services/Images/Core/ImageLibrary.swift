import CanopyBus
import CanopyImaging
import CanopyMessages
import CanopyServiceKit
import Foundation
import Synchronization

/// canopy-images' logic: the store, the two cache tiers and libvips, scoped to the person
/// asking. Every method takes the owner; nothing is read, listed, warmed or purged for
/// someone who does not hold the photo. Thread-safe.
final class ImageLibrary: Sendable {
    /// The time it goes by (`--clock`).
    let clock: ServiceClock
    /// Settings.
    struct Configuration: Sendable {
        var limits = ImageProcessor.Limits()
        var cache = VariantCache.Limits()
        /// How long a computed palette stays valid.
        var paletteMaximumAge: TimeInterval = 30 * 24 * 3600
        /// Photos `images.warm` works on at once.
        var warmConcurrency = 4
        /// Full-size decodes at once (uploads, full variants in another format). They are
        /// bounded apart from the small variants, which stream through little memory: a JPEG
        /// encode streams too (one slot), but a full-size WebP encode holds the whole photo
        /// several times over, 12 MP about 100 MB, and takes every slot.
        var fullSizeConcurrency = 2
        /// How remote photos are fetched.
        var fetch = RemoteFetcher.Policy()
        /// What one person may store in all: photos, and bytes of their originals (a photo
        /// kept under two plants counts twice).
        var photosPerPerson = 20_000
        var bytesPerPerson = 10 << 30
    }

    let store: any ImageStoring
    let cache: VariantCache
    let processor: ImageProcessor
    let fetcher: RemoteFetcher
    let configuration: Configuration
    private let pressure = Mutex(MemoryPressure.normal)
    private let fullSize: ConcurrencyLimiter<Int>
    /// canopy-images' metrics (refusals, work times, cache tiers).
    let metrics = ImageMetrics()

    /// Opens the store (SQLite and the originals) and the disk tier under `directory`.
    convenience init(directory: URL, configuration: Configuration = Configuration(), clock: ServiceClock = .system) throws {
        try self.init(store: SQLiteImageStore(directory: directory), directory: directory, configuration: configuration, clock: clock)
    }

    /// Serves from `store`, with this process's disk tier under `directory`.
    init(store: any ImageStoring, directory: URL, configuration: Configuration = Configuration(), clock: ServiceClock = .system) throws {
        self.clock = clock
        self.configuration = configuration
        fullSize = ConcurrencyLimiter(maximum: configuration.fullSizeConcurrency)
        processor = try ImageProcessor(limits: configuration.limits, metrics: metrics)
        var fetch = configuration.fetch
        fetch.maximumBytes = configuration.limits.maximumBytes
        fetcher = try RemoteFetcher(policy: fetch)
        self.store = store
        cache = try VariantCache(directory: directory.appendingPathComponent("variants", isDirectory: true), limits: configuration.cache)
    }

    /// Photos one plant may have (so `images.list` stays one reply).
    static let maximumPhotosPerPlant = 500

    /// A plant id as canopy-care's: 1 to 200 ASCII letters, digits, `.`, `_`, `:` or `-`.
    static func checkPlantID(_ plantID: String) throws(CanopyError) {
        try Field.identifier(plantID, "plantID", maximumBytes: Care.Limits.idBytes)
    }

    static func sha256(_ bytes: [UInt8]) -> String {
        PhotoID.of(bytes)
    }

    /// `body` on the store: in place for SQLite, from a Dispatch thread for a store whose
    /// every call is a round trip (PostgreSQL), so that no cooperative thread waits on it.
    func stored<T: Sendable>(_ body: @escaping @Sendable (any ImageStoring) throws -> T) async throws -> T {
        let store = self.store
        return store.isRemote ? try await offThePool { try body(store) } : try body(store)
    }

    private func requireOwnership(_ owner: String, _ sha256: String) async throws -> Void {
        guard sha256.count == 64, sha256.allSatisfy(\.isHexDigit) else {
            throw CanopyError(.badRequest, "'\(sha256.prefix(80))' is not a photo id (64 hexadecimal characters)")
        }
        guard try await stored({ try $0.owns(owner, sha256) }) else {
            // The same answer whether it does not exist or belongs to someone else.
            throw CanopyError(.notFound, "no photo \(sha256) among yours; images.list shows a plant's photos")
        }
    }

    // MARK: - Operations

    /// Stores a photo for `owner`'s plant: checked, normalized (auto-rotated, sRGB, every
    /// piece of metadata stripped) and content-addressed, stored once however often it comes.
    func put(_ bytes: [UInt8], owner: String, plantID: String, now: Date? = nil) async throws -> Images.Photo {
        let now = now ?? clock.now()
        try Self.checkPlantID(plantID)
        let photos = try await stored { try $0.photos(owner: owner, plantID: plantID) }
        guard photos.count < Self.maximumPhotosPerPlant || photos.contains(where: { $0.sha256 == Self.sha256(bytes) }) else {
            throw CanopyError(.tooLarge, "this plant has \(photos.count) photos, the most one plant may have; remove one with images.purge first")
        }
        let usage = try await stored { try $0.usage(owner: owner) }
        let (most, mostBytes) = (configuration.photosPerPerson, configuration.bytesPerPerson)
        guard usage.photos < most, usage.bytes + bytes.count <= mostBytes else {
            throw CanopyError(
                .tooLarge,
                "you keep \(usage.photos) photos of \(usage.bytes >> 20) MiB; one person keeps at most \(most) photos and \(mostBytes >> 20) MiB: remove some first"
            )
        }
        let (store, processor) = (self.store, self.processor)
        let inspected = try processor.inspect(bytes)
        let sha256 = try await offThePool { Self.sha256(bytes) }
        let add = { @Sendable in
            try await offThePool {
                try store.add(
                    sha256: sha256, owner: owner, plantID: plantID, format: inspected.kind.rawValue,
                    normalized: { try processor.metrics.time(.normalize) { try processor.normalized(bytes, keeping: inspected.kind) } }, now: now)
            }
        }
        // Only a new photo is decoded (at full size, so it waits for a full-size slot).
        return try await stored({ try $0.hasOriginal(sha256) }) ? try await add() : try await fullSize.run(0, add)
    }

    /// Fetches a remote photo (see ``RemoteFetcher``) and stores it as ``put(_:owner:plantID:now:)`` does.
    func fetch(_ url: String, owner: String, plantID: String) async throws -> Images.Photo {
        try Self.checkPlantID(plantID)
        return try await put(try await fetcher.fetch(url), owner: owner, plantID: plantID)
    }

    /// The bytes of variant data one reply carries when frames may be `replyBytes` long: the
    /// data is the reply's attachment, a frame of its own. At most 8 MiB, so one large photo
    /// does not hold the bus for long.
    static func pieceBytes(replyBytes: Int) -> Int {
        min(8 * 1024 * 1024, max(1024, replyBytes))
    }

    /// Keys of one ``Images/GetVariants`` request looked up at once: a request counts once
    /// against the worker's credit, so its keys must not each start a decode of their own.
    static let variantsAtOnce = 4

    /// Several whole variants (``Images/GetVariants``), each for its own key's principal, looked
    /// up ``variantsAtOnce`` at a time. As many bytes as one piece of ``pieceBytes(replyBytes:)``
    /// come back in the keys' order; the keys past that are answered `tooLarge`, to be asked
    /// for alone.
    func variants(_ keys: [Images.GetVariants.Key], context: RequestContext) async -> Images.GetVariants.Reply {
        @Sendable func look(_ key: Images.GetVariants.Key) async -> Result<Images.GetVariant.Reply, CanopyError> {
            do {
                let owner = try context.principal(forKey: key.principal)
                return .success(try await self.variant(.init(sha256: key.sha256, variant: key.variant, format: key.format), owner: owner))
            } catch let error as CanopyError {
                return .failure(error)
            } catch {
                context.logger.error("images.variants.failed", metadata: ["error": "\(error)"])
                return .failure(CanopyError(.internal, "this variant could not be read; the service log has the details"))
            }
        }
        // A lone key (a quiet edge sends each lookup at once) is looked up in this task: a
        // child task would be two hops for nothing.
        let found =
            keys.count == 1
            ? [await look(keys[0])]
            : await withTaskGroup(of: (Int, Result<Images.GetVariant.Reply, CanopyError>).self) { group in
                var next = min(Self.variantsAtOnce, keys.count)
                for index in 0..<next { group.addTask { (index, await look(keys[index])) } }
                var found = [Result<Images.GetVariant.Reply, CanopyError>?](repeating: nil, count: keys.count)
                for await (index, result) in group {
                    found[index] = result
                    if next < keys.count {
                        let index = next
                        group.addTask { (index, await look(keys[index])) }
                        next += 1
                    }
                }
                return found.map { $0! }
            }
        var budget = Self.pieceBytes(replyBytes: context.maximumReplyBytes)
        var reply = Images.GetVariants.Reply(results: [], attachments: [])
        for result in found {
            switch result {
            case .success(let variant) where variant.data.count <= budget:
                budget -= variant.data.count
                reply.results.append(.init(value: .init(width: variant.width, height: variant.height, source: variant.source, bytes: variant.data.count)))
                reply.attachments.append(variant.data)
            case .success(let variant):
                reply.results.append(
                    .init(error: CanopyError(.tooLarge, "this variant (\(variant.data.count) bytes) does not fit in this reply; ask images.variant for it")))
            case .failure(let error):
                reply.results.append(.init(error: error))
            }
        }
        return reply
    }

    /// A variant, or the piece of it from `request.offset` that fits in a reply of
    /// `replyBytes` (see ``Images/GetVariant``).
    func variant(_ request: Images.GetVariant.Request, owner: String, replyBytes: Int) async throws -> Images.GetVariant.Reply {
        let whole = try await variant(request, owner: owner)
        guard request.offset > 0 || whole.data.count > Self.pieceBytes(replyBytes: replyBytes) else { return whole }
        guard request.offset < whole.data.count else {
            throw CanopyError(.badRequest, "offset \(request.offset) is past the end of the variant (\(whole.data.count) bytes)")
        }
        let end = min(whole.data.count, request.offset + Self.pieceBytes(replyBytes: replyBytes))
        var piece = whole
        piece.data = whole.data.subdata(in: request.offset..<end)
        piece.offset = request.offset
        piece.totalBytes = whole.data.count
        piece.nextOffset = end < whole.data.count ? end : nil
        return piece
    }

    /// A variant: the stored original (full, in the format it is stored in), from memory,
    /// from disk, or made now (with the other small variants of the same decode, which are
    /// cached too).
    func variant(_ request: Images.GetVariant.Request, owner: String) async throws -> Images.GetVariant.Reply {
        try await requireOwnership(owner, request.sha256)
        let (store, processor) = (self.store, self.processor)
        if request.variant == .full, let stored = try await stored({ try $0.originalSize(request.sha256) }), stored.format == request.format {
            // Normalizing made the original exactly what the full variant is: no decode, no copy in the cache tiers.
            let bytes = try await offThePool { try store.original(request.sha256) }
            return Images.GetVariant.Reply(
                sha256: request.sha256, variant: .full, format: request.format,
                width: stored.width, height: stored.height, data: Data(bytes), source: "original")
        }
        let key = VariantCache.Key(sha256: request.sha256, variant: request.variant, format: request.format)
        if let (entry, tier) = await cache.lookup(key) {
            return reply(request, entry, source: tier)
        }
        // One decode makes every small variant; full (in the other format) is made on its own.
        let wanted: Set<Images.Variant> = request.variant == .full ? [.full] : [.gallery, .small, .thumbnail]
        let work: ImageMetrics.Work = request.variant == .full ? .fullVariant : .smallVariants
        let make = { @Sendable in
            try await offThePool {
                let original = try store.original(request.sha256)
                return try processor.metrics.time(work) { try processor.make(wanted, format: request.format, from: original) }
            }
        }
        let made =
            request.variant == .full
            ? try await fullSize.run(0, weight: request.format == .webp ? configuration.fullSizeConcurrency : 1, make)
            : try await make()
        try await keep(made, of: request.sha256)
        let answer = made.first { $0.variant == request.variant }!
        return reply(request, VariantCache.Entry(bytes: answer.bytes, width: answer.width, height: answer.height), source: "made")
    }

    /// Puts newly made variants into both cache tiers. A purge of the photo may have run while
    /// they (or its palette) were being made: checking after storing (a purge clears the tiers
    /// after its rows are gone) leaves nothing of a purged photo behind, whichever finished
    /// first.
    func keep(_ made: [ImageProcessor.Made], of sha256: String) async throws {
        for item in made {
            await cache.store(
                VariantCache.Entry(bytes: item.bytes, width: item.width, height: item.height),
                for: VariantCache.Key(sha256: sha256, variant: item.variant, format: item.format))
        }
        if try await !stored({ try $0.hasOriginal(sha256) }) {
            await cache.purge(sha256)
        }
    }

    private func reply(_ request: Images.GetVariant.Request, _ entry: VariantCache.Entry, source: String) -> Images.GetVariant.Reply {
        Images.GetVariant.Reply(
            sha256: request.sha256, variant: request.variant, format: request.format,
            width: entry.width, height: entry.height, data: Data(entry.bytes), source: source)
    }

    /// The palette: from memory, from the store (younger than 30 days), or computed now from
    /// the 400 px image. When the JPEG variants are not cached yet, the decode that computes
    /// the palette makes and caches them too (a collection screen wants both).
    func palette(_ sha256: String, owner: String, now: Date? = nil) async throws -> Images.Palette.Reply {
        let now = now ?? clock.now()
        try await requireOwnership(owner, sha256)
        if let swatches = await cache.palette(sha256) {
            return Images.Palette.Reply(sha256: sha256, swatches: swatches, cached: true)
        }
        let maximumAge = configuration.paletteMaximumAge
        if let swatches = try await stored({ try $0.palette(sha256, maximumAge: maximumAge, now: now) }) {
            await cache.storePalette(swatches, for: sha256)
            return Images.Palette.Reply(sha256: sha256, swatches: swatches, cached: true)
        }
        let (store, processor) = (self.store, self.processor)
        let variantsCached = await cache.contains(VariantCache.Key(sha256: sha256, variant: .small, format: .jpeg))
        let (made, swatches) = try await offThePool {
            let original = try store.original(sha256)
            let (made, pixels) = try processor.metrics.time(.palette) {
                variantsCached
                    ? ([], try processor.palettePixels(from: original))
                    : try processor.makeWithPalettePixels(format: .jpeg, from: original)
            }
            return (made, PaletteExtractor.swatches(pixels: pixels.bytes, width: pixels.width, height: pixels.height))
        }
        try await stored { try $0.savePalette(swatches, for: sha256, now: now) }
        await cache.storePalette(swatches, for: sha256)
        try await keep(made, of: sha256) // also drops the palette if the photo was purged meanwhile
        return Images.Palette.Reply(sha256: sha256, swatches: swatches, cached: false)
    }

    func list(owner: String, plantID: String) throws -> [Images.Photo] {
        try Self.checkPlantID(plantID)
        return try store.photos(owner: owner, plantID: plantID)
    }

    /// Forgets every photo of a person who deleted their account, plant by plant.
    func forget(owner: String) async throws {
        for plantID in try await stored({ try $0.plantIDs(owner: owner) }) { _ = try await purge(owner: owner, plantID: plantID) }
        try await stored { $0.eraseResidue() }
    }

    /// Forgets a plant's photos (or one of them); originals nobody else holds go with their
    /// variants and palettes.
    func purge(owner: String, plantID: String, sha256: String? = nil) async throws -> Images.Purge.Reply {
        try Self.checkPlantID(plantID)
        let (photos, deleted) = try await stored { try $0.purge(owner: owner, plantID: plantID, sha256: sha256) }
        for sha in deleted { await cache.purge(sha) }
        return Images.Purge.Reply(photos: photos) // whether originals went too is not the caller's to know
    }

    /// Makes variants ahead of time, `warmConcurrency` photos at once.
    func warm(_ request: Images.Warm.Request, owner: String) async throws -> Images.Warm.Reply {
        guard request.sha256s.count <= 1_000 else { throw CanopyError(.tooLarge, "warm at most 1000 photos per call") }
        for sha in request.sha256s { try await requireOwnership(owner, sha) }
        // One piece of work per decode: the small variants of a photo share one, full has its own.
        var cached = 0
        var pending: [(sha256: String, variant: Images.Variant, variants: Int)] = []
        let small = Set(request.variants).subtracting([.full])
        var seen: Set<String> = []
        for sha in request.sha256s where seen.insert(sha).inserted {
            var missing: [Images.Variant] = []
            for variant in small.sorted(by: { $0.rawValue < $1.rawValue })
            where !(await cache.contains(.init(sha256: sha, variant: variant, format: request.format))) {
                missing.append(variant)
            }
            cached += small.count - missing.count
            if let first = missing.first { pending.append((sha, first, missing.count)) }
            if request.variants.contains(.full) {
                // Full in the format the original is stored in is always ready: it is the original.
                let isOriginal = try store.originalSize(sha)?.format == request.format
                let isCached = await cache.contains(.init(sha256: sha, variant: .full, format: request.format))
                if isOriginal || isCached { cached += 1 } else { pending.append((sha, .full, 1)) }
            }
        }
        var made = 0
        var queue = pending[...]
        try await withThrowingTaskGroup(of: Int.self) { group in
            func next() {
                guard let (sha, variant, variants) = queue.popFirst() else { return }
                group.addTask { [self] in
                    _ = try await self.variant(.init(sha256: sha, variant: variant, format: request.format), owner: owner)
                    return variants
                }
            }
            for _ in 0..<configuration.warmConcurrency { next() }
            while let variants = try await group.next() {
                made += variants
                next()
            }
        }
        return Images.Warm.Reply(made: made, alreadyCached: cached)
    }

    func statistics() async throws -> Images.Stats.Reply {
        let (memory, disk) = await cache.statistics()
        let totals = try store.originalTotals()
        return Images.Stats.Reply(
            memory: memory, disk: disk, originals: totals.count, originalBytes: totals.bytes,
            palettes: try store.paletteCount(), memoryPressure: pressure.withLock { $0.rawValue })
    }

    // MARK: - Memory pressure

    /// Reads the pressure against a resident-size budget and sheds the memory tier.
    func checkPressure(budget: Int, reading: MemoryPressure.Reading = MemoryPressure.read()) async -> MemoryPressure {
        let level = MemoryPressure.level(reading, budget: budget)
        pressure.withLock { $0 = level }
        await cache.shed(for: level)
        let (memory, disk) = await cache.statistics()
        metrics.refresh(memory: memory, disk: disk)
        return level
    }
}
