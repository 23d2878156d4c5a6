import CanopyBroker
import CanopyBus
import CanopyMessages
import CanopyServiceKit
import Foundation
import Logging
import ServiceLifecycle
import Synchronization

/// A real broker, workers and clients on `tcp://127.0.0.1` with an ephemeral port, for live
/// tests. Everything it starts is stopped by ``shutdown()``; ``withLiveBus(configuration:_:)``
/// calls that also when the test body throws.
public final class LiveBus: @unchecked Sendable {
    /// The shared ZeroMQ context.
    public let context = ZMQContext()
    /// The broker's settings.
    public let configuration: BrokerConfiguration
    /// The broker's CurveZMQ settings, when it runs with CURVE.
    public let curve: CurveServerSettings?
    /// A logger that writes only errors (set `CANOPY_TEST_LOG_LEVEL` for more).
    public let logger: Logger
    /// The broker now (a new one after ``restartBroker()``).
    public private(set) var broker: BrokerServer
    private var brokerTask: Task<Void, Error>
    private var runners: [(ServiceRunner, Task<Void, Error>)] = []
    private var groups: [(ServiceGroup, Task<Void, Error>)] = []
    private var clients: [BusClient] = []
    private var processes: [Process] = []

    /// The broker's endpoint, with its port.
    public var endpoint: String { broker.endpoint }

    /// Starts a broker on `tcp://127.0.0.1:*`, with CurveZMQ when `curve` is given.
    public init(configuration: BrokerConfiguration = .testing, curve: CurveServerSettings? = nil) throws {
        _ = Observability.registry // metrics are bound to Prometheus before anything creates one
        self.configuration = configuration
        self.curve = curve
        logger = Self.testLogger
        let broker = try BrokerServer(endpoint: "tcp://127.0.0.1:*", configuration: configuration, curve: curve, context: context, logger: logger)
        self.broker = broker
        brokerTask = Task { try await broker.run() }
    }

    /// The tests' logger: quiet (critical only) unless `CANOPY_TEST_LOG_LEVEL` names a level.
    public static var testLogger: Logger {
        var logger = Logger(label: "canopy-test")
        logger.logLevel = ProcessInfo.processInfo.environment["CANOPY_TEST_LOG_LEVEL"].flatMap(Logger.Level.init(rawValue:)) ?? .critical
        return logger
    }

    /// Stops the broker (its workers and clients stay, and notice).
    public func stopBroker() {
        broker.stop()
    }

    /// Stops the broker (a graceful stop with the configured drain time) and starts a new one
    /// on the same endpoint.
    public func restartBroker() async throws {
        let endpoint = broker.endpoint
        broker.stop()
        _ = try? await brokerTask.value
        var lastError: Error?
        for _ in 0..<50 { // the port can take a moment to be free again
            do {
                let broker = try BrokerServer(endpoint: endpoint, configuration: configuration, curve: curve, context: context, logger: logger)
                self.broker = broker
                brokerTask = Task { try await broker.run() }
                return
            } catch {
                lastError = error
                try await Task.sleep(for: .milliseconds(50))
            }
        }
        throw lastError!
    }

    /// Starts an in-process worker of the `test` service.
    @discardableResult
    public func startWorker(name: String, credit: Int = 4) -> TestWorkerService {
        let service = TestWorkerService(workerName: name)
        startRunner(service, credit: credit)
        return service
    }

    /// Starts an in-process worker for any service (over CURVE with `curve`).
    @discardableResult
    public func startRunner(_ service: some BusService, credit: Int = 4, curve: CurveClientSettings? = nil) -> ServiceRunner {
        let runner = ServiceRunner(service: service, configuration: runnerConfiguration(credit: credit, curve: curve), context: context, logger: logger)
        runners.append((runner, Task { try await runner.run() }))
        return runner
    }

    /// A worker's settings for this broker: its endpoint and heartbeats, with `credit`.
    public func runnerConfiguration(credit: Int = 4, curve: CurveClientSettings? = nil) -> ServiceRunner.Configuration {
        var runnerConfiguration = ServiceRunner.Configuration(endpoint: endpoint)
        runnerConfiguration.credit = credit
        runnerConfiguration.curve = curve
        runnerConfiguration.heartbeatInterval = configuration.heartbeatInterval
        runnerConfiguration.liveness = configuration.liveness
        return runnerConfiguration
    }

    /// Starts `canopy-test-worker` as a separate process (for SIGKILL tests).
    public func startWorkerProcess(name: String, credit: Int = 4) throws -> Process {
        let process = Process()
        process.executableURL = try Self.executable("canopy-test-worker")
        process.arguments = [
            "--endpoint", endpoint, "--name", name, "--credit", "\(credit)",
            "--heartbeat-ms", "\(configuration.heartbeatInterval.wholeMilliseconds)",
            "--liveness", "\(configuration.liveness)", "--log-level", "critical",
        ]
        try process.run()
        processes.append(process)
        return process
    }

