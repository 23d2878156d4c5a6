import CanopyImaging
import CanopyMessages
import CanopyTesting
import Foundation
import Synchronization
import Testing

@testable import CanopyImages

/// The cache tiers' policies, without images.
struct LRUCacheTests {
    @Test func evictsTheLeastRecentlyUsedWhenOverItsByteLimit() {
        var cache = LRUCache<String, Int>(costLimit: 100)
        cache.insert(1, for: "a", cost: 40)
        cache.insert(2, for: "b", cost: 40)
        _ = cache.value(for: "a") // a is now the most recent
        let evicted = cache.insert(3, for: "c", cost: 40)
        #expect(evicted.map(\.key) == ["b"])
        #expect(cache.keysOldestFirst == ["a", "c"])
        #expect(cache.totalCost == 80)
        #expect(cache.evictions == 1)
    }

    @Test func honoursItsCountLimit() {
        var cache = LRUCache<Int, Int>(costLimit: .max, countLimit: 3)
        for key in 0..<5 { cache.insert(key, for: key, cost: 1) }
        #expect(cache.keysOldestFirst == [2, 3, 4])
    }

    @Test func anEntryLargerThanTheLimitIsNotKept() {
        var cache = LRUCache<String, Int>(costLimit: 10)
        cache.insert(1, for: "small", cost: 5)
        cache.insert(2, for: "huge", cost: 11)
        #expect(cache.keysOldestFirst == ["small"])
    }

    @Test func replacingAnEntryUpdatesItsCost() {
        var cache = LRUCache<String, Int>(costLimit: 100)
        cache.insert(1, for: "a", cost: 60)
        cache.insert(2, for: "a", cost: 10)
        #expect(cache.totalCost == 10 && cache.count == 1)
        #expect(cache.value(for: "a") == 2)
    }

    @Test func staysConsistentUnderManyRandomOperations() {
        var cache = LRUCache<Int, Int>(costLimit: 500, countLimit: 40)
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<20_000 {
            let key = Int.random(in: 0..<100, using: &generator)
            switch Int.random(in: 0..<3, using: &generator) {
            case 0: cache.insert(key, for: key, cost: Int.random(in: 1...30, using: &generator))
            case 1: _ = cache.value(for: key)
            default: cache.remove(key)
            }
            #expect(cache.totalCost <= 500 && cache.count <= 40)
        }
        #expect(cache.keysOldestFirst.count == cache.count)
    }
}

struct ConcurrencyLimiterTests {
    @Test func atMostTheLimitRunsAtOnceAndEveryWaiterGetsItsTurn() async throws {
        let limiter = ConcurrencyLimiter<Int>(maximum: 2)
        final class Counts: Sendable { let state = Mutex((now: 0, most: 0, started: [Int]())) }
        let counts = Counts()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<10 {
                group.addTask {
                    try await limiter.run(0) {
                        counts.state.withLock {
                            $0.now += 1
                            $0.most = max($0.most, $0.now)
                            $0.started.append(index)
                        }
                        try await Task.sleep(for: .milliseconds(5))
                        counts.state.withLock { $0.now -= 1 }
                    }
                }
            }
            try await group.waitForAll()
        }
        let result = counts.state.withLock { $0 }
        #expect(result.most <= 2)
        #expect(result.now == 0 && result.started.count == 10)
        // Another key has its own slots.
        let other = try await limiter.run(1) { 7 }
        #expect(other == 7)
    }

    @Test func aHeavyPieceRunsAloneAndIsNotOvertaken() async throws {
        let limiter = ConcurrencyLimiter<Int>(maximum: 2)
        final class Log: Sendable { let state = Mutex((now: 0, heavyWithOthers: false, order: [String]())) }
        let log = Log()
        func piece(_ name: String, weight: Int) async throws {
            try await limiter.run(0, weight: weight) {
                log.state.withLock {
                    $0.now += weight
                    $0.order.append(name)
                    if weight == 2 && $0.now > 2 { $0.heavyWithOthers = true }
                }
                try await Task.sleep(for: .milliseconds(50))
                log.state.withLock { $0.now -= weight }
            }
        }
        async let first: Void = piece("light 1", weight: 1)
        #expect(try await eventually(every: .milliseconds(1)) { !log.state.withLock { $0.order.isEmpty } })
        async let heavy: Void = piece("heavy", weight: 2)
        #expect(
            try await eventually(every: .milliseconds(1)) {
                await limiter.queued(0) > 0 || log.state.withLock { $0.order.contains("heavy") }
            })
        async let second: Void = piece("light 2", weight: 1) // would fit beside light 1, but the heavy one came first
        _ = try await (first, heavy, second)
        let result = log.state.withLock { $0 }
        #expect(result.order == ["light 1", "heavy", "light 2"])
        #expect(!result.heavyWithOthers && result.now == 0)
    }
}

