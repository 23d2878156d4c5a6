import ArgumentParser
import CanopyBroker
import CanopyBus
import CanopyServiceKit
import CanopyTesting
import Foundation
import Logging

@main
struct BenchmarkCommand: MainCommand {
    static let configuration = CommandConfiguration(
        commandName: "canopy-bench",
        abstract: "Canopy's benchmarks: figures with a baseline measured in the same run.",
        discussion: """
            Build with -c release. Example:
              swift run -c release canopy-bench bus --seconds 3 --loads 1x1,64x1,64x16,256x16 --threads 2
              swift run -c release canopy-bench coalescing
              swift run -c release canopy-bench images
              swift run -c release canopy-bench care
              swift run -c release canopy-bench metrics --clients 64 --window 16
              swift run -c release canopy-bench transfer
              swift run -c release canopy-bench coalescing-cost
              swift run -c release canopy-bench identify
              swift run -c release canopy-bench edge
              swift run -c release canopy-bench remind
              swift run -c release canopy-bench capture
              swift run -c release canopy-bench stack
              swift run -c release canopy-bench tracing
            """,
        subcommands: [
            Bus.self, Coalescing.self, ImagesBenchmark.self, CareBenchmark.self, MetricsCost.self, TransferBenchmark.self, CoalescingCost.self,
            IdentifyBenchmark.self, RemindBenchmark.self, EdgeBenchmark.self, CaptureBenchmark.self, StackBenchmark.self, CancelBenchmark.self,
            OutboxBenchmark.self,
            StoresBenchmark.self, FailoverBenchmark.self, SnapshotBenchmark.self, TokensBenchmark.self, AccuracyBenchmark.self, TracingCost.self,
            FairnessBenchmark.self, BrokerCore.self,
            InspectChild.self, BusAllocations.self,
        ],
        defaultSubcommand: Bus.self)
}

