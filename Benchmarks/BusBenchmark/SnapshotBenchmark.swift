import ArgumentParser
import CanopySamples
import CanopyServiceKit
import Foundation
import Histogram

/// What a capture's snapshot costs the running stack: the journey's HTTP calls, many people at
/// once, measured without snapshots and then while `canopy capture start --snapshot` and
/// `canopy capture stop` run back to back (each snapshot holds new requests until those in the
/// air are answered, pins every store, copies them), in the same run on the same stack.
struct SnapshotBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "snapshot",
        abstract: "The journey's calls (p50, p99) while capture snapshots are taken back to back, against without, same stack, same run.",
        discussion: """
            Needs the release executables next to canopy-bench (swift build -c release).
            Example: canopy-bench snapshot --people 48 --at-once 8 --rounds 2
            """)

    @Option(help: "People who each make the whole journey, per phase.") var people = 48
    @Option(help: "People on their journey at once.") var atOnce = 8
    @Option(help: "Phases of each kind, alternating (without, with, without, with…).") var rounds = 2

    func validate() throws {
        guard people > 0, atOnce > 0, rounds > 0 else { throw ValidationError("--people, --at-once and --rounds must be positive") }
    }

    func run() async throws {
        let executables = URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0])
            .deletingLastPathComponent()
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-snapshot-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: root) }
        let rig = StackRig(executables: executables, root: root)
        let stack = try rig.up("snapshot", environment: ["CANOPY_RATE_LIMIT": "100000", "CANOPY_RATE_BURST": "100000"])
        defer { rig.down(stack) }
        try rig.loadReferences(stack)
        print(
            "canopy-bench snapshot: \(people) journeys a phase, \(atOnce) at once, \(rounds) phases of each kind, \(ProcessInfo.processInfo.activeProcessorCount) cores"
        )

        var without = JourneyAPI.histogram(), with = JourneyAPI.histogram()
        var held: [Double] = [], pins: [Double] = [], snapshots = 0, generatorShares: [Double] = []
        for round in 0..<(2 * rounds) {
            let taking = round % 2 == 1
            progress("  phase \(round + 1)/\(2 * rounds): \(taking ? "with snapshots back to back" : "without snapshots")…\n")
            let tokens = try (0..<people).map { try rig.token(stack, user: "snapshot-\(round)-\($0)") }
            let photos = try (0..<people).map { try SyntheticPlant.species($0 % StackRig.species.count).photo(seed: 5_000 + round * people + $0) }
            let api = JourneyAPI(base: "http://\(stack.launch.http)")
            let stop = StopFlag()
            let taker = Task.detached { () -> (count: Int, held: [Double], pins: [Double]) in
                guard taking else { return (0, [], []) }
                var count = 0, held: [Double] = [], pins: [Double] = []
                while !stop.isSet {
                    let name = "bench-\(round)-\(count)"
                    let started = try rig.run(
                        "canopy", ["capture", "start", name, "--snapshot", "--data-dir", stack.directory, "--endpoint", stack.launch.endpoint])
                    guard started.status == 0 else { throw BenchmarkFailure("canopy capture start failed: \(started.text.suffix(600))") }
                    if let range = started.text.range(of: "requests held "),
                        let milliseconds = Double(started.text[range.upperBound...].prefix { $0.isNumber || $0 == "." })
                    {
                        held.append(milliseconds)
                    }
                    if let range = started.text.range(of: " ms, "),
                        let milliseconds = Double(started.text[range.upperBound...].prefix { $0.isNumber || $0 == "." })
                    {
                        pins.append(milliseconds)
                    }
                    _ = try rig.run("canopy", ["capture", "stop", "--endpoint", stack.launch.endpoint, "--data-dir", stack.directory])
                    try? FileManager.default.removeItem(atPath: stack.directory + "/" + name)
                    try? FileManager.default.removeItem(atPath: stack.directory + "/" + name + ".snapshot")
                    count += 1
                }
                return (count, held, pins)
            }
            let cpu = processCPU(), started = ContinuousClock.now
            let steps = try await withThrowingTaskGroup(of: [String: Histogram<UInt64>].self) { group in
                for lane in 0..<atOnce {
                    group.addTask {
                        var steps: [String: Histogram<UInt64>] = [:]
                        for person in stride(from: lane, to: people, by: atOnce) {
                            _ = try await api.journey(token: tokens[person], photo: photos[person], deletes: person % 2 == 1, into: &steps)
                        }
                        return steps
                    }
                }
                var all: [String: Histogram<UInt64>] = [:]
                for try await lane in group { for (name, histogram) in lane { all[name, default: JourneyAPI.histogram()].add(histogram) } }
                return all
            }
            stop.set()
            let taken = try await taker.value
            generatorShares.append((processCPU() - cpu) / (ContinuousClock.now - started).seconds)
            snapshots += taken.count
            held += taken.held
            pins += taken.pins
            for (name, histogram) in steps where name != JourneyAPI.baselineStep {
                if taking { with.add(histogram) } else { without.add(histogram) }
            }
        }
        let heldSorted = held.sorted()
        func percentile(_ values: [Double], _ p: Double) -> Double { values.isEmpty ? 0 : values[min(values.count - 1, Int(Double(values.count) * p))] }
        var rows = [["phase", "calls", "p50 ms", "p99 ms", "p99 against without"]]
        let baseline = Double(max(without.valueAtPercentile(99), 1))
        rows.append([
            "without snapshots", "\(without.totalCount)", StackBenchmark.millis(without.valueAtPercentile(50)),
            StackBenchmark.millis(without.valueAtPercentile(99)), "1.00",
        ])
        rows.append([
            "snapshots back to back (\(snapshots) taken)", "\(with.totalCount)", StackBenchmark.millis(with.valueAtPercentile(50)),
            StackBenchmark.millis(with.valueAtPercentile(99)), String(format: "%.2f", Double(with.valueAtPercentile(99)) / baseline),
        ])
        print("\nthe journey's HTTP calls (every step but the edge's own 401), with and without snapshots")
        printTable(rows)
        let pinsSorted = pins.sorted()
        print(
            String(
                format:
                    "requests held per snapshot: p50 %.1f ms, p99 %.1f ms, most %.1f ms (%d snapshots); of it pinning the stores: p50 %.1f ms, p99 %.1f ms; the load generator used %.2f of a core at most",
                percentile(heldSorted, 0.5), percentile(heldSorted, 0.99), heldSorted.last ?? 0, heldSorted.count, percentile(pinsSorted, 0.5),
                percentile(pinsSorted, 0.99), generatorShares.max() ?? 0))
    }
}

/// A flag one task sets and another reads.
final class StopFlag: @unchecked Sendable {
    private let lock = NSLock()
    private var value = false
    var isSet: Bool { lock.withLock { value } }
    func set() { lock.withLock { value = true } }
}