    /// A new client of the broker (over CURVE with `curve`); `asService` makes its requests
    /// as a service's own client does (operations of ``Access/service`` take only those).
    public func client(timeout: Duration = .seconds(10), curve: CurveClientSettings? = nil, asService: Bool = false) throws -> BusClient {
        var clientConfiguration = BusClient.Configuration(endpoint: endpoint)
        clientConfiguration.defaultTimeout = timeout
        clientConfiguration.curve = curve
        clientConfiguration.derived = asService
        let client = try BusClient(configuration: clientConfiguration, context: context, logger: logger)
        clients.append(client)
        return client
    }

    /// Waits until `service` has `workers` workers, polling `broker.services` (over CURVE
    /// with `curve`).
    public func waitForWorkers(
        _ workers: Int, service: String = TestService.name, within limit: Duration = .seconds(30),
        curve: CurveClientSettings? = nil
    ) async throws {
        let client = try client(timeout: .seconds(1), curve: curve)
        let reached = try await eventually(within: limit, every: .milliseconds(20)) {
            (try? await client.call(Broker.Services.self, .init()))?.first { $0.name == service }?.workers == workers
        }
        if reached { return }
        throw LiveBusError("'\(service)' did not reach \(workers) worker(s) within \(limit)")
    }

    /// Waits until the broker's `broker.stats` shows `service` with `inFlight` requests held
    /// by workers and `queued` waiting, so a test orders its steps by state, not by sleeping.
    public func waitForLoad(
        inFlight: Int, queued: Int = 0, service: String = TestService.name,
        within limit: Duration = .seconds(30)
    ) async throws {
        let client = try client(timeout: .seconds(1))
        let reached = try await eventually(within: limit) {
            guard let figures = (try? await client.call(Broker.Stats.self, .init()))?.services.first(where: { $0.name == service }) else { return false }
            return figures.inFlight == inFlight && figures.queued == queued
        }
        if reached { return }
        throw LiveBusError("'\(service)' did not reach \(inFlight) in flight and \(queued) queued within \(limit)")
    }

    /// Runs what a build function made (`buildCareService`, `buildBroker`, …) in one
    /// `ServiceGroup`, as `serve` runs it, until ``shutdown()`` shuts it down gracefully.
    public func run(_ services: [any Service]) {
        let group = serviceGroup(services, signals: [], logger: logger)
        groups.append((group, Task { try await group.run() }))
    }

    /// Stops clients, workers, worker processes and the broker.
    public func shutdown() async {
        clients.forEach { $0.close() }
        for process in processes where process.isRunning {
            process.terminate()
            process.waitUntilExit()
        }
        for (group, task) in groups {
            await group.triggerGracefulShutdown()
            _ = try? await task.value
        }
        for (runner, task) in runners {
            runner.stop()
            _ = try? await task.value
        }
        broker.stop()
        _ = try? await brokerTask.value
    }

    /// The path of an executable built next to the test bundle.
    public static func executable(_ name: String) throws -> URL {
        var directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        for _ in 0..<3 {
            let candidate = directory.appendingPathComponent(name)
            if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
            directory.deleteLastPathComponent()
        }
        throw LiveBusError("\(name) is not built next to the tests; run `swift build` first")
    }
}

extension Array where Element == any Service {
    /// The first of these services that is a `T`, such as the ``OperatingEndpoint`` a build
    /// function appended.
    public func first<T>(_ type: T.Type) -> T? {
        lazy.compactMap { $0 as? T }.first
    }
}

/// A live-test setup failure.
public struct LiveBusError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}

extension BrokerConfiguration {
    /// Fast heartbeats (100 ms) so live tests see a killed peer within a second; 10 missed
    /// before a peer counts as lost, because the whole suite on two cores stalls a process for
    /// more than the 300 ms that 3 missed would allow (a live worker was declared lost).
    public static var testing: BrokerConfiguration {
        var configuration = BrokerConfiguration()
        configuration.heartbeatInterval = .milliseconds(100)
        configuration.liveness = 10
        configuration.drainTimeout = .milliseconds(500)
        return configuration
    }
}

/// Runs `body` with a fresh live bus and shuts it down afterwards, also when `body` throws.
public func withLiveBus<T>(
    configuration: BrokerConfiguration = .testing, curve: CurveServerSettings? = nil,
    _ body: (LiveBus) async throws -> T
) async throws -> T {
    let bus = try LiveBus(configuration: configuration, curve: curve)
    return try await ending(with: bus.shutdown) { try await body(bus) }
}

/// Runs `body`, then `cleanup`, also when `body` throws.
func ending<T>(with cleanup: () async -> Void, _ body: () async throws -> T) async throws -> T {
    let result: T
    do {
        result = try await body()
    } catch {
        await cleanup()
        throw error
    }
    await cleanup()
    return result
}