/// Throughput and latency through the broker against `zmq_proxy`, same load, same run.
struct Bus: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract:
            "Request throughput and p50/p99 latency through canopy-broker against zmq_proxy (ROUTER to DEALER) and nats-server (when installed), pipelined clients on several threads.",
        discussion: "Example: canopy-bench bus --seconds 3 --loads 1x1,64x1,64x16,256x16 --threads 2 --workers 4")

    @Option(help: "Seconds measured per setup and load.") var seconds = 3.0
    @Option(help: "Seconds of warm-up before each measurement.") var warmUp = 0.5
    @Option(help: "Loads as CLIENTSxWINDOW (requests each client keeps in flight), comma-separated.") var loads = "1x1,64x1,64x16,256x16"
    @Option(help: "Threads the clients are spread over.") var threads = 2
    @Option(help: "Echo workers behind the broker or proxy, answering at once.") var workers = 4
    @Option(help: "Requests each worker takes at once (its credit behind the broker).") var credit = 64
    @Option(help: "Request body size in bytes.") var bodyBytes = 64
    @Option(help: "Rounds per setup; the best round counts (the machine is shared and noisy).") var rounds = 2

    func validate() throws {
        guard seconds > 0, warmUp >= 0 else { throw ValidationError("--seconds must be positive and --warm-up not negative") }
        guard credit > 0 else { throw ValidationError("--credit must be positive; 64 is the usual value") }
        guard let parsed = parsedLoads, !parsed.isEmpty else { throw ValidationError("--loads takes CLIENTSxWINDOW pairs, e.g. 1x1,64x16") }
        guard workers > 0, rounds > 0, threads > 0 else { throw ValidationError("--workers, --threads and --rounds must be positive") }
    }

    /// The loads as (clients, window), or `nil` when one is not CLIENTSxWINDOW.
    var parsedLoads: [(clients: Int, window: Int)]? {
        let pairs = loads.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).split(separator: "x").compactMap { Int($0) } }
        guard pairs.allSatisfy({ $0.count == 2 && $0[0] > 0 && $0[1] > 0 }) else { return nil }
        return pairs.map { ($0[0], $0[1]) }
    }

    func run() async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        let body = Self.body(bytes: bodyBytes)
        let request = benchRequest(operation: "echo", body: body)
        let nats = NATSBaseline.server != nil
        print(
            "canopy-bench bus: \(workers) echo workers (credit \(credit)), \(body.count)-byte bodies, clients on \(threads) thread(s), \(seconds) s per measurement, best of \(rounds), loopback TCP"
        )
        print(
            "cores: \(ProcessInfo.processInfo.activeProcessorCount); 'load CPU' is the generator's threads' CPU time over the measured time (1.00 = one core busy)"
        )
        print("")
        var table: [[String]] = [
            [
                "clients x window", "proxy req/s", "p50 µs", "p99 µs", "load CPU", "proxy µs/req", "broker req/s", "p50 µs", "p99 µs", "load CPU",
                "broker CPU", "broker µs/req", "broker/proxy", "p99 broker/proxy", "broker allocs/req",
            ] + (nats ? ["nats req/s", "p50 µs", "p99 µs", "load CPU", "nats µs/req", "broker/nats"] : [])
        ]
        for (clients, window) in parsedLoads ?? [] {
            var natsBest: (result: LoadResult, serverCPU: Double)?
            var proxyBest: (result: PipelinedLoad.Result, proxyCPU: Double)?
            var brokerBest: (result: PipelinedLoad.Result, brokerCPU: Double)?
            let load = PipelinedLoadSetup(
                clients: clients, window: window, threads: threads, request: request,
                warmUp: .milliseconds(Int64(warmUp * 1000)), duration: .milliseconds(Int64(seconds * 1000)))
            for round in 1...rounds {
                progress("  \(clients)x\(window), round \(round)/\(rounds): zmq_proxy…")
                let proxy = try await Rig(workers: workers, capacity: credit).proxy { endpoint, _ in
                    let before = threadCPUSeconds(named: "zmq-proxy")
                    let result = try load.run(endpoint)
                    return (result, (threadCPUSeconds(named: "zmq-proxy") - before) / result.seconds)
                }
                progress(" canopy-broker…")
                let broker = try await Rig(workers: workers, capacity: credit).broker(logger: logger) { endpoint, _ in
                    let before = threadCPUSeconds(named: "canopy-broker")
                    let result = try load.run(endpoint)
                    return (result, (threadCPUSeconds(named: "canopy-broker") - before) / result.seconds)
                }
                if nats {
                    progress(" nats-server…")
                    let measured = try NATSBaseline(
                        clients: clients, window: window, threads: threads, responders: workers, body: body, warmUp: load.warmUp, duration: load.duration
                    ).run()
                    if measured.0.throughput > natsBest?.result.throughput ?? -1 { natsBest = measured }
                }
                progress(" done\n")
                if proxy.0.throughput > proxyBest?.result.throughput ?? -1 { proxyBest = proxy }
                if broker.0.throughput > brokerBest?.result.throughput ?? -1 { brokerBest = broker }
            }
            guard let (proxyResult, proxyCPU) = proxyBest, let (brokerResult, brokerCPU) = brokerBest else { continue }
            progress("  \(clients)x\(window): heap allocations of the broker thread…")
            let allocations = await BusAllocations.count(
                clients: clients, window: window, threads: threads, workers: workers, credit: credit, bodyBytes: bodyBytes, seconds: seconds,
                warmUp: warmUp)
            progress(" done\n")
            let perRequest = allocations.map { String(format: "%.2f", Double($0.allocations) / Double(max(1, $0.requests))) } ?? "n/a"
            // The forwarding thread's CPU per request: what decides the ratio on a machine
            // whose cores are all busy, and steadier from run to run than throughput.
            table.append(
                [
                    "\(clients)x\(window)",
                    String(format: "%.0f", proxyResult.throughput), "\(proxyResult.p50)", "\(proxyResult.p99)",
                    String(format: "%.2f", proxyResult.generatorCoreShare),
                    String(format: "%.2f", proxyCPU * 1e6 / max(1, proxyResult.throughput)),
                    String(format: "%.0f", brokerResult.throughput), "\(brokerResult.p50)", "\(brokerResult.p99)",
                    String(format: "%.2f", brokerResult.generatorCoreShare),
                    String(format: "%.2f", brokerCPU), String(format: "%.2f", brokerCPU * 1e6 / max(1, brokerResult.throughput)),
                    String(format: "%.2f", brokerResult.throughput / proxyResult.throughput),
                    String(format: "%.2f", Double(brokerResult.p99) / Double(max(1, proxyResult.p99))), perRequest,
                ]
                    + (natsBest.map { natsResult, serverCPU in
                        [
                            String(format: "%.0f", natsResult.throughput), "\(natsResult.p50)", "\(natsResult.p99)",
                            String(format: "%.2f", natsResult.generatorCoreShare), String(format: "%.2f", serverCPU * 1e6 / max(1, natsResult.throughput)),
                            String(format: "%.2f", brokerResult.throughput / natsResult.throughput),
                        ]
                    } ?? []))
            if brokerResult.errors > 0 { print("warning: \(brokerResult.errors) error replies through the broker") }
        }
        printTable(table)
        if !nats { print("nats-server is not installed (apt-get install nats-server): no NATS columns") }
        print(
            "broker allocs/req: heap allocations of the broker's loop thread per request, counted in a run of its own, in a process of its own (malloc-interposer's hook; \(ThreadAllocations.isAvailable ? "on" : "not available here"); n/a: the counting process failed twice)"
        )
    }

    /// A JSON request body of `bytes` bytes (at least 11).
    static func body(bytes: Int) -> [UInt8] {
        Array(("{\"text\":\"" + String(repeating: "x", count: max(0, bytes - 11)) + "\"}").utf8)
    }
}

