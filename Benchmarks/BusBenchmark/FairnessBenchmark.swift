import ArgumentParser
import AsyncHTTPClient
import CanopySamples
import CanopyServiceKit
import Foundation
import Glibc
import Histogram
import NIOCore
import NIOHTTP1
import Synchronization

/// One person flooding the machine with photo work while another reads their plants, on a
/// stack of real processes (`canopy up`): the reader's latency alone and beside the flood, in
/// alternating rounds, with each person's work budget as it ships and with none (the budget
/// at its most, what the edge did before it had one), in the same run. The target: the
/// reader's p99 beside the flood within 1.5 times their p99 alone, the flooding person still
/// served at their budget.
struct FairnessBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fairness",
        abstract:
            "One person's flood of identifications or photo uploads against another person's reads: the reader's p50/p99 alone and beside it, with the work budget and without.",
        discussion: """
            Needs the executables next to canopy-bench (swift build, or -c release). The flooder
            sends as fast as the edge lets it, on --connections connections: after a 429 each
            connection waits the Retry-After it was given (--rogue: 10 ms, ignoring it).
            Example: canopy-bench fairness --rounds 3 --seconds 8 --work identify --megapixels 1.6
            """)

    @Option(help: "Alternating rounds (alone, then beside the flood) per setting.") var rounds = 3
    @Option(help: "Seconds of each half-round.") var seconds = 8
    @Option(help: "The flooder's connections.") var connections = 8
    @Option(help: "The flood: identify (POST /v1/identifications) or upload (POST /v1/plants/{id}/photos).") var work = "identify"
    @Option(help: "The flooder's photos, in megapixels (4:3).") var megapixels = 1.6
    @Option(help: "Settings: budget (as shipped), none (the budget at its most); comma-separated.") var settings = "none,budget"
    @Flag(help: "The flooder ignores Retry-After (waits 10 ms after a 429).") var rogue = false

    func validate() throws {
        guard rounds > 0, seconds > 0, connections > 0, megapixels > 0.05, megapixels <= 24 else {
            throw ValidationError("--rounds, --seconds and --connections are positive; --megapixels is 0.05 to 24")
        }
        guard ["identify", "upload"].contains(work) else { throw ValidationError("--work is identify or upload") }
        guard settings.split(separator: ",").allSatisfy({ ["none", "budget"].contains($0) }) else { throw ValidationError("--settings takes none and budget") }
    }

    /// The stack's environment for a setting.
    static func environment(_ setting: String) -> [String: String] {
        setting == "none" ? ["CANOPY_WORK_RATE": "1000000", "CANOPY_WORK_BURST": "10000000", "CANOPY_WORK_IN_FLIGHT": "64"] : [:]
    }

    func run() async throws {
        let executables = URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0])
            .deletingLastPathComponent()
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-fairness-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: root) }
        let rig = StackRig(executables: executables, root: root)
        let width = Int((megapixels * 1e6 * 4 / 3).squareRoot()), height = width * 3 / 4
        let photo = try PlantScene.species(1).photo(seed: 3, width: width, height: height)
        print(
            "canopy-bench fairness: \(work) flood of \(width)x\(height) JPEGs (\(photo.count / 1_024) KiB) on \(connections) connections; "
                + "\(rounds) rounds of \(seconds) s alone, then beside it; \(ProcessInfo.processInfo.activeProcessorCount) cores; executables in \(executables.path)"
        )
        var table = Table(headers: [
            "SETTING", "ROUND", "READER P50 ALONE", "P99 ALONE", "P50 FLOOD", "P99 FLOOD", "P99 RATIO", "FLOOD SERVED/S",
            "FLOOD 429/S", "GENERATOR CPU", "MACHINE CPU",
        ])
        for setting in settings.split(separator: ",").map(String.init) {
            let stack = try rig.up("fairness-\(setting)", environment: Self.environment(setting))
            do {
                try rig.loadReferences(stack)
                let base = "http://\(stack.launch.http)"
                let reader = try rig.token(stack, user: "reader"), flooder = try rig.token(stack, user: "flooder")
                for index in 0..<20 {
                    try await Self.expect(
                        201,
                        try await Self.send(
                            base, .POST, "/v1/plants", token: reader,
                            json: #"{"scientificName":"Ficus lyrata","customName":"Fig \#(index)"}"#))
                }
                let plant = try await Self.send(base, .POST, "/v1/plants", token: flooder, json: #"{"scientificName":"Ficus lyrata"}"#)
                let plantID = (try JSONSerialization.jsonObject(with: Data(plant.body)) as? [String: Any])?["id"] as? String ?? ""
                // Every photo of the flood its own bytes (a counter after the JPEG's end, which
                // decoders skip): the same bytes again would be deduplicated, not worked on.
                let identify = work == "identify"
                let request: (String, String, @Sendable (Int) -> [UInt8]) =
                    identify
                    ? (
                        "/v1/identifications", "multipart/form-data; boundary=canopy-bench",
                        { count in
                            MultipartForm.encode(
                                [.init(name: "photo", type: "image/jpeg", bytes: Self.unique(photo, count)), .init(name: "organ", bytes: Array("leaf".utf8))],
                                boundary: "canopy-bench")
                        }
                    )
                    : ("/v1/plants/\(plantID)/photos", "image/jpeg", { count in Self.unique(photo, count) })
                // Every round's reads together too: a p99 of one 8 s half is its second-worst read.
                var (allAlone, allBeside) = (JourneyAPI.histogram(), JourneyAPI.histogram())
                var (allServed, allRefused, allElapsed) = (0, 0, 0.0)
                for round in 1...rounds {
                    let alone = try await Self.read(base, token: reader, for: .seconds(seconds))
                    let flood = Flood()
                    let cpu = CPUClock()
                    let flooders = (0..<connections).map { _ in
                        Task { await Self.flood(base, token: flooder, path: request.0, type: request.1, body: request.2, rogue: rogue, until: flood) }
                    }
                    try await Task.sleep(for: .seconds(1)) // the flood under way
                    let started = ContinuousClock.now
                    let (served, refused) = flood.counts
                    let beside = try await Self.read(base, token: reader, for: .seconds(seconds))
                    let elapsed = (ContinuousClock.now - started).seconds
                    let (servedAfter, refusedAfter) = flood.counts
                    let (generator, machine) = cpu.cores(since: started)
                    flood.stop()
                    for flooder in flooders { await flooder.value }
                    let ratio = Double(beside.valueAtPercentile(99)) / Double(max(1, alone.valueAtPercentile(99)))
                    table.append([
                        setting, "\(round)", Self.millis(alone.valueAtPercentile(50)), Self.millis(alone.valueAtPercentile(99)),
                        Self.millis(beside.valueAtPercentile(50)), Self.millis(beside.valueAtPercentile(99)), String(format: "%.2f", ratio),
                        String(format: "%.1f", Double(servedAfter - served) / elapsed), String(format: "%.0f", Double(refusedAfter - refused) / elapsed),
                        String(format: "%.2f", generator), String(format: "%.2f", machine),
                    ])
                    allAlone.add(alone)
                    allBeside.add(beside)
                    (allServed, allRefused, allElapsed) = (allServed + servedAfter - served, allRefused + refusedAfter - refused, allElapsed + elapsed)
                    try await Task.sleep(for: .seconds(2)) // what the flood left in the air is done
                }
                let ratio = Double(allBeside.valueAtPercentile(99)) / Double(max(1, allAlone.valueAtPercentile(99)))
                table.append([
                    setting, "all", Self.millis(allAlone.valueAtPercentile(50)), Self.millis(allAlone.valueAtPercentile(99)),
                    Self.millis(allBeside.valueAtPercentile(50)), Self.millis(allBeside.valueAtPercentile(99)), String(format: "%.2f", ratio),
                    String(format: "%.1f", Double(allServed) / allElapsed), String(format: "%.0f", Double(allRefused) / allElapsed), "", "",
                ])
            } catch {
                rig.down(stack)
                throw error
            }
            rig.down(stack)
        }
        print(table.render())
        print(
            "P50/P99 in ms of one GET /v1/plants at a time (a phone's); GENERATOR CPU: this process's cores, MACHINE CPU: all cores busy, during the flood half."
        )
    }

    static func millis(_ micros: UInt64) -> String { String(format: "%.2f", Double(micros) / 1_000) }

    /// How often the reader asks: 25 times a second, within the per-person request rate (50).
    static let readInterval: Duration = .milliseconds(40)

    /// One person reading their plants one request at a time, every ``readInterval``, for
    /// `duration`; their latencies (µs).
    static func read(_ base: String, token: String, for duration: Duration) async throws -> Histogram<UInt64> {
        var latencies = JourneyAPI.histogram()
        let end = ContinuousClock.now + duration
        var next = ContinuousClock.now
        while next < end {
            try await Task.sleep(until: next)
            let started = ContinuousClock.now
            let answer = try await send(base, .GET, "/v1/plants?limit=20", token: token)
            try expect(200, answer)
            _ = latencies.record(UInt64(max(1, (ContinuousClock.now - started).microseconds)))
            next = max(next + readInterval, ContinuousClock.now)
        }
        return latencies
    }

    /// `photo` with `count`'s bytes after it: a photo of its own to a hash, the same to a decoder.
    static func unique(_ photo: [UInt8], _ count: Int) -> [UInt8] {
        photo + withUnsafeBytes(of: UInt64(count).bigEndian, Array.init)
    }

    /// One connection's flood until `flood` stops: served and refused counted; after a 429 it
    /// waits what Retry-After says (up to 2 s, so the flood ends with its half-round), or 10 ms
    /// when `rogue`.
    static func flood(_ base: String, token: String, path: String, type: String, body: @Sendable (Int) -> [UInt8], rogue: Bool, until flood: Flood) async {
        while !flood.stopped {
            guard let answer = try? await send(base, .POST, path, token: token, body: body(flood.next()), type: type) else {
                try? await Task.sleep(for: .milliseconds(10)) // a connection error: not a spin
                continue
            }
            if answer.status == 429 {
                flood.refused()
                let wait: Duration = rogue ? .milliseconds(10) : .seconds(min(2, answer.retryAfter ?? 1))
                try? await Task.sleep(for: wait)
            } else {
                flood.served()
            }
        }
    }

    struct Answer {
        var status: Int
        var body: [UInt8]
        var retryAfter: Int?
    }

    static func send(
        _ base: String, _ method: HTTPMethod, _ path: String, token: String, json: String? = nil, body: [UInt8]? = nil,
        type: String? = nil
    ) async throws -> Answer {
        var request = HTTPClientRequest(url: base + path)
        request.method = method
        request.headers.add(name: "Authorization", value: "Bearer \(token)")
        if let json {
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(string: json))
        } else if let body {
            request.headers.add(name: "Content-Type", value: type ?? "application/octet-stream")
            request.body = .bytes(ByteBuffer(bytes: body))
        }
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(120))
        let collected = try await response.body.collect(upTo: 32 << 20)
        return Answer(
            status: Int(response.status.code), body: Array(collected.readableBytesView),
            retryAfter: response.headers.first(name: "Retry-After").flatMap(Int.init))
    }

    static func expect(_ status: Int, _ answer: Answer) throws {
        guard answer.status == status else {
            throw BenchmarkFailure("answered \(answer.status), not \(status): \(String(decoding: answer.body.prefix(300), as: UTF8.self))")
        }
    }

    /// The flood's counts and its stop.
    final class Flood: Sendable {
        private let state = Mutex((served: 0, refused: 0, stopped: false))
        var stopped: Bool { state.withLock { $0.stopped } }
        var counts: (served: Int, refused: Int) { state.withLock { ($0.served, $0.refused) } }
        func served() { state.withLock { $0.served += 1 } }
        func refused() { state.withLock { $0.refused += 1 } }
        func stop() { state.withLock { $0.stopped = true } }
        private let sent = Atomic<Int>(0)
        /// A number of its own for the next request.
        func next() -> Int { sent.add(1, ordering: .relaxed).newValue }
    }

    /// This process's CPU and the machine's (`/proc/stat`), to show what the load generator takes.
    struct CPUClock {
        private let process = CPUClock.processSeconds()
        private let machine = CPUClock.machineBusySeconds()

        /// Cores this process and the whole machine kept busy since `started`.
        func cores(since started: ContinuousClock.Instant) -> (process: Double, machine: Double) {
            let elapsed = max(0.001, (ContinuousClock.now - started).seconds + 1) // the flood's first second is counted too
            return ((Self.processSeconds() - process) / elapsed, (Self.machineBusySeconds() - machine) / elapsed)
        }

        static func processSeconds() -> Double {
            var usage = rusage()
            getrusage(RUSAGE_SELF.rawValue, &usage)
            return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
        }

        static func machineBusySeconds() -> Double {
            guard let text = try? String(contentsOfFile: "/proc/stat", encoding: .utf8), let line = text.split(separator: "\n").first else { return 0 }
            let fields = line.split(separator: " ").dropFirst().compactMap { Double($0) }
            guard fields.count >= 5 else { return 0 }
            let idle = fields[3] + fields[4] // idle, iowait
            return (fields.reduce(0, +) - idle) / Double(sysconf(Int32(_SC_CLK_TCK)))
        }
    }
}