/// What a finished process printed and how it ended.
public struct ProcessResult: Sendable {
    public var status: Int32
    public var output: String
    public var errors: String

    public init(status: Int32, output: String, errors: String) {
        self.status = status
        self.output = output
        self.errors = errors
    }
}

/// Runs an executable built next to the tests and waits for it (at most `limit`; then it is
/// terminated), for tests that use the CLIs as an operator does. The waiting happens on a
/// Dispatch thread (``offThePool(_:)``): blocking the cooperative pool, one thread per core,
/// would starve the in-process brokers and workers the executable talks to.
public func runExecutable(_ name: String, _ arguments: [String], environment: [String: String] = [:], limit: TimeInterval = 20) async throws -> ProcessResult {
    let executable = try LiveBus.executable(name)
    return try await offThePool { try runBlocking(executable, arguments, environment: environment, limit: limit) }
}

/// Runs a program from elsewhere (a test peer such as schemathesis) as ``runExecutable(_:_:environment:limit:)`` does.
public func runProgram(
    at path: String, _ arguments: [String], environment: [String: String] = [:], directory: URL? = nil,
    limit: TimeInterval = 20
) async throws -> ProcessResult {
    try await offThePool { try runBlocking(URL(fileURLWithPath: path), arguments, environment: environment, directory: directory, limit: limit) }
}

private func runBlocking(
    _ executable: URL, _ arguments: [String], environment: [String: String], directory: URL? = nil,
    limit: TimeInterval
) throws -> ProcessResult {
    let process = Process()
    process.executableURL = executable
    if let directory { process.currentDirectoryURL = directory }
    process.arguments = arguments
    process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
    let output = Pipe(), errors = Pipe()
    process.standardOutput = output
    process.standardError = errors
    try process.run()
    // Read while it runs, so a chatty process never blocks on a full pipe.
    let collected = Mutex((output: Data(), errors: Data()))
    let reading = DispatchGroup()
    DispatchQueue.global().async(group: reading) {
        let data = output.fileHandleForReading.readDataToEndOfFile()
        collected.withLock { $0.output = data }
    }
    DispatchQueue.global().async(group: reading) {
        let data = errors.fileHandleForReading.readDataToEndOfFile()
        collected.withLock { $0.errors = data }
    }
    let deadline = Date().addingTimeInterval(limit)
    // Gone and reaped, though Foundation may not have noticed (below).
    let pid = process.processIdentifier
    func gone() -> Bool { kill(pid, 0) != 0 && errno == ESRCH }
    while process.isRunning, !gone(), Date() < deadline { usleep(10_000) }
    if process.isRunning { process.terminate() }
    // One that ignores SIGTERM too is killed after 20 s more, so a test fails instead of hanging.
    let killAt = Date().addingTimeInterval(20)
    while process.isRunning, Date() < killAt { usleep(10_000) }
    if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    // Not waitUntilExit(): once in a long while Foundation's Process misses a quick child's
    // exit (the child is gone, isRunning stays true) and it spins for ever; a test fails instead.
    let reportAt = Date().addingTimeInterval(10)
    while process.isRunning, Date() < reportAt { usleep(10_000) }
    guard !process.isRunning else {
        throw ProcessNotReported(
            description: "\(executable.lastPathComponent) \(arguments.joined(separator: " ").prefix(200)) ended, but Foundation never reported its exit")
    }
    reading.wait()
    let (out, err) = collected.withLock { ($0.output, $0.errors) }
    return ProcessResult(status: process.terminationStatus, output: String(decoding: out, as: UTF8.self), errors: String(decoding: err, as: UTF8.self))
}

/// A program whose exit Foundation's `Process` never reported (see ``runProgram(at:_:environment:directory:limit:)``).
public struct ProcessNotReported: Error, CustomStringConvertible {
    public let description: String
}

/// Runs `services` in one `ServiceGroup` while `body` runs, then shuts them down gracefully,
/// also when `body` throws (local HTTP servers, a dispatcher, a channel).
public func withRunning<T>(_ services: [any Service], logger: Logger, _ body: () async throws -> T) async throws -> T {
    let group = serviceGroup(services, signals: [], logger: logger)
    let running = Task { try await group.run() }
    defer { running.cancel() }
    let result: T
    do {
        result = try await body()
    } catch {
        await group.triggerGracefulShutdown()
        _ = try? await running.value
        throw error
    }
    await group.triggerGracefulShutdown()
    _ = try? await running.value
    return result
}

/// The operator's CurveZMQ settings of a `canopy up` stack whose data directory is `data`
/// (its keys in `<data>/keys`, made at its first start): what a test's own bus client of
/// that stack presents, as `canopy send --data-dir` does.
public func stackOperatorCurve(data: String) throws -> CurveClientSettings {
    CurveClientSettings(serverKeys: [try Curve.publicKey("\(data)/keys/broker.pub")], keyPair: try Curve.readKeyPair(file: "\(data)/keys/operator.key"))
}