/// `canopy-bench bus-allocations`: the broker thread's heap allocations under one `bus` load,
/// counted in a process of its own, which prints `ALLOCATIONS REQUESTS`.
///
/// A process of its own because malloc-interposer 1.6.1 frees a thread's counter block when the
/// thread exits but keeps using it if that thread allocates or frees later in its exit while
/// counting is on (its thread-local pointer is never cleared): the write lands in a freed chunk
/// and glibc crashes on it (`__malloc_arena_thread_freeres`, seen in 3 of 6 runs of 8–10 s, when
/// an idle Dispatch thread exited mid-count). Such a crash now costs one count, which is tried
/// again, never the figures measured before it.
struct BusAllocations: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "bus-allocations", abstract: "Used by canopy-bench bus.", shouldDisplay: false)

    @Option var clients: Int
    @Option var window: Int
    @Option var threads: Int
    @Option var workers: Int
    @Option var credit: Int
    @Option var bodyBytes: Int
    @Option var seconds: Double
    @Option var warmUp: Double

    func run() async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        let load = PipelinedLoadSetup(
            clients: clients, window: window, threads: threads, request: benchRequest(operation: "echo", body: Bus.body(bytes: bodyBytes)),
            warmUp: .milliseconds(Int64(warmUp * 1000)), duration: .milliseconds(Int64(seconds * 1000)))
        let (result, allocations) = try await Rig(workers: workers, capacity: credit).broker(logger: logger) { endpoint, _ in
            try ThreadAllocations.count(threadNamed: "canopy-broker", after: load.warmUp, for: load.duration) { try load.run(endpoint) }
        }
        guard let allocations else { throw BenchmarkFailure("allocations cannot be counted here") }
        // Written at once (not through print's buffer), so it is out whatever way the process ends.
        FileHandle.standardOutput.write(Data("\(allocations) \(result.requests)\n".utf8))
    }

    /// Runs the count in a child process, twice at most; nil when it failed both times.
    static func count(
        clients: Int, window: Int, threads: Int, workers: Int, credit: Int, bodyBytes: Int, seconds: Double, warmUp: Double
    ) async -> (allocations: Int, requests: Int)? {
        guard ThreadAllocations.isAvailable else { return nil }
        let arguments = [
            "bus-allocations", "--clients", "\(clients)", "--window", "\(window)", "--threads", "\(threads)", "--workers", "\(workers)",
            "--credit", "\(credit)", "--body-bytes", "\(bodyBytes)", "--seconds", "\(seconds)", "--warm-up", "\(warmUp)",
        ]
        for attempt in 1...2 {
            // Start-up, the workers' registration, warm-up, the count and shutdown, with room to
            // spare: a child that hangs (a corrupted heap may deadlock rather than crash) is
            // stopped then. A crash is retried, not explained at length.
            let result = try? await runProgram(
                at: "/proc/self/exe", arguments, environment: ["SWIFT_BACKTRACE": "enable=no"], limit: warmUp + seconds + 30)
            // Counts it printed stand even if it crashed on its way out afterwards.
            let fields = (result?.output ?? "").split(whereSeparator: \.isWhitespace).compactMap { Int($0) }
            if fields.count == 2 { return (fields[0], fields[1]) }
            progress(attempt == 1 ? " (the counting process failed; again)…" : " (failed again)")
        }
        return nil
    }
}

