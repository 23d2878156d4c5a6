import ArgumentParser
import AsyncHTTPClient
import CanopyDeployment
import CanopyImaging
import CanopySamples
import CanopyServiceKit
import Foundation
import Glibc
import Histogram
import NIOCore
import NIOHTTP1

/// The whole stack as processes (`canopy up`), from built binaries: (1) how long until every
/// service is healthy, against starting the same six processes at once by hand and polling
/// their `/health` (the floor: what the executables themselves take to start); (2) the
/// journey's HTTP calls, many people at once, each step's p50 and p99, against an answer the
/// edge gives without the bus (401); (3) every process's resident memory, idle and under wrk.
struct StackBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stack",
        abstract:
            "The stack as processes: canopy up to healthy against starting the processes by hand, the journey's HTTP calls, resident memory idle and under load.",
        discussion: """
            Needs the release executables next to canopy-bench (swift build -c release) and wrk for
            the load (apt-get install wrk). The journey's and the load's stack runs with the
            per-person rate limit out of the way (CANOPY_RATE_LIMIT and CANOPY_RATE_BURST at
            100,000, their most), as the load is a few people making many requests.
            Example: canopy-bench stack --rounds 3 --people 40 --at-once 1,8
            """)

    @Option(help: "Rounds of the start measurement; each setup's best and worst are printed.") var rounds = 3
    @Option(help: "People who each make the whole journey.") var people = 40
    @Option(help: "People on their journey at once, comma-separated: each count is a run of --people journeys.") var atOnce = "1,8"
    @Option(help: "Seconds of wrk load while memory is sampled.") var seconds = 10
    @Option(help: "wrk connections for the load.") var connections = 64
    @Option(help: "What to measure: start, journey, memory; comma-separated (journey and memory share one stack).") var parts = "start,journey,memory"

    /// The `--at-once` counts.
    var concurrency: [Int] { atOnce.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) } }

    func validate() throws {
        guard rounds > 0, people > 0, seconds > 0, connections > 0, !concurrency.isEmpty, concurrency.allSatisfy({ $0 > 0 }) else {
            throw ValidationError("--rounds, --people, --seconds, --connections and every --at-once count must be positive")
        }
    }

    func run() async throws {
        let executables = URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0])
            .deletingLastPathComponent()
        let missing = (["canopy"] + CanopyStack.services.map(\.executable)).filter {
            !FileManager.default.isExecutableFile(atPath: executables.appendingPathComponent($0).path)
        }
        guard missing.isEmpty else {
            throw CommandFailure("\(missing.joined(separator: ", ")) missing in \(executables.path); build them first: swift build -c release")
        }
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-stack-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: root) }
        let rig = StackRig(executables: executables, root: root)
        let parts = Set(parts.split(separator: ",").map(String.init))
        print("canopy-bench stack: executables in \(executables.path), \(ProcessInfo.processInfo.activeProcessorCount) cores")
        if parts.contains("start") { try await startTimes(rig) }
        if parts.contains("journey") || parts.contains("memory") {
            let stack = try rig.up("journey", environment: ["CANOPY_RATE_LIMIT": "100000", "CANOPY_RATE_BURST": "100000"])
            do {
                try rig.loadReferences(stack)
                let idle = rig.residentMemory(stack)
                var seeded: [String] = []
                if parts.contains("journey") {
                    for (index, atOnce) in concurrency.enumerated() { seeded += try await journeys(rig, stack, atOnce: atOnce, run: index) }
                }
                if parts.contains("memory") { try await memory(rig, stack, idle: idle, seeded: seeded) }
            } catch {
                rig.down(stack)
                throw error
            }
            rig.down(stack)
        }
    }

    // MARK: - (1) Start

    private func startTimes(_ rig: StackRig) async throws {
        print("\n(1) from built binaries to every service healthy (\(rounds) rounds; target: canopy up under 5 s)")
        var rows = [["setup", "round", "seconds", "against the processes started by hand"]]
        var worst = 0.0
        for round in 1...rounds {
            progress("  round \(round)/\(rounds): by hand…")
            let direct = try await rig.startByHand("hand-\(round)")
            progress(" canopy up (new stores)…")
            let stack = rig.layout("up-\(round)")
            let fresh = try rig.timeUp(stack)
            rig.down(stack)
            progress(" canopy up (existing stores)…")
            let again = try rig.timeUp(stack)
            rig.down(stack)
            progress(" done\n")
            worst = max(worst, fresh, again)
            rows.append(["six processes started at once by hand, /health polled every 10 ms", "\(round)", String(format: "%.2f", direct), "1.00"])
            rows.append(["canopy up --detach, new stores", "\(round)", String(format: "%.2f", fresh), String(format: "%.2f", fresh / direct)])
            rows.append(["canopy up --detach, the same stores again", "\(round)", String(format: "%.2f", again), String(format: "%.2f", again / direct)])
        }
        printTable(rows)
        print(String(format: "slowest canopy up: %.2f s (target under 5 s)", worst))
        fflush(nil)
    }

    // MARK: - (2) The journey

    /// Each person: identify a photo, accept it, the schedule, a device, snooze, complete, the
    /// next task, the plant's photos, thumbnail, palette, the collection, and (for every other
    /// person) the plant deleted. Returns `TOKEN PATH` lines of the plants left, for the load.
    private func journeys(_ rig: StackRig, _ stack: StackRig.Layout, atOnce: Int, run: Int) async throws -> [String] {
        progress("  issuing \(people) tokens…\n")
        let tokens = try (0..<people).map { try rig.token(stack, user: "journey-\(run)-\($0)") }
        // A photo of its own for everyone (the same photos again would be answered from the record).
        let photos = try (0..<people).map { try SyntheticPlant.species($0 % StackRig.species.count).photo(seed: 1_000 + run * people + $0) }
        let api = JourneyAPI(base: "http://\(stack.launch.http)")
        progress("  \(people) journeys, \(atOnce) at once…\n")
        let started = ContinuousClock.now
        let (steps, left) = try await withThrowingTaskGroup(of: ([String: Histogram<UInt64>], [String]).self) { group in
            for lane in 0..<atOnce {
                group.addTask {
                    var steps: [String: Histogram<UInt64>] = [:]
                    var left: [String] = []
                    for person in stride(from: lane, to: people, by: atOnce) {
                        left += try await api.journey(token: tokens[person], photo: photos[person], deletes: person % 2 == 1, into: &steps)
                    }
                    return (steps, left)
                }
            }
            var steps: [String: Histogram<UInt64>] = [:]
            var left: [String] = []
            for try await (laneSteps, laneLeft) in group {
                for (name, histogram) in laneSteps { steps[name, default: JourneyAPI.histogram()].add(histogram) }
                left += laneLeft
            }
            return (steps, left)
        }
        let elapsed = (ContinuousClock.now - started).seconds
        let baseline = steps[JourneyAPI.baselineStep].map { Double(max($0.valueAtPercentile(50), 1)) } ?? 1
        var rows = [["step", "calls", "p50 ms", "p99 ms", "p50 against the edge's own 401"]]
        var all = JourneyAPI.histogram()
        for name in JourneyAPI.steps {
            guard let histogram = steps[name] else { continue }
            if name != JourneyAPI.baselineStep { all.add(histogram) }
            rows.append([
                name, "\(histogram.totalCount)", Self.millis(histogram.valueAtPercentile(50)), Self.millis(histogram.valueAtPercentile(99)),
                String(format: "%.1f", Double(histogram.valueAtPercentile(50)) / baseline),
            ])
        }
        rows.append([
            "every journey call", "\(all.totalCount)", Self.millis(all.valueAtPercentile(50)), Self.millis(all.valueAtPercentile(99)),
            String(format: "%.1f", Double(all.valueAtPercentile(50)) / baseline),
        ])
        print(
            "\n(2) the journey over HTTP: \(people) people, \(atOnce) at once, every service a process (\(String(format: "%.1f", elapsed)) s, \(String(format: "%.1f", Double(people) / elapsed)) journeys/s)"
        )
        printTable(rows)
        fflush(nil)
        return left
    }

    static func millis(_ micros: UInt64) -> String { String(format: "%.2f", Double(micros) / 1_000) }

    // MARK: - (3) Memory

    private func memory(_ rig: StackRig, _ stack: StackRig.Layout, idle: [String: (rss: Int, peak: Int)], seeded: [String]) async throws {
        guard let wrk = which("wrk") else { throw CommandFailure("wrk is not installed; apt-get install wrk, then run again (or --parts start,journey)") }
        var lines = seeded
        if lines.isEmpty {
            let token = try rig.token(stack, user: "memory")
            var none: [String: Histogram<UInt64>] = [:]
            lines = try await JourneyAPI(base: "http://\(stack.launch.http)").journey(
                token: token, photo: try SyntheticPlant.species(0).photo(seed: 7), deletes: false,
                into: &none)
        }
        let afterJourneys = rig.residentMemory(stack)
        let paths = rig.root.appendingPathComponent("load.txt")
        try lines.joined(separator: "\n").appending("\n").write(to: paths, atomically: true, encoding: .utf8)
        let script = rig.root.appendingPathComponent("canopy.lua")
        try EdgeBenchmark.wrkScript.write(to: script, atomically: true, encoding: .utf8)
        progress(
            "  wrk: \(lines.count) thumbnail and next-task GETs of \(lines.count / 2) people, \(connections) connections, \(seconds) s, memory sampled every 100 ms…\n"
        )
        let sampler = Task.detached { () -> [String: Int] in
            var most: [String: Int] = [:]
            while !Task.isCancelled {
                for (name, value) in rig.residentMemory(stack) { most[name] = max(most[name] ?? 0, value.rss) }
                try? await Task.sleep(for: .milliseconds(100))
            }
            return most
        }
        let load = try WrkRunner(wrk: wrk, script: script.path).run(
            url: "http://\(stack.launch.http)/", connections: connections, seconds: seconds, paths: paths.path)
        sampler.cancel()
        let underLoad = await sampler.value
        let final = rig.residentMemory(stack)
        var rows = [["process", "idle after start MiB", "idle after the journeys MiB", "most under load MiB", "peak (VmHWM) MiB", "under load / idle"]]
        var totals = [0, 0, 0, 0]
        for name in ["canopy up (supervisor)"] + CanopyStack.services.map(\.executable) {
            let values = [idle[name]?.rss ?? 0, afterJourneys[name]?.rss ?? 0, underLoad[name] ?? 0, final[name]?.peak ?? 0]
            for index in totals.indices { totals[index] += values[index] }
            rows.append(
                [name] + values.map { String(format: "%.1f", Double($0) / 1_024) } + [String(format: "%.2f", Double(values[2]) / Double(max(values[0], 1)))])
        }
        rows.append(
            ["the whole stack"] + totals.map { String(format: "%.1f", Double($0) / 1_024) } + [
                String(format: "%.2f", Double(totals[2]) / Double(max(totals[0], 1)))
            ])
        print(
            "\n(3) resident memory of every process (VmRSS): idle, and under wrk (\(String(format: "%.0f", load.throughput)) requests/s, p50 \(load.p50) µs, p99 \(load.p99) µs, \(load.errors) errors, wrk \(String(format: "%.2f", load.generatorCoreShare)) of a core)"
        )
        printTable(rows)
    }
}

