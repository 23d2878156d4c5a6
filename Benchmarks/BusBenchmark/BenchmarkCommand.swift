import ArgumentParser
import CanopyBus
import CanopyServiceKit
import Foundation
import Logging

@main
struct BenchmarkCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "canopy-bench",
        abstract: "Canopy's benchmarks: figures with a baseline measured in the same run.",
        discussion: """
            Build with -c release. Example:
              swift run -c release canopy-bench bus --seconds 3 --clients 1,16,64 --workers 4
              swift run -c release canopy-bench coalescing
              swift run -c release canopy-bench images
              swift run -c release canopy-bench care
              swift run -c release canopy-bench metrics --clients 64
            """,
        subcommands: [Bus.self, Coalescing.self, ImagesBenchmark.self, CareBenchmark.self, MetricsCost.self],
        defaultSubcommand: Bus.self)
}

/// Throughput and latency through the broker against `zmq_proxy`, same load, same run.
struct Bus: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Request throughput and p50/p99 latency through canopy-broker against zmq_proxy (ROUTER to DEALER).",
        discussion: "Example: canopy-bench bus --seconds 3 --clients 1,16,64 --workers 4")

    @Option(help: "Seconds measured per setup and client count.") var seconds = 3.0
    @Option(help: "Seconds of warm-up before each measurement.") var warmUp = 0.5
    @Option(help: "Concurrent clients, comma-separated.") var clients = "1,16,64"
    @Option(help: "Echo workers behind the broker or proxy.") var workers = 4
    @Option(help: "Request body size in bytes.") var bodyBytes = 64
    @Option(help: "Rounds per setup; the best round counts (the machine is shared and noisy).") var rounds = 2

    func validate() throws {
        guard seconds > 0, warmUp >= 0 else { throw ValidationError("--seconds must be positive and --warm-up not negative") }
        guard parsedClients.allSatisfy({ $0 > 0 }), !parsedClients.isEmpty else { throw ValidationError("--clients takes positive numbers, e.g. 1,16,64") }
        guard workers > 0, rounds > 0 else { throw ValidationError("--workers and --rounds must be positive") }
    }

    var parsedClients: [Int] { clients.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) } }

    func run() async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        let body = Array(("{\"text\":\"" + String(repeating: "x", count: max(0, bodyBytes - 11)) + "\"}").utf8)
        let request = benchRequest(operation: "echo", body: body)
        print("canopy-bench bus: \(workers) echo workers, \(body.count)-byte bodies, \(seconds) s per measurement, best of \(rounds), loopback TCP")
        print("")
        var table: [[String]] = [["clients", "proxy req/s", "proxy p50 µs", "proxy p99 µs", "broker req/s", "broker p50 µs", "broker p99 µs", "broker/proxy"]]
        for clientCount in parsedClients {
            var proxyBest: LoadGenerator.Result?
            var brokerBest: LoadGenerator.Result?
            for round in 1...rounds {
                FileHandle.standardError.write(Data("  \(clientCount) client(s), round \(round)/\(rounds): zmq_proxy…".utf8))
                let proxy = try await measureProxy(clients: clientCount, request: request)
                FileHandle.standardError.write(Data(" canopy-broker…".utf8))
                let broker = try await measureBroker(clients: clientCount, request: request, logger: logger)
                FileHandle.standardError.write(Data(" done\n".utf8))
                if proxy.throughput > proxyBest?.throughput ?? -1 { proxyBest = proxy }
                if broker.throughput > brokerBest?.throughput ?? -1 { brokerBest = broker }
            }
            guard let proxyBest, let brokerBest else { continue }
            table.append([
                "\(clientCount)",
                String(format: "%.0f", proxyBest.throughput), "\(proxyBest.p50)", "\(proxyBest.p99)",
                String(format: "%.0f", brokerBest.throughput), "\(brokerBest.p50)", "\(brokerBest.p99)",
                String(format: "%.2f", brokerBest.throughput / proxyBest.throughput),
            ])
            if brokerBest.errors > 0 { print("warning: \(brokerBest.errors) error replies through the broker") }
        }
        printTable(table)
    }

    private var warmUpDuration: Duration { .milliseconds(Int64(warmUp * 1000)) }
    private var measureDuration: Duration { .milliseconds(Int64(seconds * 1000)) }

    private func measureProxy(clients: Int, request: [[UInt8]]) async throws -> LoadGenerator.Result {
        try await Rig(workers: workers).proxy { endpoint, _ in
            try LoadGenerator(endpoint: endpoint, clients: clients, request: request).run(warmUp: warmUpDuration, duration: measureDuration)
        }
    }

    private func measureBroker(clients: Int, request: [[UInt8]], logger: Logger) async throws -> LoadGenerator.Result {
        try await Rig(workers: workers).broker(logger: logger) { endpoint, _ in
            try LoadGenerator(endpoint: endpoint, clients: clients, request: request).run(warmUp: warmUpDuration, duration: measureDuration)
        }
    }
}