/// One pipelined load, run the same way against any endpoint.
struct PipelinedLoadSetup: Sendable {
    var clients: Int
    var window: Int
    var threads: Int
    var request: [[UInt8]]
    var warmUp: Duration
    var duration: Duration
    var uniqueBodies = false
    var traceEvery: Int?

    func run(_ endpoint: String) throws -> PipelinedLoad.Result {
        var load = PipelinedLoad(endpoint: endpoint, clients: clients, window: window, threads: threads, request: request)
        load.uniqueBodies = uniqueBodies
        load.traceEvery = traceEvery
        return try load.run(warmUp: warmUp, duration: duration)
    }
}

/// What coalescing costs when nothing coalesces: the same pipelined load of unique bodies to
/// a coalescable operation through the broker with coalescing off and on, round by round.
struct CoalescingCost: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "coalescing-cost",
        abstract: "Broker throughput with coalescing on against off at saturation, on a pipelined load where no two requests are identical.",
        discussion: "Example: canopy-bench coalescing-cost --rounds 5 --clients 64 --window 16")

    @Option(help: "Seconds measured per setup.") var seconds = 3.0
    @Option(help: "Concurrent clients.") var clients = 64
    @Option(help: "Requests each client keeps in flight.") var window = 16
    @Option(help: "Threads the clients are spread over.") var threads = 2
    @Option(help: "Rounds; each runs off and on in turn (alternating the order).") var rounds = 5

    func run() async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        let load = PipelinedLoadSetup(
            clients: clients, window: window, threads: threads, request: benchRequest(operation: "lookup", body: Array("{}".utf8)),
            warmUp: .milliseconds(500), duration: .milliseconds(Int64(seconds * 1000)), uniqueBodies: true)
        print(
            "canopy-bench coalescing-cost: \(clients) clients x \(window) in flight, unique bodies to a coalescable operation, \(seconds) s per measurement, \(rounds) rounds"
        )
        var rows = [["round", "coalescing off req/s", "p99 µs", "coalescing on req/s", "p99 µs", "on/off"]]
        var ratios: [Double] = []
        for round in 1...rounds {
            var measured: [Bool: PipelinedLoad.Result] = [:]
            for coalescing in round % 2 == 1 ? [false, true] : [true, false] {
                progress("  round \(round)/\(rounds): coalescing \(coalescing ? "on" : "off")…\n")
                var configuration = BrokerConfiguration()
                configuration.coalescing = coalescing
                measured[coalescing] = try await Rig(workers: 4).broker(configuration: configuration, logger: logger) { endpoint, _ in try load.run(endpoint) }
            }
            guard let off = measured[false], let on = measured[true] else { continue }
            ratios.append(on.throughput / off.throughput)
            rows.append([
                "\(round)", String(format: "%.0f", off.throughput), "\(off.p99)", String(format: "%.0f", on.throughput), "\(on.p99)",
                String(format: "%.3f", on.throughput / off.throughput),
            ])
        }
        printTable(rows)
        print("median on/off: \(String(format: "%.3f", ratios.sorted()[ratios.count / 2])) (target: at least 0.95)")
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
    func broker<T: Sendable>(configuration: BrokerConfiguration = .init(), logger: Logger, _ body: @escaping @Sendable (String, EchoWorkers) throws -> T)
        async throws -> T
    {
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

    /// Runs an async `body` against a broker with echo workers behind it.
    func brokerAsync<T: Sendable>(configuration: BrokerConfiguration = .init(), logger: Logger, _ body: @escaping @Sendable (String) async throws -> T)
        async throws -> T
    {
        let broker = try BrokerServer(endpoint: "tcp://127.0.0.1:*", configuration: configuration, context: ZMQContext(), logger: logger)
        let task = Task { try await broker.run() }
        let echo = EchoWorkers(endpoint: broker.endpoint, count: workers, kind: .canopy, capacity: capacity, serviceTime: serviceTime)
        try await Task.sleep(for: .milliseconds(200)) // workers register
        let result: Result<T, any Error>
        do { result = .success(try await body(broker.endpoint)) } catch { result = .failure(error) }
        echo.stop()
        broker.stop()
        try await task.value
        return try result.get()
    }
}