/// Stacks of real processes in directories of their own under `root`, on free ports.
struct StackRig: Sendable {
    let executables: URL
    let root: URL

    /// Species of canopy-care's catalog with made-up reference photos, as the journey test uses.
    static let species = ["Monstera deliciosa", "Ficus lyrata", "Epipremnum aureum"]

    struct Layout: Sendable {
        let directory: String
        let launch: CanopyStack.Launch
    }

    func layout(_ name: String) -> Layout {
        let directory = root.appendingPathComponent(name).path
        return Layout(
            directory: directory,
            launch: .init(
                endpoint: "tcp://127.0.0.1:\(Self.freePort())", http: "127.0.0.1:\(Self.freePort())",
                dataDirectory: directory, metricsBase: Self.freePorts(6), tokenKeyFile: directory + "/token.key"))
    }

    /// `canopy up --detach` in a new directory; returns once the stack is healthy.
    func up(_ name: String, environment: [String: String] = [:]) throws -> Layout {
        let stack = layout(name)
        _ = try timeUp(stack, environment: environment)
        return stack
    }

    /// Seconds `canopy up --detach` takes to return (every service healthy).
    func timeUp(_ stack: Layout, environment: [String: String] = [:]) throws -> Double {
        let started = ContinuousClock.now
        let output = try run(
            "canopy",
            [
                "up", "--detach", "--data-dir", stack.directory, "--broker", stack.launch.endpoint, "--http", stack.launch.http,
                "--metrics-base", "\(stack.launch.metricsBase)",
            ], environment: environment)
        guard output.status == 0 else { throw BenchmarkFailure("canopy up failed: \(output.text.suffix(1_000))") }
        return (ContinuousClock.now - started).seconds
    }

