import CanopyBus
import CanopyMessages
import Metrics
import Synchronization

/// canopy-images' figures in swift-metrics, created once. The cache tiers' series are
/// refreshed from ``VariantCache/statistics()`` by the pressure monitor's pass (each second);
/// work times and refusals are recorded where they happen.
final class ImageMetrics: Sendable {
    /// Why an upload was refused before anything was decoded.
    enum Refusal: String, CaseIterable {
        case tooManyBytes = "too_many_bytes"
        case unknownFormat = "unknown_format"
        case unreadableHeader = "unreadable_header"
        case tooManyPixels = "too_many_pixels"
    }

    /// What took the time.
    enum Work: String, CaseIterable {
        /// Decoding an upload at full size and encoding the stored original.
        case normalize
        /// One shrink-on-load decode and the small variants encoded from it.
        case smallVariants = "small_variants"
        /// A full-size decode and encode (full in the other format).
        case fullVariant = "full_variant"
        /// A decode for a palette.
        case palette
    }

    private struct Tier {
        let entries, bytes: Gauge
        let hits, misses, evictions: Counter
        init(_ name: String) {
            let dimensions = [("tier", name)]
            entries = Gauge(label: "canopy_images_cache_entries", dimensions: dimensions)
            bytes = Gauge(label: "canopy_images_cache_bytes", dimensions: dimensions)
            hits = Counter(label: "canopy_images_cache_hits_total", dimensions: dimensions)
            misses = Counter(label: "canopy_images_cache_misses_total", dimensions: dimensions)
            evictions = Counter(label: "canopy_images_cache_evictions_total", dimensions: dimensions)
        }
    }

    private let refusals: [Refusal: Counter]
    private let work: [Work: Metrics.Timer]
    private let memory = Tier("memory")
    private let disk = Tier("disk")
    private let totals = Mutex(CounterTotals())

    init() {
        refusals = Dictionary(
            uniqueKeysWithValues: Refusal.allCases.map {
                ($0, Counter(label: "canopy_images_refused_inputs_total", dimensions: [("reason", $0.rawValue)]))
            })
        work = Dictionary(
            uniqueKeysWithValues: Work.allCases.map {
                ($0, Metrics.Timer(label: "canopy_images_work_duration_seconds", dimensions: [("work", $0.rawValue)]))
            })
    }

    func refused(_ reason: Refusal) {
        refusals[reason]?.increment()
    }

    /// Runs `body` and records how long it took as `kind`.
    func time<T>(_ kind: Work, _ body: () throws -> T) rethrows -> T {
        let started = ContinuousClock.now
        defer {
            let elapsed = ContinuousClock.now - started
            work[kind]?.recordNanoseconds(elapsed.nanoseconds)
        }
        return try body()
    }

    /// Brings the tiers' series up to their statistics (counters advance by the growth).
    func refresh(memory memoryStatistics: Images.TierStatistics, disk diskStatistics: Images.TierStatistics) {
        totals.withLock { totals in
            for (name, tier, statistics) in [("memory", memory, memoryStatistics), ("disk", disk, diskStatistics)] {
                tier.entries.record(statistics.entries)
                tier.bytes.record(statistics.bytes)
                for (key, counter, total) in [
                    ("hits", tier.hits, statistics.hits), ("misses", tier.misses, statistics.misses),
                    ("evictions", tier.evictions, statistics.evictions),
                ] {
                    totals.advance(counter, name + key, to: total)
                }
            }
        }
    }
}