/// A request frame set for the `bench` service; generators replace frame 2, the correlation.
func benchRequest(operation: String, body: [UInt8]) -> [[UInt8]] {
    WireMessage.request(
        WireRequest(
            correlation: Wire.frame(UInt64(0)), service: "bench", operation: operation,
            header: RequestHeader(timeoutMilliseconds: 30_000), body: body)
    ).encoded
}

/// Where `name` is on the PATH, if it is.
func which(_ name: String) -> String? {
    (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin").split(separator: ":")
        .map { "\($0)/\(name)" }.first { FileManager.default.isExecutableFile(atPath: $0) }
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

/// What recording metrics costs the broker: the same pipelined load with metrics on and off,
/// in turn, as throughput and as the broker thread's CPU time per request, with `zmq_proxy`
/// in the same rounds to show whether the generator or the broker sets the pace.
struct MetricsCost: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "metrics",
        abstract:
            "Broker throughput and broker-thread CPU per request with metrics on against off (and zmq_proxy, to show whether the load generator is the limit), in turn in one run.",
        discussion: "Example: canopy-bench metrics --seconds 3 --rounds 5 --clients 64 --window 16")

    @Option(help: "Seconds measured per setup.") var seconds = 3.0
    @Option(help: "Concurrent clients.") var clients = 64
    @Option(help: "Requests each client keeps in flight.") var window = 16
    @Option(help: "Threads the clients are spread over.") var threads = 2
    @Option(help: "Echo workers behind the broker or proxy.") var workers = 4
    @Option(help: "Rounds; each runs proxy, off and on in turn, and the ratios are taken round by round.") var rounds = 5

    struct Measurement {
        var result: PipelinedLoad.Result
        /// CPU time of the thread named `canopy-broker` per request, in microseconds (0 for the proxy).
        var brokerCPUMicros: Double
    }

    func run() async throws {
        _ = Observability.registry // metrics on means Prometheus, as in canopy-broker serve
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        let request = benchRequest(operation: "echo", body: Array(#"{"text":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}"#.utf8))
        let load = PipelinedLoadSetup(
            clients: clients, window: window, threads: threads, request: request,
            warmUp: .milliseconds(500), duration: .milliseconds(Int64(seconds * 1000)))
        print(
            "canopy-bench metrics: \(clients) clients x \(window) in flight on \(threads) thread(s), \(workers) echo workers, \(seconds) s per measurement, \(rounds) rounds"
        )
        var rows = [["round", "proxy req/s", "off req/s", "on req/s", "load CPU (on)", "off CPU µs/req", "on CPU µs/req", "req/s on/off", "CPU on/off"]]
        var throughputRatios: [Double] = [], cpuRatios: [Double] = []
        for round in 1...rounds {
            var measured: [String: Measurement] = [:]
            // Alternate the order so neither setup always runs on a warmer (or busier) machine.
            for setup in round % 2 == 1 ? ["proxy", "off", "on"] : ["proxy", "on", "off"] {
                progress("  round \(round)/\(rounds): \(setup == "proxy" ? "zmq_proxy" : "metrics \(setup)")…\n")
                if setup == "proxy" {
                    measured[setup] = Measurement(result: try await Rig(workers: workers).proxy { endpoint, _ in try load.run(endpoint) }, brokerCPUMicros: 0)
                } else {
                    var configuration = BrokerConfiguration()
                    configuration.metrics = setup == "on"
                    measured[setup] = try await Rig(workers: workers).broker(configuration: configuration, logger: logger) { endpoint, _ in
                        let before = threadCPUSeconds(named: "canopy-broker")
                        let result = try load.run(endpoint)
                        // The warm-up's requests are not counted: scale the CPU to the measured part.
                        let used = (threadCPUSeconds(named: "canopy-broker") - before) * result.seconds / (result.seconds + 0.5)
                        return Measurement(result: result, brokerCPUMicros: used * 1e6 / Double(max(1, result.requests)))
                    }
                }
            }
            guard let proxy = measured["proxy"], let off = measured["off"], let on = measured["on"] else { continue }
            let throughputRatio = on.result.throughput / off.result.throughput
            let cpuRatio = on.brokerCPUMicros / off.brokerCPUMicros
            throughputRatios.append(throughputRatio)
            cpuRatios.append(cpuRatio)
            rows.append([
                "\(round)", String(format: "%.0f", proxy.result.throughput), String(format: "%.0f", off.result.throughput),
                String(format: "%.0f", on.result.throughput), String(format: "%.2f", on.result.generatorCoreShare),
                String(format: "%.2f", off.brokerCPUMicros), String(format: "%.2f", on.brokerCPUMicros),
                String(format: "%.3f", throughputRatio), String(format: "%.3f", cpuRatio),
            ])
        }
        printTable(rows)
        let median = { (values: [Double]) in values.sorted()[values.count / 2] }
        print(
            "median of rounds: throughput on/off \(String(format: "%.3f", median(throughputRatios))), broker CPU per request on/off \(String(format: "%.3f", median(cpuRatios))) (target: metrics cost at most 3%)"
        )
    }
}

/// CPU time (user and system) of this process's threads named `name`, in seconds, from
/// /proc (10 ms resolution).
func threadCPUSeconds(named name: String) -> Double {
    threadCPUSeconds { $0 == name }
}

/// CPU time (user and system) of this process's threads whose name passes `test`, in seconds.
func threadCPUSeconds(where test: (String) -> Bool) -> Double {
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
    var ticks = 0
    for task in tasks {
        guard let comm = try? String(contentsOfFile: "/proc/self/task/\(task)/comm", encoding: .utf8),
            test(comm.trimmingCharacters(in: .whitespacesAndNewlines)),
            let stat = ProcStat(path: "/proc/self/task/\(task)/stat")
        else { continue }
        ticks += stat.cpuTicks
    }
    return Double(ticks) / Double(sysconf(Int32(_SC_CLK_TCK)))
}

/// A process's or thread's /proc `stat` line: its parent and the CPU it used.
struct ProcStat {
    var parent: Int32
    /// User and system time, in clock ticks.
    var cpuTicks: Int

    init?(path: String) {
        guard let stat = try? String(contentsOfFile: path, encoding: .utf8), let close = stat.lastIndex(of: ")") else { return nil }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // After the name: ppid is field 4 of the whole line; utime and stime are 14 and 15.
        guard fields.count > 12, let parent = Int32(fields[1]), let user = Int(fields[11]), let system = Int(fields[12]) else { return nil }
        self.parent = parent
        cpuTicks = user + system
    }
}