    func down(_ stack: Layout) {
        _ = try? run("canopy", ["down", "--data-dir", stack.directory])
    }

    /// The floor `canopy up` is measured against: the same six processes with the same
    /// arguments, started at once, each `/health` polled every 10 ms until all answer 200.
    func startByHand(_ name: String) async throws -> Double {
        let stack = layout(name)
        try FileManager.default.createDirectory(atPath: stack.directory, withIntermediateDirectories: true)
        _ = FileManager.default.createFile(
            atPath: stack.launch.tokenKeyFile, contents: Data(String(repeating: "k", count: 64).utf8),
            attributes: [.posixPermissions: 0o600])
        let started = ContinuousClock.now
        var processes: [Process] = []
        defer {
            for process in processes where process.isRunning { process.terminate() }
            for process in processes { process.waitUntilExit() }
        }
        for service in CanopyStack.services {
            let process = Process()
            process.executableURL = executables.appendingPathComponent(service.executable)
            process.arguments = stack.launch.arguments(service)
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            try process.run()
            processes.append(process)
        }
        var waiting = CanopyStack.services
        while !waiting.isEmpty {
            guard ContinuousClock.now - started < .seconds(120) else { throw BenchmarkFailure("\(waiting.map(\.name)) not healthy within 2 minutes") }
            var still: [CanopyStack.Service] = []
            for service in waiting where !(await Self.healthy("http://\(stack.launch.metricsAddress(service))/health")) { still.append(service) }
            waiting = still
            if !waiting.isEmpty { try await Task.sleep(for: .milliseconds(10)) }
        }
        return (ContinuousClock.now - started).seconds
    }

