import CanopyDeployment
import CanopyServiceKit
import Dispatch
import Foundation
import Glibc

/// Where a local stack lives and how it is reached: the same for `up`, `status`, `logs` and
/// `down`, derived from the data directory.
struct StackLayout {
    let dataDirectory: URL
    var logs: URL { dataDirectory.appendingPathComponent("logs", isDirectory: true) }
    var stateFile: URL { dataDirectory.appendingPathComponent("stack.json") }
    var tokenKey: URL { dataDirectory.appendingPathComponent("token.key") }
    /// The stack's id, made once: every service of the stack announces it on the bus, and the
    /// broker and the services refuse peers of another stack.
    var stackIDFile: URL { dataDirectory.appendingPathComponent("stack-id") }

    func log(_ service: String) -> URL { logs.appendingPathComponent("\(service).log") }

    /// The stack's state as the supervisor last wrote it, if a stack ran here.
    func state() -> StackState? {
        guard let data = try? Data(contentsOf: stateFile) else { return nil }
        return try? JSONDecoder().decode(StackState.self, from: data)
    }
}

/// What `canopy status` shows: written by the supervisor whenever something changes.
struct StackState: Codable, Equatable {
    struct Service: Codable, Equatable {
        var name: String
        var pid: Int32
        /// starting, running, restarting, stopped, failed
        var state: String
        var restarts: Int
        var metrics: String
    }

    var supervisor: Int32
    var endpoint: String
    var http: String
    var services: [Service]
    /// The supervisor stopped (after `down`, Ctrl-C, or a failed start).
    var stopped = false
    /// Where the stack's spans go (`canopy up --traces FILE`), for `canopy trace`.
    var traces: String?
    /// Whether its bus runs CurveZMQ with the keys in `<data-dir>/keys` (not with `--no-curve`).
    var curve: Bool?

    /// Whether the supervisor process is still there.
    var supervisorAlive: Bool { !stopped && kill(supervisor, 0) == 0 }
}

/// Runs the stack's services as local processes: starts the broker, then every other service
/// at once, waits until each is healthy, restarts one that exits with growing pauses (1 s
/// doubling to 30 s, back to 1 s after a minute up), records the state for `canopy status`,
/// and stops them all gracefully (SIGTERM, then SIGKILL after 15 s) when asked.
final class StackSupervisor: @unchecked Sendable {
    struct Settings {
        var layout: StackLayout
        var executables: URL
        var endpoint: String
        var http: String
        /// The broker's port offset: service metrics ports are this plus their usual offset from 9400.
        var metricsBase: Int
        /// Extra `CANOPY_*` settings for every service (a clock for demos, a log level, the database).
        var environment: [String: String] = [:]
        /// How many processes of each service run (one unless named; more only with PostgreSQL).
        var replicas: [String: Int] = [:]
        /// Where the services' spans are written (`--traces`).
        var traces: String?
        /// The stack's CurveZMQ key files (nil with `--no-curve`).
        var curve: CanopyStack.CurveFiles?
    }

    final class Child {
        let service: CanopyStack.Service
        /// `care`, or `care-2` for its second replica: its log, its row in `canopy status`.
        let name: String
        /// Which replica it is (1 for the first; a broker's is which endpoint it binds).
        let replica: Int
        /// Where its `/metrics` and `/health` listen.
        let metricsPort: Int
        /// Its data directory (a replica's own, for what it keeps apart: canopy-images' disk tier).
        let dataDirectory: String
        var process: Process?
        var restarts = 0
        var state = "starting"
        var startedAt = ContinuousClock.now
        var restartAt: ContinuousClock.Instant?
        var pause: Duration = .seconds(1)

        init(_ service: CanopyStack.Service, name: String, replica: Int, metricsPort: Int, dataDirectory: String) {
            self.service = service
            self.name = name
            self.replica = replica
            self.metricsPort = metricsPort
            self.dataDirectory = dataDirectory
        }
    }

    /// Every process of the stack, the broker first: each service's first replica on its usual
    /// metrics port, further replicas on the ports after the six (`care-2`, `care-3`, …), with
    /// data directories of their own under `<data-dir>/replicas`.
    static func children(_ settings: Settings, launch: CanopyStack.Launch) -> [Child] {
        var extra = settings.metricsBase + CanopyStack.services.count
        return CanopyStack.services.flatMap { service in
            // One broker per endpoint (`--brokers`); of the others, their replicas.
            let count = service == CanopyStack.broker ? launch.endpoints.count : max(1, settings.replicas[service.name] ?? 1)
            return (1...count).map { replica in
                guard replica > 1 else {
                    return Child(service, name: service.name, replica: 1, metricsPort: launch.metricsPort(service), dataDirectory: launch.dataDirectory)
                }
                defer { extra += 1 }
                let name = "\(service.name)-\(replica)"
                return Child(
                    service, name: name, replica: replica, metricsPort: extra,
                    dataDirectory: settings.layout.dataDirectory.appendingPathComponent("replicas/\(name)").path)
            }
        }
    }