struct MemoryPressureTests {
    @Test func parsesTheKernelsPressureFile() {
        let text = """
            some avg10=12.50 avg60=3.00 avg300=1.00 total=12345
            full avg10=0.75 avg60=0.10 avg300=0.00 total=678
            """
        let (some, full) = MemoryPressure.parse(pressure: text)
        #expect(some == 12.5)
        #expect(full == 0.75)
    }

    @Test(arguments: [
        (100, MemoryPressure.normal), (499, .normal), (500, .warning), (699, .warning), (700, .urgent), (849, .urgent), (850, .critical), (2000, .critical),
    ])
    func residentShareOfTheBudgetSetsTheLevel(resident: Int, level: MemoryPressure) {
        #expect(MemoryPressure.level(.init(stalledSome: nil, stalledFull: nil, residentBytes: resident), budget: 1000) == level)
    }

    @Test func kernelStallsRaiseTheLevel() {
        func level(some: Double, full: Double) -> MemoryPressure {
            MemoryPressure.level(.init(stalledSome: some, stalledFull: full, residentBytes: 0), budget: 1000)
        }
        #expect(level(some: 5, full: 0) == .normal)
        #expect(level(some: 15, full: 0) == .warning)
        #expect(level(some: 40, full: 0) == .urgent)
        #expect(level(some: 40, full: 20) == .critical)
    }

    @Test func readsThisProcessesResidentSize() {
        #expect(MemoryPressure.residentBytes() > 1_000_000)
    }
}

struct VariantCacheTests {
    typealias Key = VariantCache.Key

    func entry(_ size: Int) -> VariantCache.Entry { .init(bytes: [UInt8](repeating: 7, count: size), width: 10, height: 20) }
    func key(_ n: Int, _ variant: Images.Variant = .thumbnail) -> Key {
        Key(sha256: String(repeating: "\(n % 10)", count: 64), variant: variant, format: .jpeg)
    }

    @Test func aStoredVariantIsServedFromMemoryThenFromDiskAfterARestart() async throws {
        let directory = Fixture.directory()
        let first = try VariantCache(directory: directory)
        await first.store(entry(1_000), for: key(1))
        let hit = await first.lookup(key(1))
        #expect(hit?.tier == "memory")
        let restarted = try VariantCache(directory: directory)
        let fromDisk = await restarted.lookup(key(1))
        #expect(fromDisk?.tier == "disk")
        #expect(fromDisk?.0.bytes.count == 1_000 && fromDisk?.0.width == 10 && fromDisk?.0.height == 20)
        #expect(await restarted.lookup(key(1))?.tier == "memory", "a disk hit is kept in memory")
    }