    static func healthy(_ url: String) async -> Bool {
        guard let response = try? await HTTPClient.shared.execute(HTTPClientRequest(url: url), timeout: .seconds(2)) else { return false }
        _ = try? await response.body.collect(upTo: 1 << 20)
        return response.status == .ok
    }

    /// The reference photos the journey's photos are matched against (canopy-identify reloads them).
    func loadReferences(_ stack: Layout) throws {
        let directory = URL(fileURLWithPath: stack.directory).appendingPathComponent("references")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        for (index, species) in Self.species.enumerated() {
            let files = try (1...3).map { seed in
                let file = directory.appendingPathComponent("\(index)-\(seed).jpg")
                try Data(try SyntheticPlant.species(index).photo(seed: seed)).write(to: file)
                return file.path
            }
            let added = try run("canopy-identify", ["reference", "add", "--data-dir", stack.directory, "--species", species] + files)
            guard added.status == 0 else { throw BenchmarkFailure("canopy-identify reference add failed: \(added.text)") }
        }
    }

    func token(_ stack: Layout, user: String) throws -> String {
        let issued = try run("canopy-api", ["token", "issue", "--user", user, "--days", "1", "--token-key-file", stack.launch.tokenKeyFile])
        guard issued.status == 0 else { throw BenchmarkFailure("canopy-api token issue failed: \(issued.text)") }
        return issued.text.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Resident and peak memory (KiB) of the supervisor and every service of `stack`, by executable.
    func residentMemory(_ stack: Layout) -> [String: (rss: Int, peak: Int)] {
        guard let data = FileManager.default.contents(atPath: stack.directory + "/stack.json"),
            let state = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
        else { return [:] }
        var memory: [String: (rss: Int, peak: Int)] = [:]
        if let supervisor = state["supervisor"] as? Int32 { memory["canopy up (supervisor)"] = processMemoryKiB(supervisor) }
        for service in state["services"] as? [[String: Any]] ?? [] {
            guard let name = service["name"] as? String, let pid = service["pid"] as? Int32,
                let executable = CanopyStack.services.first(where: { $0.name == name })?.executable
            else { continue }
            memory[executable] = processMemoryKiB(pid)
        }
        return memory
    }

    func run(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) throws -> (status: Int32, text: String) {
        let process = Process()
        process.executableURL = executables.appendingPathComponent(executable)
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    /// A TCP port on 127.0.0.1 free at this moment (the kernel's pick).
    static func freePort() -> Int { freePorts(1) }

    /// The first of `count` consecutive ports free at this moment.
    static func freePorts(_ count: Int) -> Int {
        while true {
            let first = Int.random(in: 20_000...60_000)
            if (first..<first + count).allSatisfy(portIsFree) { return first }
        }
    }

    private static func portIsFree(_ port: Int) -> Bool {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
    }
}

/// The journey's HTTP calls as an app makes them, each timed by step.
struct JourneyAPI: Sendable {
    let base: String

    static let baselineStep = "GET /v1/plants without a token (401 from the edge, no bus)"
    static let steps = [
        baselineStep, "POST /v1/identifications (a photo)", "POST /v1/identifications/{id}/accept", "GET /v1/tasks/upcoming",
        "POST /v1/devices", "POST /v1/tasks/{id}/snooze", "POST /v1/tasks/{id}/complete", "GET /v1/plants/{id}/next-task",
        "GET /v1/plants/{id}/photos", "GET /v1/photos/{id}/variants/thumbnail", "GET /v1/photos/{id}/palette", "GET /v1/plants",
        "DELETE /v1/plants/{id}",
    ]

    static func histogram() -> Histogram<UInt64> { Histogram(highestTrackableValue: 600_000_000, numberOfSignificantValueDigits: .three) }

    /// One person's journey; returns `TOKEN PATH` lines of the thumbnail and next task of the
    /// plant it keeps (none when it deletes it).
    func journey(token: String, photo: [UInt8], deletes: Bool, into steps: inout [String: Histogram<UInt64>]) async throws -> [String] {
        func call(
            _ step: Int, _ method: HTTPMethod, _ path: String, json: String? = nil, form: [UInt8]? = nil, token: String? = token,
            expect: Int = 200
        ) async throws -> [String: Any] {
            var request = HTTPClientRequest(url: base + path)
            request.method = method
            if let token { request.headers.add(name: "Authorization", value: "Bearer \(token)") }
            if let json {
                request.headers.add(name: "Content-Type", value: "application/json")
                request.body = .bytes(ByteBuffer(string: json))
            } else if let form {
                request.headers.add(name: "Content-Type", value: "multipart/form-data; boundary=canopy-bench")
                request.body = .bytes(ByteBuffer(bytes: form))
            }
            let started = ContinuousClock.now
            let response = try await HTTPClient.shared.execute(request, timeout: .seconds(60))
            let body = try await response.body.collect(upTo: 32 << 20)
            let micros = (ContinuousClock.now - started).microseconds
            guard Int(response.status.code) == expect else {
                throw BenchmarkFailure("\(method) \(path) answered \(response.status.code), not \(expect): \(String(buffer: body).prefix(300))")
            }
            _ = steps[Self.steps[step], default: Self.histogram()].record(UInt64(max(micros, 1)))
            return (try? JSONSerialization.jsonObject(with: Data(buffer: body))) as? [String: Any] ?? [:]
        }
        _ = try await call(0, .GET, "/v1/plants", token: nil, expect: 401)
        let form = MultipartForm.encode(
            [.init(name: "photo", type: "image/jpeg", bytes: photo), .init(name: "organ", bytes: Array("leaf".utf8))],
            boundary: "canopy-bench")
        let identification = try await call(1, .POST, "/v1/identifications", form: form)["id"] as? String ?? ""
        let accepted = try await call(2, .POST, "/v1/identifications/\(identification)/accept", json: #"{"rank":1,"customName":"Bench plant"}"#)
        let plant = (accepted["plant"] as? [String: Any])?["id"] as? String ?? ""
        let tasks = (try await call(3, .GET, "/v1/tasks/upcoming?days=60")["tasks"] as? [[String: Any]] ?? []).filter { $0["plantID"] as? String == plant }
        guard let task = tasks.first?["id"] as? String else { throw BenchmarkFailure("the accepted plant \(plant) has no upcoming task") }
        _ = try await call(4, .POST, "/v1/devices", json: #"{"channel":"log","address":"canopy-bench","name":"bench"}"#, expect: 201)
        let until = Date(timeIntervalSinceNow: 3_600).formatted(Date.ISO8601FormatStyle(includingFractionalSeconds: true))
        _ = try await call(5, .POST, "/v1/tasks/\(task)/snooze", json: #"{"until":"\#(until)"}"#)
        _ = try await call(6, .POST, "/v1/tasks/\(task)/complete", json: "{}")
        _ = try await call(7, .GET, "/v1/plants/\(plant)/next-task")
        let photoID = (try await call(8, .GET, "/v1/plants/\(plant)/photos")["photos"] as? [[String: Any]])?.first?["photoID"] as? String ?? ""
        _ = try await call(9, .GET, "/v1/photos/\(photoID)/variants/thumbnail")
        _ = try await call(10, .GET, "/v1/photos/\(photoID)/palette")
        _ = try await call(11, .GET, "/v1/plants?limit=20")
        guard deletes else { return ["\(token) /v1/photos/\(photoID)/variants/thumbnail", "\(token) /v1/plants/\(plant)/next-task"] }
        _ = try await call(12, .DELETE, "/v1/plants/\(plant)", expect: 204)
        return []
    }
}

/// A process's resident and peak resident memory in KiB (`VmRSS`, `VmHWM` of /proc/PID/status);
/// zeros when it is gone.
func processMemoryKiB(_ pid: Int32) -> (rss: Int, peak: Int) {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return (0, 0) }
    func field(_ name: String) -> Int {
        status.split(separator: "\n").first { $0.hasPrefix(name) }.flatMap { $0.split(separator: " ").dropFirst().first { Int($0) != nil }.flatMap { Int($0) } }
            ?? 0
    }
    return (field("VmRSS:"), field("VmHWM:"))
}