    let settings: Settings
    private(set) var children: [Child]
    private let lock = NSLock()
    private var stopping = false

    init(settings: Settings) {
        self.settings = settings
        children = Self.children(settings, launch: Self.launch(settings))
    }

    /// What each service is started with: the stack's endpoint, addresses, directories and keys.
    var launch: CanopyStack.Launch { Self.launch(settings) }

    private static func launch(_ settings: Settings) -> CanopyStack.Launch {
        CanopyStack.Launch(
            endpoint: settings.endpoint, http: settings.http, dataDirectory: settings.layout.dataDirectory.path,
            metricsBase: settings.metricsBase, tokenKeyFile: settings.layout.tokenKey.path, curve: settings.curve)
    }

    private func start(_ child: Child) throws {
        // A replica's own directory (what it keeps apart; a second broker's captures).
        try FileManager.default.createDirectory(atPath: child.dataDirectory, withIntermediateDirectories: true)
        let process = Process()
        process.executableURL = settings.executables.appendingPathComponent(child.service.executable)
        process.arguments = launch.arguments(child.service, metricsPort: child.metricsPort, dataDirectory: child.dataDirectory, replica: child.replica)
        process.environment = ProcessInfo.processInfo.environment.merging(settings.environment) { $1 }
        let logPath = settings.layout.log(child.name).path
        if !FileManager.default.fileExists(atPath: logPath) { _ = FileManager.default.createFile(atPath: logPath, contents: nil) }
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
        log.seekToEndOfFile()
        process.standardOutput = log
        process.standardError = log
        process.standardInput = FileHandle.nullDevice
        try process.run()
        try? log.close()
        child.process = process
        child.startedAt = .now
        child.state = "starting"
    }

    /// Whether `child` is healthy: its `/health` listener answers 200 (what its own `health`
    /// command asks, without a process started for every check).
    func healthy(_ child: Child) -> Bool { healthy([child])[0] }

    /// Whether each of `children` is healthy, asked at once.
    func healthy(_ children: [Child]) -> [Bool] {
        let ports = children.map(\.metricsPort)
        let answers = Answers(count: ports.count)
        let done = DispatchSemaphore(value: 0)
        Task {
            await withTaskGroup(of: Void.self) { group in
                for (index, port) in ports.enumerated() {
                    group.addTask { answers.set(index, await HealthProbe.check(host: "127.0.0.1", port: port, timeout: 1).healthy) }
                }
            }
            done.signal()
        }
        done.wait()
        return answers.values
    }

    /// Health answers gathered from the probes' tasks.
    private final class Answers: @unchecked Sendable {
        private let lock = NSLock()
        private var answers: [Bool]
        init(count: Int) { answers = Array(repeating: false, count: count) }
        func set(_ index: Int, _ value: Bool) { lock.withLock { answers[index] = value } }
        var values: [Bool] { lock.withLock { answers } }
    }

    /// Starts the broker, and once it is healthy every other service at once (each registers
    /// with the broker as it comes up); returns when all of them are healthy. `progress` hears
    /// each step.
    func startAll(within limit: Duration = .seconds(90), progress: (String) -> Void) throws {
        try FileManager.default.createDirectory(at: settings.layout.logs, withIntermediateDirectories: true)
        for group in [Array(children.prefix(1)), Array(children.dropFirst())] {
            progress("starting \(group.map(\.name).joined(separator: ", "))…")
            for child in group { try start(child) }
            try waitUntilHealthy(group, within: limit)
        }
    }