/// Echo workers behind a broker or a `zmq_proxy`, for the length of one measurement.
struct Rig {
    var workers: Int
    var capacity = 64
    var serviceTime: Duration = .zero

    /// Runs `body` on its own thread (it blocks) against `zmq_proxy` with echo workers behind it.
    func proxy<T: Sendable>(_ body: @escaping @Sendable (String, EchoWorkers) throws -> T) async throws -> T {
        let proxy = try ZMQProxy()
        let echo = EchoWorkers(endpoint: proxy.backend, count: workers, kind: .proxy, capacity: capacity, serviceTime: serviceTime)
        defer {
            echo.stop()
            try? proxy.stop()
        }
        return try await Task.detached { try body(proxy.frontend, echo) }.value
    }

    /// Runs `body` on its own thread against a broker with echo workers behind it.
    func broker<T: Sendable>(configuration: BrokerConfiguration = .init(), logger: Logger, _ body: @escaping @Sendable (String, EchoWorkers) throws -> T) async throws -> T {
        let broker = try BrokerServer(endpoint: "tcp://127.0.0.1:*", configuration: configuration, context: ZMQContext(), logger: logger)
        let task = Task { try await broker.run() }
        let echo = EchoWorkers(endpoint: broker.endpoint, count: workers, kind: .canopy, capacity: capacity, serviceTime: serviceTime)
        try await Task.sleep(for: .milliseconds(200)) // workers register
        let result = await Task.detached { Result { try body(broker.endpoint, echo) } }.value
        echo.stop()
        broker.stop()
        try await task.value
        return try result.get()
    }
}

/// A request frame set for the `bench` service.
func benchRequest(operation: String, body: [UInt8]) -> [[UInt8]] {
    [Wire.version, Wire.Command.request.frame, Wire.frame(UInt64(0)), Array("bench".utf8), Array(operation.utf8),
     RequestHeader(timeoutMilliseconds: 30_000).frame, body]
}

func progress(_ text: String) {
    FileHandle.standardError.write(Data(text.utf8))
}

func printTable(_ rows: [[String]]) {
    let widths = rows[0].indices.map { column in rows.map { $0[column].count }.max()! }
    for row in rows {
        print(row.indices.map { String(repeating: " ", count: widths[$0] - row[$0].count) + row[$0] }.joined(separator: "  "))
    }
}

