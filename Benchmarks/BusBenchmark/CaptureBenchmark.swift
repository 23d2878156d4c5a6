import ArgumentParser
import CanopyBroker
import CanopyBus
import CanopyCapture
import CanopyMessages
import CanopyReplay
import CanopyWire
import Foundation
import Logging

/// Capture and replay: what capturing costs the broker at saturation, how fast a capture
/// replays against the benchmark's own load generator, and whether `capture inspect`'s
/// memory stays flat as captures grow.
struct CaptureBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "capture",
        abstract: "Capture overhead at saturation, replay speed against the pipelined load generator, and capture inspect's memory on large captures.",
        discussion: "Example: canopy-bench capture --rounds 5 --requests 100000 --inspect-megabytes 1024")

    @Option(help: "Seconds measured per setup.") var seconds = 3.0
    @Option(help: "Concurrent clients of the load generator.") var clients = 64
    @Option(help: "Requests each client keeps in flight.") var window = 16
    @Option(help: "Threads the generator's clients are spread over.") var threads = 2
    @Option(help: "Rounds of the overhead measurement (capture off and on in turn).") var rounds = 5
    @Option(help: "Requests in the capture that is replayed.") var requests = 100_000
    @Option(help: "Size of the large capture inspected, in MiB (a tenth of it is inspected too).") var inspectMegabytes = 1_024
    @Option(help: "What to measure: cost, replay, inspect; comma-separated.") var parts = "cost,replay,inspect"
    @Option(help: "Bus connections the replay sends on.") var replayConnections = 2

    func run() async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-capture-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let parts = Set(parts.split(separator: ",").map(String.init))
        let load = PipelinedLoadSetup(
            clients: clients, window: window, threads: threads, request: benchRequest(operation: "echo", body: Array("{}".utf8)),
            warmUp: .milliseconds(500), duration: .milliseconds(Int64(seconds * 1000)), uniqueBodies: true)
        print(
            "canopy-bench capture: \(clients) clients x \(window) in flight on \(threads) thread(s), 4 echo workers, unique small bodies, \(seconds) s per measurement"
        )
        if parts.contains("cost") { try await cost(load, directory: directory, logger: logger) }
        if parts.contains("replay") { try await replay(load, directory: directory, logger: logger) }
        if parts.contains("inspect") { try inspect(directory: directory) }
    }

    /// (1) Broker throughput at saturation with capture off and on, in turn.
    private func cost(_ load: PipelinedLoadSetup, directory: URL, logger: Logger) async throws {
        print("\n(1) capture overhead at saturation (target: capture on at least 0.85 of off)")
        var rows = [["round", "off req/s", "p99 µs", "on req/s", "p99 µs", "load CPU", "records on disk", "answered x2", "MB/s written", "on/off"]]
        var ratios: [Double] = []
        for round in 1...rounds {
            var off: PipelinedLoad.Result?, on: PipelinedLoad.Result?
            let path = directory.appendingPathComponent("cost-\(round)").path
            for capturing in round % 2 == 1 ? [false, true] : [true, false] {
                progress("  round \(round)/\(rounds): capture \(capturing ? "on" : "off")…\n")
                var configuration = BrokerConfiguration()
                if capturing { configuration.capture = CaptureSettings(path: path) }
                let result = try await Rig(workers: 4).broker(configuration: configuration, logger: logger) { endpoint, _ in try load.run(endpoint) }
                if capturing { on = result } else { off = result }
            }
            guard let off, let on else { continue }
            // What reached the disk, against what the load saw answered (its warm-up included: an upper bound).
            let reader = try CaptureReader(path: path)
            var records = 0
            while try reader.next() != nil { records += 1 }
            let bytes = reader.files.reduce(0) { $0 + ((try? FileManager.default.attributesOfItem(atPath: $1)[.size] as? Int) ?? 0) }
            for file in reader.files { try? FileManager.default.removeItem(atPath: file) }
            ratios.append(on.throughput / off.throughput)
            rows.append([
                "\(round)", String(format: "%.0f", off.throughput), "\(off.p99)", String(format: "%.0f", on.throughput), "\(on.p99)",
                String(format: "%.2f", on.generatorCoreShare), "\(records)", "\(Int(on.throughput * (seconds + 0.5)) * 2)",
                String(format: "%.1f", Double(bytes) / 1e6 / (seconds + 0.5)), String(format: "%.3f", on.throughput / off.throughput),
            ])
        }
        printTable(rows)
        print("median on/off: \(String(format: "%.3f", ratios.sorted()[ratios.count / 2])) (target: at least 0.85)")
    }

    /// (2) A capture of `requests` requests replayed as fast as possible, against the same
    /// load from the pipelined generator.
    private func replay(_ load: PipelinedLoadSetup, directory: URL, logger: Logger) async throws {
        print(
            "\n(2) replaying \(requests) captured requests as fast as possible on \(replayConnections) connection(s), against the pipelined generator (target: at least 0.8)"
        )
        let recorded = directory.appendingPathComponent("recorded").path
        let trimmed = directory.appendingPathComponent("replayed").path
        var recordLoad = load
        recordLoad.duration = .seconds(max(2, Double(requests) / 20_000))
        progress("  recording…\n")
        var configuration = BrokerConfiguration()
        configuration.capture = CaptureSettings(path: recorded)
        _ = try await Rig(workers: 4).broker(configuration: configuration, logger: logger) { [recordLoad] endpoint, _ in try recordLoad.run(endpoint) }
        let kept = try Self.firstRequests(requests, of: recorded, into: trimmed)
        guard kept == requests else { throw BenchmarkFailure("the recording held \(kept) requests; raise the load or lower --requests") }

        var rows = [["round", "generator req/s", "replay req/s", "replay matched", "replay p50 µs", "p99 µs", "replay/generator"]]
        var ratios: [Double] = []
        for round in 1...max(1, rounds / 2) {
            progress("  round \(round): generator…")
            let generator = try await Rig(workers: 4).broker(logger: logger) { endpoint, _ in try load.run(endpoint) }
            progress(" replay…\n")
            let report = try await Rig(workers: 4).brokerAsync(logger: logger) { [replayConnections] endpoint in
                var options = ReplayOptions()
                options.pacing = .fast
                return try await Replayer(connection: .init(endpoint: endpoint, count: replayConnections), options: options).run(
                    try CaptureReader(path: trimmed))
            }
            ratios.append(report.requestsPerSecond / generator.throughput)
            rows.append([
                "\(round)", String(format: "%.0f", generator.throughput), String(format: "%.0f", report.requestsPerSecond),
                "\(report.matched) of \(report.requests)", "\(report.replayedP50Micros)", "\(report.replayedP99Micros)",
                String(format: "%.3f", report.requestsPerSecond / generator.throughput),
            ])
        }
        printTable(rows)
        print("best replay/generator: \(String(format: "%.3f", ratios.max() ?? 0)) (target: at least 0.8)")
    }

    /// Copies the first `count` requests of a capture (and their answers) into `output`.
    static func firstRequests(_ count: Int, of path: String, into output: String) throws -> Int {
        struct Key: Hashable { let client: String, correlation: [UInt8] }
        let reader = try CaptureReader(path: path)
        var writer = try CaptureFileWriter(path: output, pseudonymized: false, withoutAttachments: false)
        var kept = Set<Key>(), requests = 0
        while let record = try reader.next() {
            let key = Key(client: record.client, correlation: record.correlation)
            if record.kind == .request, requests < count {
                requests += 1
                kept.insert(key)
                try writer.append(record)
            } else if record.kind == .reply, kept.remove(key) != nil {
                try writer.append(record)
            }
        }
        try writer.close()
        return requests
    }

    /// (3) `capture inspect` (the same code, in a child process) on a capture of a tenth of
    /// the size and of the whole size: time and peak memory.
    private func inspect(directory: URL) throws {
        print("\n(3) capture inspect on large captures (target: memory flat as the capture grows)")
        var rows = [["capture MiB", "records", "seconds", "MB/s", "peak RSS MiB"]]
        var peaks: [Double] = []
        for megabytes in [max(1, inspectMegabytes / 10), inspectMegabytes] {
            let path = directory.appendingPathComponent("inspect-\(megabytes)").path
            progress("  writing a \(megabytes) MiB capture…\n")
            let records = try Self.writeCapture(path, bytes: megabytes << 20)
            progress("  inspecting it…\n")
            let started = ContinuousClock.now
            let child = Process()
            child.executableURL = URL(fileURLWithPath: "/proc/self/exe")
            child.arguments = ["inspect-child", path]
            let pipe = Pipe()
            child.standardOutput = pipe
            try child.run()
            let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            child.waitUntilExit()
            let elapsed = ContinuousClock.now - started
            let seconds = elapsed.seconds
            let fields = output.split(separator: " ").map(String.init) // "RECORDS PEAK_KIB"
            guard child.terminationStatus == 0, fields.count == 2, let counted = Int(fields[0]),
                let peak = Double(fields[1].trimmingCharacters(in: .whitespacesAndNewlines))
            else {
                throw BenchmarkFailure("inspect-child failed: \(output)")
            }
            guard counted == records else { throw BenchmarkFailure("inspect counted \(counted) records of \(records)") }
            peaks.append(peak / 1024)
            rows.append([
                "\(megabytes)", "\(records)", String(format: "%.2f", seconds), String(format: "%.0f", Double(megabytes << 20) / 1e6 / seconds),
                String(format: "%.1f", peak / 1024),
            ])
            try? FileManager.default.removeItem(atPath: path)
        }
        printTable(rows)
        print("peak memory, large against small: \(String(format: "%.2f", (peaks.last ?? 0) / max(1, peaks.first ?? 1))) (flat: about 1)")
    }

    /// Writes a capture of about `bytes` bytes of request and answer records (1 KiB bodies).
    static func writeCapture(_ path: String, bytes: Int) throws -> Int {
        var writer = try CaptureFileWriter(path: path, pseudonymized: false, withoutAttachments: false)
        let body = Array("{\"text\":\"\(String(repeating: "x", count: 1_000))\"}".utf8)
        var records = 0, written = 0, index: UInt64 = 0
        let services = ["care", "images", "identify", "remind"], operations = ["plants.get", "images.variant", "identifications.get", "devices.list"]
        while written < bytes {
            index += 1
            let which = Int(index % 4)
            let header = RequestHeader(timeoutMilliseconds: 5_000, principal: "user-\(index % 1_000)")
            let request = CaptureRecord(
                kind: .request, time: Int64(index) * 10_000, client: "c-\(index % 64)", service: services[which],
                operation: operations[which], correlation: Wire.frame(index), header: header, body: body)
            var reply = request
            reply.kind = .reply
            reply.time += 5_000
            reply.latencyNanoseconds = 5_000 + index % 1_000
            if index % 50 == 0 {
                reply.flags = [.failed]
                reply.body = Array(#"{"code":"notFound","message":"no such plant"}"#.utf8)
            }
            try writer.append(request)
            try writer.append(reply)
            records += 2
            written += 2 * (body.count + 80)
        }
        try writer.close()
        return records
    }
}

/// `canopy-bench inspect-child FILE`: what `canopy capture inspect` does, then the records
/// counted and the process's peak memory (KiB, from /proc/self/status).
struct InspectChild: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "inspect-child", abstract: "Used by canopy-bench capture.", shouldDisplay: false)

    @Argument var file: String

    func run() throws {
        let summary = try CaptureSummary.make(try CaptureReader(path: file))
        let status = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
        let peak = status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") }?.split(separator: " ").dropFirst().first ?? "0"
        print("\(summary.records) \(peak)")
    }
}