    /// Polls `group` every 50 ms until each child is healthy; throws when one exits or the
    /// time runs out.
    private func waitUntilHealthy(_ group: [Child], within limit: Duration) throws {
        let deadline = ContinuousClock.now + limit
        var waiting = group
        while !waiting.isEmpty {
            let answers = healthy(waiting)
            for (child, healthy) in zip(waiting, answers) where healthy { child.state = "running" }
            waiting = zip(waiting, answers).filter { !$0.1 }.map(\.0)
            if answers.contains(true) { writeState() }
            for child in waiting where child.process?.isRunning != true {
                child.state = "failed"
                writeState()
                throw CommandFailure(
                    """
                    \(child.name == child.service.name ? child.service.executable : "\(child.service.executable) (\(child.name))") exited while starting (status \(child.process?.terminationStatus ?? 0)); the end of its log \
                    (\(settings.layout.log(child.name).path), canopy logs \(child.name)):
                    \(lastLines(of: child, count: 5))
                    """)
            }
            guard ContinuousClock.now < deadline else {
                throw CommandFailure(
                    "\(waiting.map(\.name).joined(separator: ", ")) did not become healthy within \(limit); see canopy logs \(waiting[0].name)")
            }
            if !waiting.isEmpty { Thread.sleep(forTimeInterval: 0.05) }
        }
    }

    /// The last `count` lines of `child`'s log (read from its last 64 KiB).
    private func lastLines(of child: Child, count: Int) -> String {
        guard let handle = FileHandle(forReadingAtPath: settings.layout.log(child.name).path) else { return "" }
        defer { try? handle.close() }
        let size = handle.seekToEndOfFile()
        handle.seek(toFileOffset: size > 65_536 ? size - 65_536 : 0)
        let text = String(decoding: handle.readDataToEndOfFile(), as: UTF8.self)
        return text.split(separator: "\n").suffix(count).map { "  \($0)" }.joined(separator: "\n")
    }

    /// Watches the children until ``stop()``: a child that exits is started again after its pause.
    func supervise(report: (String) -> Void) {
        while !isStopping {
            let now = ContinuousClock.now
            var changed = false
            for child in children {
                guard let process = child.process else { continue }
                if child.state == "restarting", let at = child.restartAt, now >= at {
                    do {
                        try start(child)
                        child.restarts += 1
                        report("restarted \(child.name) (restart \(child.restarts))")
                    } catch {
                        report("could not restart \(child.name): \(error)")
                        child.restartAt = now + child.pause
                    }
                    changed = true
                } else if child.state != "restarting", !process.isRunning, !isStopping {
                    // Up for a minute: the next failure pauses briefly again.
                    if now - child.startedAt > .seconds(60) { child.pause = .seconds(1) }
                    report("\(child.name) exited (status \(process.terminationStatus)); restarting in \(child.pause)")
                    child.state = "restarting"
                    child.restartAt = now + child.pause
                    child.pause = min(child.pause * 2, .seconds(30))
                    changed = true
                } else if child.state == "starting", process.isRunning, now - child.startedAt > .seconds(1), healthy(child) {
                    child.state = "running"
                    changed = true
                }
            }
            if changed { writeState() }
            Thread.sleep(forTimeInterval: 0.2)
        }
    }

    var isStopping: Bool {
        lock.lock()
        defer { lock.unlock() }
        return stopping
    }

    /// Asks the supervision loop to end (from a signal handler's queue).
    func requestStop() {
        lock.lock()
        stopping = true
        lock.unlock()
    }

    /// Stops every child, last started first: SIGTERM, then SIGKILL after `grace`.
    func stopAll(grace: Duration = .seconds(15)) {
        requestStop()
        for child in children.reversed() {
            guard let process = child.process, process.isRunning else {
                child.state = "stopped"
                continue
            }
            process.terminate()
            let deadline = ContinuousClock.now + grace
            while process.isRunning && ContinuousClock.now < deadline { Thread.sleep(forTimeInterval: 0.05) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
            child.state = "stopped"
        }
        writeState(stopped: true)
    }

    /// Records the state for `canopy status` (written whole, then renamed).
    func writeState(stopped: Bool = false) {
        let state = StackState(
            supervisor: getpid(), endpoint: settings.endpoint, http: settings.http,
            services: children.map {
                .init(
                    name: $0.name, pid: $0.process?.processIdentifier ?? 0, state: $0.state, restarts: $0.restarts,
                    metrics: "127.0.0.1:\($0.metricsPort)")
            },
            stopped: stopped, traces: settings.traces, curve: settings.curve != nil)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        try? encoder.encode(state).write(to: settings.layout.stateFile, options: .atomic)
    }

    /// The status table.
    static func table(_ state: StackState) -> String {
        var table = Table("SERVICE", "PID", "STATE", "RESTARTS", "METRICS")
        for service in state.services {
            let alive = service.pid > 0 && kill(service.pid, 0) == 0
            let shown = state.supervisorAlive ? service.state : (alive ? "orphaned" : "stopped")
            table.append([service.name, service.pid > 0 ? "\(service.pid)" : "-", shown, "\(service.restarts)", "http://\(service.metrics)/metrics"])
        }
        return table.render()
    }
}