/// What recording metrics costs the broker: the same load with metrics on and off, in turn,
/// as throughput and as the broker thread's CPU time per request. The CPU figure is the one
/// to trust while the load generator is the limit (throughput then barely moves).
struct MetricsCost: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "metrics",
        abstract: "Broker throughput and broker-thread CPU per request with metrics on against off (and zmq_proxy, to show whether the load generator is the limit), in turn in one run.",
        discussion: "Example: canopy-bench metrics --seconds 3 --rounds 3 --clients 64")

    @Option(help: "Seconds measured per setup.") var seconds = 3.0
    @Option(help: "Concurrent clients.") var clients = 64
    @Option(help: "Echo workers behind the broker or proxy.") var workers = 4
    @Option(help: "Rounds per setup; the best round counts.") var rounds = 3

    struct Measurement {
        var result: LoadGenerator.Result
        /// CPU time of the thread named `canopy-broker` per request, in microseconds (0 for the proxy).
        var brokerCPUMicros: Double
    }

    func run() async throws {
        _ = Observability.registry // metrics on means Prometheus, as in canopy-broker serve
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        let request = benchRequest(operation: "echo", body: Array(#"{"text":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}"#.utf8))
        let duration = Duration.milliseconds(Int64(seconds * 1000))
        let (clients, seconds) = (self.clients, self.seconds)
        print("canopy-bench metrics: \(clients) clients, \(workers) echo workers, \(seconds) s per measurement, best of \(rounds)")
        var best: [String: Measurement] = [:]
        var cpu: [String: [Double]] = [:]
        for round in 1...rounds {
            for setup in ["proxy", "off", "on"] {
                progress("  round \(round)/\(rounds): \(setup == "proxy" ? "zmq_proxy" : "metrics \(setup)")…\n")
                let measurement: Measurement
                if setup == "proxy" {
                    measurement = try await Rig(workers: workers).proxy { endpoint, _ in
                        Measurement(result: try LoadGenerator(endpoint: endpoint, clients: clients, request: request).run(warmUp: .milliseconds(500), duration: duration),
                                    brokerCPUMicros: 0)
                    }
                } else {
                    var configuration = BrokerConfiguration()
                    configuration.metrics = setup == "on"
                    measurement = try await Rig(workers: workers).broker(configuration: configuration, logger: logger) { endpoint, _ in
                        _ = try LoadGenerator(endpoint: endpoint, clients: clients, request: request).run(warmUp: .zero, duration: .milliseconds(500))
                        let before = threadCPUSeconds(named: "canopy-broker")
                        let result = try LoadGenerator(endpoint: endpoint, clients: clients, request: request).run(warmUp: .zero, duration: duration)
                        let used = threadCPUSeconds(named: "canopy-broker") - before
                        return Measurement(result: result, brokerCPUMicros: used * 1e6 / Double(max(1, result.requests)))
                    }
                    cpu[setup, default: []].append(measurement.brokerCPUMicros)
                }
                if measurement.result.throughput > best[setup]?.result.throughput ?? -1 { best[setup] = measurement }
            }
        }
        guard let proxy = best["proxy"]?.result, let off = best["off"]?.result, let on = best["on"]?.result,
              let offCPU = cpu["off"]?.min(), let onCPU = cpu["on"]?.min() else { return }
        printTable([
            ["setup", "req/s", "p50 µs", "p99 µs", "broker CPU µs/request (least of rounds)", "req/s against metrics off"],
            ["zmq_proxy", String(format: "%.0f", proxy.throughput), "\(proxy.p50)", "\(proxy.p99)", "-", String(format: "%.3f", proxy.throughput / off.throughput)],
            ["broker, metrics off", String(format: "%.0f", off.throughput), "\(off.p50)", "\(off.p99)", String(format: "%.2f", offCPU), "1.000"],
            ["broker, metrics on", String(format: "%.0f", on.throughput), "\(on.p50)", "\(on.p99)", String(format: "%.2f", onCPU), String(format: "%.3f", on.throughput / off.throughput)],
        ])
        print("broker CPU per request, metrics on against off: \(String(format: "%.3f", onCPU / offCPU)) (target: at most 1.03)")
    }
}

/// CPU time (user and system) of this process's threads named `name`, in seconds, from
/// /proc (10 ms resolution).
func threadCPUSeconds(named name: String) -> Double {
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
    var ticks = 0
    for task in tasks {
        guard let comm = try? String(contentsOfFile: "/proc/self/task/\(task)/comm", encoding: .utf8),
              comm.trimmingCharacters(in: .whitespacesAndNewlines) == name,
              let stat = try? String(contentsOfFile: "/proc/self/task/\(task)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")")
        else { continue }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // After the name: state is field 3 of the whole line; utime and stime are 14 and 15.
        if fields.count > 12, let user = Int(fields[11]), let system = Int(fields[12]) { ticks += user + system }
    }
    return Double(ticks) / Double(sysconf(Int32(_SC_CLK_TCK)))
}