    @Test func theDiskTierEvictsTheLeastRecentlyUsedPastItsByteLimit() async throws {
        let directory = Fixture.directory()
        let cache = try VariantCache(directory: directory, limits: .init(memoryBytes: 0, memoryCount: 0, diskBytes: 2_500))
        await cache.store(entry(1_000), for: key(1))
        await cache.store(entry(1_000), for: key(2))
        _ = await cache.lookup(key(1))
        await cache.store(entry(1_000), for: key(3))
        #expect(await cache.lookup(key(2)) == nil)
        #expect(await cache.lookup(key(1)) != nil)
        let files = try FileManager.default.contentsOfDirectory(atPath: directory.path)
        #expect(files.count == 2, "evicted files are deleted")
        let stats = await cache.statistics()
        #expect(stats.disk.evictions == 1)
    }

    @Test func variantsOlderThanTheExpiryAgeAreGone() async throws {
        let directory = Fixture.directory()
        let cache = try VariantCache(directory: directory, limits: .init(diskMaximumAge: 3600))
        await cache.store(entry(100), for: key(1), now: Date())
        let later = Date().addingTimeInterval(7200)
        let restarted = try VariantCache(directory: directory, limits: .init(diskMaximumAge: 3600), now: later)
        #expect(await restarted.lookup(key(1), now: later) == nil)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path).isEmpty)
    }

    @Test func memoryPressureShedsTheMemoryTierInSteps() async throws {
        let cache = try VariantCache(directory: Fixture.directory(), limits: .init(memoryBytes: 1_000_000, diskBytes: 0))
        for n in 0..<10 { await cache.store(entry(1_000), for: key(n, n < 5 ? .thumbnail : .gallery)) }
        await cache.storePalette([], for: "p")
        await cache.shed(for: .warning)
        #expect(await cache.statistics().memory.bytes <= 7_000)
        await cache.shed(for: .urgent)
        #expect(await cache.statistics().memory.entries == 0)
        #expect(await cache.palette("p") != nil, "urgent keeps palettes")
        await cache.shed(for: .critical)
        #expect(await cache.palette("p") == nil)
    }
}

struct PaletteTests {
    /// Half leaf green, a quarter terracotta, a quarter cream.
    func pixels(width: Int = 200, height: Int = 200) -> [UInt8] {
        var pixels: [UInt8] = []
        for y in 0..<height {
            for x in 0..<width {
                let colour: [UInt8] = x < width / 2 ? [46, 125, 50] : (y < height / 2 ? [196, 98, 45] : [245, 240, 225])
                pixels += colour
            }
        }
        return pixels
    }

    @Test func findsTheDominantColoursWithTheirShares() {
        let swatches = PaletteExtractor.swatches(pixels: pixels(), width: 200, height: 200)
        #expect(swatches.map(\.hex) == ["#2e7d32", "#c4622d", "#f5f0e1"], "most populous first")
        #expect(swatches.map(\.population) == [0.5, 0.25, 0.25])
        let roles = Dictionary(uniqueKeysWithValues: swatches.map { ($0.hex, $0.role) })
        #expect(roles["#f5f0e1"] == "lightMuted")
        #expect([roles["#2e7d32"], roles["#c4622d"]].contains("vibrant"))
        #expect(Set(roles.values).count == 3, "each cluster has its own role")
    }

    @Test func nearbyColoursMergeInOKLab() {
        var noisy = pixels()
        for index in stride(from: 0, to: noisy.count, by: 3) where index % 2 == 0 {
            noisy[index] = noisy[index] &+ 3 // slight noise splits histogram buckets, not clusters
        }
        let swatches = PaletteExtractor.swatches(pixels: noisy, width: 200, height: 200)
        #expect(Set(swatches.map(\.hex)).count <= 4)
    }

    @Test func oklabRoundTripsSRGB() {
        for colour in [(0.0, 0.0, 0.0), (255.0, 255.0, 255.0), (46.0, 125.0, 50.0), (196.0, 98.0, 45.0)] {
            let lab = OKLab(red: colour.0, green: colour.1, blue: colour.2)
            let back = lab.rgb
            #expect([Double(back.0), Double(back.1), Double(back.2)] == [colour.0, colour.1, colour.2])
        }
        #expect(abs(OKLab(red: 255, green: 255, blue: 255).l - 1) < 0.001)
    }
}
