import ArgumentParser
import CanopyBus
import CanopyCapture
import CanopyDeployment
import CanopyMessages
import CanopyReplay
import CanopyServiceKit
import Foundation

/// `canopy replay FILE`: a capture's requests sent again, each answer compared.
struct Replay: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Send a capture's requests to a stack again and compare the answers with the captured ones.",
        discussion: """
            Each captured client's requests go in their original order (a request waits for the
            answers its client had before sending it), clients concurrently. Ids that changed
            (a new plant's id) are learned from the answers and put into later requests.
            Exits 0 when every answer matched, 1 when any differed or failed.
            Examples:
              canopy replay monday --broker tcp://127.0.0.1:5555
              canopy replay monday --speed 4 --ignore createdAt --ignore '$.plant.addedAt'
              canopy replay monday --fast --json > report.json
              canopy replay monday --dry-run
              canopy replay broker-a/monday broker-2/monday    # two brokers' captures, merged by time
              canopy replay .canopy/monday --fresh              # on a throwaway stack started from its snapshot
              canopy replay .canopy/monday --fresh --compare-with ../main/.build/release
            With --fresh, a stack of this build starts from the capture's snapshot (NAME.snapshot,
            taken by canopy capture start) on free ports, its clock standing at the capture's
            start, the requests go at their captured times, the report is printed and the stack
            stops. With --compare-with DIR the same happens once more on DIR's executables, and
            the report is where the two builds answered differently.
            Date-times are compared as times: one that differs from the captured one by how much
            later the stack's clock stood is the same (the report names those fields).
            """)

    @Argument(help: "The capture's (first) file; several brokers' captures of one time are replayed as one, merged by time.") var files: [String]
    @Option(help: "Pace: this many times faster than captured (1: as recorded).") var speed: Double?
    @Option(help: "Pace: this many requests a second, whatever the captured times.") var rate: Double?
    @Flag(help: "Pace: as fast as the stack answers.") var fast = false
    @Option(help: ArgumentHelp("A path left out of the comparison: createdAt, plant.createdAt, $.plants[*].addedAt (repeat for more).", valueName: "path"))
    var ignore: [String] = []
    @Option(help: "Requests read ahead of their answers at most.") var window = 10_000
    @Option(help: "Bus connections to send on (captured clients are spread over them).") var connections = 2
    @Option(help: "Wait this many milliseconds for each answer instead of the captured deadline.") var timeoutMs: Int?
    @Option(help: "Differing answers shown in full (all are counted).") var examples = 20
    @Flag(help: "Read the capture and report what would be sent, with checks; send nothing.") var dryRun = false
    @Flag(help: "Replay on a throwaway stack of this build started from the capture's snapshot, its clock at the capture's start; stopped afterwards.")
    var fresh = false
    @Option(
        help: ArgumentHelp(
            "With --fresh: replay on a stack of another build too (the directory holding its canopy-broker, canopy-care, …) and report where the two differ.",
            valueName: "dir"))
    var compareWith: String?
    @Option(help: ArgumentHelp("With --fresh: the snapshot to start from (default: the capture's NAME.snapshot).", valueName: "dir"))
    var snapshot: String?
    @Option(help: "Date-times within this many milliseconds of the clocks' shift (beyond the requests' own time) are the same; -1 compares them as text.")
    var timeToleranceMs = 250
    @Flag(help: "Print the report as JSON, for scripts.") var json = false
    @OptionGroup var common: CommonOptions
    @OptionGroup var stack: StackOptions // the local stack's keys, when it runs CurveZMQ

    func validate() throws {
        guard [speed != nil, rate != nil, fast].filter({ $0 }).count <= 1 else {
            throw ValidationError("give one pace: --speed X, --rate N or --fast")
        }
        if let speed, !(speed > 0 && speed <= 1_000_000) { throw ValidationError("--speed must be above 0 (4 replays four times faster)") }
        if let rate, !(rate > 0 && rate <= 10_000_000) { throw ValidationError("--rate must be above 0 requests a second") }
        guard window >= 1 else { throw ValidationError("--window must be at least 1") }
        guard (1...64).contains(connections) else { throw ValidationError("--connections must be from 1 to 64") }
        if let timeoutMs, timeoutMs < 1 { throw ValidationError("--timeout-ms must be at least 1") }
        guard (-1...3_600_000).contains(timeToleranceMs) else { throw ValidationError("--time-tolerance-ms is -1 (times as text) to 3600000") }
        if fresh {
            guard !fast && rate == nil && (speed ?? 1) == 1 else {
                throw ValidationError(
                    "--fresh replays at the captured pace, so that what depends on time (a reminder falling due) happens between the same requests; leave out --fast, --rate and --speed"
                )
            }
            guard !dryRun else { throw ValidationError("--dry-run sends nothing; leave out --fresh") }
        } else if compareWith != nil || snapshot != nil {
            throw ValidationError("--compare-with and --snapshot go with --fresh")
        }
        guard examples >= 0 else { throw ValidationError("--examples cannot be negative") }
    }

    func run() async throws {
        let reader = try openCapture(files)
        let total = reader.allFiles.reduce(0) { $0 + ((try? FileManager.default.attributesOfItem(atPath: $1)[.size] as? Int) ?? 0) }
        if dryRun {
            // The stack is asked what it offers when it is reachable; the checks run without it too.
            let offered = await offeredOperations()
            let check = try ReplayCheck.make(reader, offered: offered)
            try print(json ? Self.json(check) : Self.render(check, offered: offered != nil))
            if !check.problems.isEmpty { throw ExitCode(1) }
            return
        }
        var options = ReplayOptions()
        options.pacing = fast ? .fast : rate.map { .rate($0) } ?? .recorded(speed: speed ?? 1)
        options.ignore = ignore
        options.window = window
        options.examples = examples
        options.timeout = timeoutMs.map { .milliseconds($0) }
        options.timeTolerance = timeToleranceMs < 0 ? nil : .milliseconds(timeToleranceMs)
        if fresh { return try await replayFresh(reader, options: options, bytes: total) }
        let progress = ProgressBox()
        var report = ReplayReport()
        guard await offeredOperations() != nil else {
            FileHandle.standardError.write(Data("error: no broker answers at \(common.endpoint); start the stack, or pass --broker ENDPOINT\n".utf8))
            throw ExitCode(1)
        }
        let configuration = try common.operatorConfiguration(stack: stack)
        let connection = Replayer.Connection(endpoint: configuration.endpoint, curve: configuration.curve, count: connections)
        report = try await Replayer(connection: connection, options: options).run(reader) { state in
            progress.update("replaying \(ProgressLine.bar(state.bytesRead, of: total)) \(state.completed) answered of \(state.sent) sent")
        }
        progress.finish()
        try print(json ? Self.json(report) : Self.render(report))
        if !report.isClean { throw ExitCode(1) }
    }

    /// `--fresh`: the capture replayed on a stack of this build started from its snapshot;
    /// with `--compare-with`, then on one of the other build, against this build's answers.
    private func replayFresh(_ reader: CaptureReader, options: ReplayOptions, bytes: Int) async throws {
        let snapshotDirectory = snapshot.map { URL(fileURLWithPath: $0, isDirectory: true) } ?? StackSnapshot.directory(forCapture: files[0])
        let manifest = try StackSnapshot.manifest(in: snapshotDirectory)
        let this = try Up.executables()
        guard let other = compareWith else {
            let report = try await replayOnFreshStack(
                reader, executables: this, snapshot: snapshotDirectory, manifest: manifest, options: options, bytes: bytes)
            try print(json ? Self.json(report) : Self.render(report))
            if !report.isClean { throw ExitCode(1) }
            return
        }
        let otherBuild = URL(fileURLWithPath: other, isDirectory: true).standardizedFileURL
        let missing = CanopyStack.services.map(\.executable).filter {
            !FileManager.default.isExecutableFile(atPath: otherBuild.appendingPathComponent($0).path)
        }
        guard missing.isEmpty else {
            throw CommandFailure(
                "\(otherBuild.path) has no \(missing.joined(separator: ", ")); name the directory of the other build's executables (such as ../other/.build/release after swift build -c release)"
            )
        }
        // This build's answers, written as a capture of their own, are what the other build is
        // compared against.
        let answers = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-replay-answers-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: answers) }
        var first = options
        first.answersPath = answers
        note("replaying on this build (\(this.path))…")
        let baseline = try await replayOnFreshStack(reader, executables: this, snapshot: snapshotDirectory, manifest: manifest, options: first, bytes: bytes)
        note("this build against the capture: \(baseline.matched) matched, \(baseline.differed) differed, \(baseline.failed) failed")
        note("replaying on \(otherBuild.path)…")
        let compared = try await replayOnFreshStack(
            try openCapture([answers]), executables: otherBuild, snapshot: snapshotDirectory, manifest: manifest,
            options: options, bytes: bytes)
        if json {
            struct Comparison: Encodable {
                var thisBuild: ReplayReport
                var otherBuild: ReplayReport
            }
            try print(Self.json(Comparison(thisBuild: baseline, otherBuild: compared)))
        } else {
            print("this build (\(this.path)) against the capture: \(baseline.matched) of \(baseline.requests) matched")
            print("\(otherBuild.path) against this build:")
            print(Self.render(compared))
        }
        if !compared.isClean { throw ExitCode(1) }
    }

    /// Starts a fresh stack of `executables` from the snapshot, replays, stops it.
    private func replayOnFreshStack(
        _ reader: CaptureReader, executables: URL, snapshot: URL, manifest: StackSnapshot.Manifest,
        options: ReplayOptions, bytes: Int
    ) async throws -> ReplayReport {
        var lead: Duration = .seconds(3)
        var failures: [Error] = []
        for _ in 0..<4 {
            let started: FreshStack?
            do {
                started = try FreshStack.start(snapshot: snapshot, manifest: manifest, executables: executables, lead: lead, progress: { note($0) })
            } catch {
                // A port another program took meanwhile, most often: again, on others.
                note("the fresh stack did not start: \(error)")
                failures.append(error)
                if failures.count >= 2 { throw error }
                continue
            }
            guard let stack = started else {
                lead *= 3 // it took longer to start than the lead: again, with more
                continue
            }
            defer { stack.stop() }
            var options = options
            options.causalOrder = true
            options.clock = .anchored(captureTime: Int64((stack.anchorCut * 1e9).rounded()), at: stack.anchor)
            let progress = ProgressBox()
            let connection = Replayer.Connection(endpoint: stack.endpoint, curve: stack.curve, count: connections)
            let report = try await Replayer(connection: connection, options: options).run(reader) { state in
                progress.update("replaying \(ProgressLine.bar(state.bytesRead, of: bytes)) \(state.completed) answered of \(state.sent) sent")
            }
            progress.finish()
            return report
        }
        throw CommandFailure("a fresh stack did not start within \(lead / 3); see the services' logs (canopy up runs the same executables) and try again")
    }

    /// `service.operation` of every operation the stack offers, or nil when it cannot be asked.
    private func offeredOperations() async -> Set<String>? {
        guard
            let bus = try? BusClient(
                configuration: try common.operatorConfiguration(stack: stack), context: ZMQContext(),
                logger: LogSetup.logger(label: "canopy", level: .critical))
        else { return nil }
        defer { bus.close() }
        guard let services = try? await bus.call(Broker.Services.self, .init(), timeout: .seconds(3)) else { return nil }
        return Set(services.flatMap { service in service.operations.map { "\(service.name).\($0.name)" } })
    }

    static func json(_ value: some Encodable) throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        return String(decoding: try encoder.encode(value), as: UTF8.self)
    }

    static func render(_ check: ReplayCheck, offered: Bool) -> String {
        var lines = [
            "would send \(check.requests) request(s) from \(check.clients) client(s), captured over \(String(format: "%.3f", check.spanSeconds)) s; \(check.answers) captured answer(s) to compare with; \(check.derived) request(s) the services made themselves are left to them"
        ]
        var table = Table("OPERATION", "REQUESTS")
        for (name, count) in check.operations.sorted(by: { $0.key < $1.key }) { table.append([name, "\(count)"]) }
        if !check.operations.isEmpty { lines += ["", table.render(), ""] }
        if !offered { lines.append("(the stack was not reachable: operations were not checked against it)") }
        let problems = check.problems
        lines.append(problems.isEmpty ? "checks: all passed" : "checks:\n" + problems.map { "  - \($0)" }.joined(separator: "\n"))
        return lines.joined(separator: "\n")
    }

    static func render(_ report: ReplayReport) -> String {
        var summary = Table("REQUESTS", "MATCHED", "DIFFERED", "FAILED", "SKIPPED", "UNANSWERED", "IDS REBOUND", "REQUESTS/S")
        summary.append([
            "\(report.requests)", "\(report.matched)", "\(report.differed)", "\(report.failed)", "\(report.skipped)", "\(report.unanswered)",
            "\(report.rebound)", String(format: "%.0f", report.requestsPerSecond),
        ])
        var latency = Table("LATENCY", "P50 µs", "P99 µs")
        latency.append(["captured (at the broker)", "\(report.capturedP50Micros)", "\(report.capturedP99Micros)"])
        latency.append(["replayed (at this client)", "\(report.replayedP50Micros)", "\(report.replayedP99Micros)"])
        var lines = [summary.render(), "", latency.render()]
        if report.ending != "complete" { lines += ["", "the capture is \(report.ending)"] }
        if report.backgroundWaitsEnded > 0 {
            lines += [
                "",
                "\(report.backgroundWaitsEnded) request(s) went without background work the capture had seen done before them (the stack did less of it within 3 s)",
            ]
        }
        if !report.differingPaths.isEmpty {
            var places = Table("ANSWERS", "OPERATION", "PATH")
            for (place, count) in report.differingPaths.sorted(by: { $0.key < $1.key }) {
                let parts = place.split(separator: " ", maxSplits: 1).map(String.init)
                places.append(["\(count)", parts[0], parts.count > 1 ? parts[1] : ""])
            }
            lines += ["", "where answers differed:", places.render()]
        }
        if !report.timeFields.isEmpty {
            lines += ["", "compared as times (the same once moved by the clocks' shift): \(report.timeFields.joined(separator: ", "))"]
        }
        for example in report.examples {
            lines.append("")
            let when = Date(timeIntervalSince1970: Double(example.time) / 1e9).formatted(.iso8601)
            lines.append(
                "\(example.service).\(example.operation) from \(example.client) for \(example.principal.isEmpty ? "nobody" : example.principal), captured \(when):"
            )
            if let failure = example.failure { lines.append("  failed: \(failure)") }
            for difference in example.differences { lines.append("  \(difference.path): \(difference.captured) -> \(difference.replayed)") }
        }
        let shown = report.examples.count, total = report.differed + report.failed
        if total > shown { lines += ["", "(\(total - shown) more not shown; --examples N shows more, --json gives them all as data)"] }
        lines.append("")
        lines.append(report.isClean ? "every answer matched" : "\(report.differed) answer(s) differed and \(report.failed) request(s) failed")
        return lines.joined(separator: "\n")
    }
}

/// The progress line, updated from the replay's tasks.
final class ProgressBox: @unchecked Sendable {
    private let lock = NSLock()
    private var line = ProgressLine()

    func update(_ text: @autoclosure () -> String) {
        lock.lock()
        defer { lock.unlock() }
        line.update(text())
    }

    func finish() {
        lock.lock()
        defer { lock.unlock() }
        line.finish()
    }
}
