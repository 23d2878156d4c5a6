import CanopyMessages
import Foundation

/// The two cache tiers for variants: memory (LRU bounded by bytes and count) and disk (LRU
/// bounded by bytes, entries expiring after an age), plus a small memory cache of palettes.
/// Fast operations only; decoding and encoding happen outside.
actor VariantCache {
    /// Sizes of the tiers.
    struct Limits: Sendable {
        var memoryBytes = 50 * 1024 * 1024
        var memoryCount = 5_000
        var diskBytes = 100 * 1024 * 1024
        var diskMaximumAge: TimeInterval = 7 * 24 * 3600
        var palettes = 1_000
    }

    /// A cached variant.
    struct Entry: Sendable {
        var bytes: [UInt8]
        var width: Int
        var height: Int
    }

    struct Key: Hashable, Sendable {
        var sha256: String
        var variant: Images.Variant
        var format: Images.Format

        /// `sha.variant.format.WxH`: the disk file name carries the size.
        func fileName(width: Int, height: Int) -> String { "\(sha256).\(variant.rawValue).\(format.rawValue).\(width)x\(height)" }

        init(sha256: String, variant: Images.Variant, format: Images.Format) {
            self.sha256 = sha256
            self.variant = variant
            self.format = format
        }

        /// Parses a disk file name back.
        init?(fileName: String) {
            let parts = fileName.split(separator: ".")
            guard parts.count == 4, let variant = Images.Variant(rawValue: String(parts[1])), let format = Images.Format(rawValue: String(parts[2])) else {
                return nil
            }
            self.init(sha256: String(parts[0]), variant: variant, format: format)
        }
    }

    struct DiskEntry: Sendable {
        var fileName: String
        var width: Int
        var height: Int
        var createdAt: Date
    }

    private let limits: Limits
    private let directory: URL
    private var memory: LRUCache<Key, Entry>
    private var disk: LRUCache<Key, DiskEntry>
    private var palettes: LRUCache<String, [Images.Swatch]>
    private var memoryHits: UInt64 = 0, memoryMisses: UInt64 = 0
    private var diskHits: UInt64 = 0, diskMisses: UInt64 = 0
    private var expired: UInt64 = 0

    /// Opens the disk tier in `directory`, indexing what an earlier run left (oldest first)
    /// and deleting what has expired or is over the limit.
    init(directory: URL, limits: Limits = Limits(), now: Date = Date()) throws {
        self.limits = limits
        self.directory = directory
        memory = LRUCache(costLimit: limits.memoryBytes, countLimit: limits.memoryCount)
        disk = LRUCache(costLimit: limits.diskBytes)
        palettes = LRUCache(costLimit: limits.palettes)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let names = try FileManager.default.contentsOfDirectory(atPath: directory.path)
        var found: [(Key, DiskEntry, Int)] = []
        for name in names {
            let url = directory.appendingPathComponent(name)
            let attributes = try? FileManager.default.attributesOfItem(atPath: url.path)
            let size = (attributes?[.size] as? Int) ?? 0
            let modified = (attributes?[.modificationDate] as? Date) ?? .distantPast
            let dimensions = name.split(separator: ".").last?.split(separator: "x").compactMap { Int($0) } ?? []
            guard let key = Key(fileName: name), dimensions.count == 2, now.timeIntervalSince(modified) < limits.diskMaximumAge else {
                try? FileManager.default.removeItem(at: url) // expired, or not ours (a temporary file)
                continue
            }
            found.append((key, DiskEntry(fileName: name, width: dimensions[0], height: dimensions[1], createdAt: modified), size))
        }
        for (key, entry, size) in found.sorted(by: { $0.1.createdAt < $1.1.createdAt }) {
            for evicted in disk.insert(entry, for: key, cost: size) {
                try? FileManager.default.removeItem(at: directory.appendingPathComponent(evicted.value.fileName))
            }
        }
    }

    /// The variant from memory, or else from disk (then kept in memory too), with its tier.
    func lookup(_ key: Key, now: Date = Date()) -> (Entry, tier: String)? {
        if let entry = memory.value(for: key) {
            memoryHits += 1
            return (entry, "memory")
        }
        memoryMisses += 1
        guard let onDisk = disk.value(for: key) else {
            diskMisses += 1
            return nil
        }
        let url = directory.appendingPathComponent(onDisk.fileName)
        guard now.timeIntervalSince(onDisk.createdAt) < limits.diskMaximumAge, let data = try? Data(contentsOf: url) else {
            disk.remove(key)
            expired += 1
            try? FileManager.default.removeItem(at: url)
            diskMisses += 1
            return nil
        }
        diskHits += 1
        let entry = Entry(bytes: [UInt8](data), width: onDisk.width, height: onDisk.height)
        memory.insert(entry, for: key, cost: entry.bytes.count)
        return (entry, "disk")
    }

    /// Whether the variant is cached in either tier.
    func contains(_ key: Key) -> Bool { memory.contains(key) || disk.contains(key) }

    /// Keeps a new variant in both tiers (the disk write is atomic: temporary file, rename).
    func store(_ entry: Entry, for key: Key, now: Date = Date()) {
        memory.insert(entry, for: key, cost: entry.bytes.count)
        let name = key.fileName(width: entry.width, height: entry.height)
        let url = directory.appendingPathComponent(name)
        do {
            try Data(entry.bytes).write(to: url, options: .atomic)
        } catch {
            return // the memory tier still has it; the disk tier is a cache
        }
        for evicted in disk.insert(DiskEntry(fileName: name, width: entry.width, height: entry.height, createdAt: now), for: key, cost: entry.bytes.count) {
            try? FileManager.default.removeItem(at: directory.appendingPathComponent(evicted.value.fileName))
        }
    }

    /// Forgets every variant and palette of `sha256`, in memory and on disk.
    func purge(_ sha256: String) {
        memory.removeAll { key, _ in key.sha256 == sha256 }
        palettes.remove(sha256)
        let keys = Images.Variant.allCases.flatMap { variant in Images.Format.allCases.map { Key(sha256: sha256, variant: variant, format: $0) } }
        for key in keys {
            if let entry = disk.remove(key) {
                try? FileManager.default.removeItem(at: directory.appendingPathComponent(entry.fileName))
            }
        }
    }

    // MARK: - Palettes

    func palette(_ sha256: String) -> [Images.Swatch]? { palettes.value(for: sha256) }

    func storePalette(_ swatches: [Images.Swatch], for sha256: String) {
        palettes.insert(swatches, for: sha256, cost: 1)
    }

    // MARK: - Memory pressure

    /// Sheds the memory tier for a pressure level (seed 001): warning shrinks it by 30%,
    /// urgent drops the variants, critical drops everything, palettes included.
    func shed(for level: MemoryPressure) {
        switch level {
        case .normal: break
        case .warning: memory.evict(toCost: memory.totalCost * 7 / 10)
        case .urgent: memory.evict(toCost: 0)
        case .critical:
            memory.evict(toCost: 0)
            palettes.evict(toCost: 0)
        }
    }

    // MARK: - Statistics

    func statistics() -> (memory: Images.TierStatistics, disk: Images.TierStatistics) {
        (
            Images.TierStatistics(
                entries: memory.count, bytes: memory.totalCost, limitBytes: limits.memoryBytes,
                hits: memoryHits, misses: memoryMisses, evictions: memory.evictions),
            Images.TierStatistics(
                entries: disk.count, bytes: disk.totalCost, limitBytes: limits.diskBytes,
                hits: diskHits, misses: diskMisses, evictions: disk.evictions + expired)
        )
    }
}
