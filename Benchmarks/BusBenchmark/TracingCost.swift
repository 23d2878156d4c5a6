import ArgumentParser
import AsyncHTTPClient
import CanopyAPI
import CanopyBroker
import CanopyBus
import CanopyCare
import CanopyMessages
import CanopyServiceKit
import CanopyTesting
import CanopyWire
import Collections
import Foundation
import Glibc
import Logging
import Tracing

/// What tracing costs, in the same run: (1) the broker under the pipelined load with no
/// tracer against a tracer with nothing sampled, 1% and 100% of requests carrying a sampled
/// trace context (its waiter, flight and dispatch spans exported over OTLP/HTTP); (2)
/// canopy-api, as a process, under wrk with no collector (no tracer and no tracing middleware:
/// no tracing code on the path), a collector named but `OTEL_SDK_DISABLED=true`, a collector
/// with nothing sampled, 1% and 100% sampled. Spans go to a receiver in this process that reads nothing, so the collector's
/// work does not count; the exporter's does, in the process that exports.
struct TracingCost: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tracing",
        abstract: "Broker and edge throughput and p99 with tracing off, sampled at 1% and at 100%, against none, in turn in one run.",
        discussion: "Needs wrk for the edge part (apt-get install wrk). Example: canopy-bench tracing --rounds 3 --seconds 3 --parts broker,edge")

    @Option(help: "Seconds measured per setup.") var seconds = 3
    @Option(help: "Rounds; each runs every setup in turn (the order rotating), and ratios are taken round by round.") var rounds = 3
    @Option(help: "Broker: concurrent clients.") var clients = 64
    @Option(help: "Broker: requests each client keeps in flight.") var window = 16
    @Option(help: "Edge: wrk's connections.") var connections = 32
    @Option(help: "What to measure: state, broker, edge; comma-separated.") var parts = "state,broker,edge"
    @Option(help: "State: requests routed per setup and round.") var requests = 300_000
    @Option(help: "State: requests held at once, by 4 workers of credit 64 and the service's queue (1,024: as 64 clients x 16 in flight; 1: one at a time).")
    var inFlight = 1
    @Option(help: "State: run only this setup (no tracer, tracer nothing sampled, 1%, 100%), for counting instructions with perf stat.") var only: String?

    func run() async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        let collector = OTLPReceiver(logger: logger, discarding: true)
        let server = Task { try await collector.application.run() }
        defer { server.cancel() }
        let endpoint = try await collector.endpoint()
        let parts = Set(parts.split(separator: ",").map(String.init))
        if parts.contains("state") { try await stateMachine(endpoint: endpoint, logger: logger) }
        if parts.contains("broker") { try await broker(endpoint: endpoint, logger: logger) }
        if parts.contains("edge") { try await edge(endpoint: endpoint, logger: logger) }
    }

    // MARK: - The broker's state machine

    /// The state machine as the broker's loop drives it under a pipelined load: `inFlight`
    /// requests held at once (4 workers of credit 64 hold 256, the queue the rest), two
    /// timeouts in turn (`request` gives each request's frames), each
    /// message stamped with the time as it comes, the worker answering the oldest it holds,
    /// timers looked at every 32 messages as the loop does after a burst. A new request
    /// follows each reply. ns per request, measured after one warm-up pass of `inFlight`.
    static func stateUnderLoad(
        _ state: inout BrokerState, requests: Int, inFlight: Int, ready: [[UInt8]], reply: [UInt8],
        request: () -> [[UInt8]]
    ) throws -> Double {
        let workers = (0..<4).map { Array("worker-\($0)".utf8) }
        let client = Array("client".utf8)
        var out: [BrokerState.Directive] = []
        out.reserveCapacity(64)
        for worker in workers { state.receive(ready, from: worker, now: .now, into: &out) }
        // Correlation ids cycle over twice what is held, so an id comes back only once answered.
        let ids = (0..<(2 * inFlight)).map { Wire.frame(UInt64($0 + 1)) }
        var dispatched = Deque<(worker: [UInt8], id: UInt64)>()
        func collect() {
            for directive in out {
                if case .send(let to, .dispatch(let id, _, _, _, _)) = directive { dispatched.append((to, id)) }
            }
            out.removeAll(keepingCapacity: true)
        }
        var sent = 0
        func send() {
            var frames = request()
            frames[2] = ids[sent % ids.count]
            sent += 1
            state.receive(frames, from: client, now: .now, into: &out)
            collect()
        }
        for _ in 0..<inFlight { send() }
        var start = ContinuousClock.now
        for index in 0..<(requests + inFlight) {
            if index == inFlight { start = .now } // the first pass warms up
            guard let (worker, id) = dispatched.popFirst() else { throw BenchmarkFailure("the state machine held no request at a worker") }
            state.receive(WireMessage.workerReply(requestID: id, failed: false, body: reply).encoded, from: worker, now: .now, into: &out)
            collect()
            send()
            if index % 32 == 0 {
                _ = state.nextWakeup()
                state.tick(now: .now, into: &out)
                collect()
            }
        }
        return (ContinuousClock.now - start).seconds * 1e9 / Double(requests)
    }

    /// The routing work alone, without sockets: one thread handing the broker's state machine
    /// a request, then the worker's reply, `requests` times, per setup; then the time
    /// ``BrokerTracing/flush(ending:)`` takes to make the spans of what was noted (done off
    /// the loop thread in the broker). What no socket or scheduler adds noise to. With
    /// `inFlight` above 1, ``stateUnderLoad(_:requests:inFlight:ready:reply:request:)`` instead.
    func stateMachine(endpoint: String, logger: Logger) async throws {
        let all: [(name: String, traced: Bool, every: Int?)] = [
            ("no tracer", false, nil), ("tracer, nothing sampled", true, nil),
            ("1% sampled", true, 100), ("100% sampled", true, 1),
        ]
        let setups = all.filter { only == nil || $0.name.hasPrefix(only!) }
        guard !setups.isEmpty else { throw ValidationError("--only names one of: \(all.map(\.name).joined(separator: "; "))") }
        let header = RequestHeader(timeoutMilliseconds: 30_000)
        let body = Array(#"{"text":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}"#.utf8)
        func request(_ header: RequestHeader) -> [[UInt8]] {
            WireMessage.request(WireRequest(correlation: Wire.frame(UInt64(1)), service: "bench", operation: "echo", header: header, body: body)).encoded
        }
        var traced = header
        traced.trace = TraceContext(traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        let (plain, sampled) = (request(header), request(traced))
        // Under load, every other request carries the edge's 10 s call timeout, as a stack's
        // mix of the edge's calls and the services' own (30 s) does.
        let edgeCall = request(RequestHeader(timeoutMilliseconds: 10_000))
        let ready = WireMessage.ready(service: "bench", operations: [OperationDescriptor(name: "echo", idempotent: true, coalescable: false)], credit: 64)
            .encoded
        let reply = Array(#"{"text":"ok"}"#.utf8)
        print(
            "canopy-bench tracing, state machine: \(requests) requests routed per setup and round (request in, dispatch out, reply in, reply out) on one thread, \(rounds) rounds, "
                + (inFlight > 1 ? "\(inFlight) in flight (4 workers, credit 64; timeouts of 10 s and 30 s in turn)" : "one at a time"))
        var rows = [["round", "setup", "ns/request (loop)", "vs no tracer", "flush µs/traced request", "ns/request with flush"]]
        var ratios: [String: [Double]] = [:], withFlush: [String: [Double]] = [:]
        for round in 1...rounds {
            var perRequest: [String: (loop: Double, flush: Double, traced: Int)] = [:]
            for setup in setups.indices.map({ setups[($0 + round - 1) % setups.count] }) {
                var configuration = BrokerConfiguration()
                configuration.metrics = false
                perRequest[setup.name] = try await Self.withTracer(setup.traced, endpoint: endpoint) { tracer in
                    var state = BrokerState(configuration: configuration, now: .now - .seconds(60))
                    let tracing = tracer.map(BrokerTracing.init)
                    if let tracing { state.traceRequests(into: tracing) }
                    var out: [BrokerState.Directive] = []
                    out.reserveCapacity(16)
                    let worker = Array("w".utf8), client = Array("c".utf8)
                    if inFlight > 1 {
                        var turn = 0
                        let loop = try Self.stateUnderLoad(
                            &state, requests: requests, inFlight: inFlight, ready: ready, reply: reply,
                            request: {
                                turn += 1
                                if setup.every.map({ $0 == 1 || Int.random(in: 0..<$0) == 0 }) ?? false { return sampled }
                                return turn % 2 == 0 ? edgeCall : plain
                            })
                        tracing?.flush(ending: true)
                        return (loop, 0, 0)
                    }
                    state.receive(ready, from: worker, now: .now, into: &out)
                    var tracedCount = 0
                    let start = ContinuousClock.now
                    for index in 0..<requests {
                        out.removeAll(keepingCapacity: true)
                        let traceThis = setup.every.map { index % $0 == 0 } ?? false
                        if traceThis { tracedCount += 1 }
                        state.receive(traceThis ? sampled : plain, from: client, now: start, into: &out)
                        guard case .send(_, .dispatch(let id, _, _, _, _))? = out.first(where: { if case .send(_, .dispatch) = $0 { true } else { false } })
                        else {
                            throw BenchmarkFailure("the state machine did not dispatch request \(index)")
                        }
                        out.removeAll(keepingCapacity: true)
                        state.receive(WireMessage.workerReply(requestID: id, failed: false, body: reply).encoded, from: worker, now: start, into: &out)
                    }
                    let loop = (ContinuousClock.now - start).seconds
                    let flushStart = ContinuousClock.now
                    tracing?.flush(ending: true)
                    let flush = (ContinuousClock.now - flushStart).seconds
                    return (loop * 1e9 / Double(requests), tracedCount > 0 ? flush * 1e6 / Double(tracedCount) : 0, tracedCount)
                }
            }
            guard let baseline = perRequest[setups[0].name] else { continue }
            for setup in setups {
                guard let figures = perRequest[setup.name] else { continue }
                let total = figures.loop + figures.flush * 1e3 * Double(figures.traced) / Double(requests)
                ratios[setup.name, default: []].append(figures.loop / baseline.loop)
                withFlush[setup.name, default: []].append(total / baseline.loop)
                rows.append([
                    "\(round)", setup.name, String(format: "%.0f", figures.loop), String(format: "%.3f", figures.loop / baseline.loop),
                    String(format: "%.1f", figures.flush), String(format: "%.0f", total),
                ])
            }
        }
        printTable(rows)
        func median(_ values: [Double]?) -> Double { values.map { $0.sorted()[$0.count / 2] } ?? 0 }
        print(
            "median of rounds against no tracer: "
                + setups.dropFirst().map {
                    "\($0.name) \(String(format: "%.3f", median(ratios[$0.name]))) on the loop, \(String(format: "%.3f", median(withFlush[$0.name]))) with the flush"
                }.joined(separator: "; "))
        print("")
    }

    // MARK: - The broker

    func broker(endpoint: String, logger: Logger) async throws {
        let setups: [(name: String, traced: Bool, every: Int?)] = [
            ("no tracer", false, nil), ("tracer, nothing sampled", true, nil),
            ("1% sampled", true, 100), ("100% sampled", true, 1),
        ]
        let request = benchRequest(operation: "echo", body: Array(#"{"text":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}"#.utf8))
        print("canopy-bench tracing, broker: \(clients) clients x \(window) in flight on 2 threads, 4 echo workers, \(seconds) s per setup, \(rounds) rounds;")
        print(
            "a sampled request's broker spans (waiter, flight) made off the broker's thread and exported over OTLP/HTTP JSON by swift-otel to a receiver that reads nothing"
        )
        var comparison = Comparison(setups: setups.map(\.name), generator: "load CPU", cpuColumns: ["broker thread", "broker + swift-otel threads"])
        for round in 1...rounds {
            var measured: [String: any Figures] = [:], cpu: [String: [Double]] = [:]
            for setup in comparison.order(round: round).compactMap({ name in setups.first { $0.name == name } }) {
                progress("  round \(round)/\(rounds): broker, \(setup.name)…\n")
                let (result, used) = try await Self.withTracer(setup.traced, endpoint: endpoint) { tracer in
                    var configuration = BrokerConfiguration()
                    configuration.tracer = tracer
                    let load = PipelinedLoadSetup(
                        clients: clients, window: window, threads: 2, request: request, warmUp: .milliseconds(500),
                        duration: .seconds(seconds), traceEvery: setup.every)
                    return try await Rig(workers: 4).broker(configuration: configuration, logger: logger) { endpoint, _ in
                        let before = (threadCPUSeconds(named: "canopy-broker"), threadCPUSeconds(where: Self.isExporterThread))
                        let result = try load.run(endpoint)
                        // Scaled to the measured part (the warm-up's requests are not counted).
                        let share = result.seconds / (result.seconds + 0.5)
                        let used = (
                            (threadCPUSeconds(named: "canopy-broker") - before.0) * share, (threadCPUSeconds(where: Self.isExporterThread) - before.1) * share
                        )
                        return (result, (used.0 * 1e6 / Double(max(1, result.requests)), used.1 * 1e6 / Double(max(1, result.requests))))
                    }
                }
                measured[setup.name] = result
                cpu[setup.name] = [used.0, used.0 + used.1]
            }
            comparison.add(round: round, measured, cpu: cpu)
        }
        comparison.print(target: "nothing sampled and 1% within 3%")
        print("")
    }

    /// Runs `body` with a swift-otel tracer of its own (exporting to `endpoint`, shut down
    /// afterwards) when `traced`, else with none.
    static func withTracer<T>(_ traced: Bool, endpoint: String, _ body: (_ tracer: (any Tracer)?) async throws -> T) async throws -> T {
        guard traced else { return try await body(nil) }
        return try await CanopyTesting.withTracer(serviceName: "canopy-broker", endpoint: endpoint) { try await body($0) }
    }

    /// The threads swift-otel's processor and exporter run on: Swift's cooperative pool and
    /// the exporter's NIO event loops.
    static func isExporterThread(_ name: String) -> Bool {
        name.hasSuffix("default-qos") || name.hasPrefix("NIO-")
    }

    // MARK: - The edge

    func edge(endpoint: String, logger: Logger) async throws {
        guard let wrk = which("wrk") else { throw CommandFailure("wrk is not installed; apt-get install wrk, then run again") }
        let api = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent().appendingPathComponent("canopy-api")
        guard FileManager.default.isExecutableFile(atPath: api.path) else {
            throw CommandFailure("canopy-api is not next to canopy-bench; build it (swift build -c release --product canopy-api)")
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-tracing-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let key = Array("the canopy-bench tracing signing key, long enough".utf8)
        let keyFile = directory.appendingPathComponent("token.key")
        try Data(key).write(to: keyFile)

        // canopy-care behind a broker in this process (no tracer: what is measured is the edge).
        let stack = try await BenchStack(logger: logger) { endpoint, context in
            var care = CareServiceSettings(directory: directory.appendingPathComponent("care"), runner: .init(endpoint: endpoint))
            care.runner.credit = 64
            return try await buildCareService(settings: care, context: context, logger: logger)
        }
        do {
            try await measureEdges(stack: stack, api: api, wrk: wrk, key: key, keyFile: keyFile, directory: directory, endpoint: endpoint)
        } catch {
            await stack.shutdown()
            throw error
        }
        await stack.shutdown()
    }

    private func measureEdges(stack: BenchStack, api: URL, wrk: String, key: [UInt8], keyFile: URL, directory: URL, endpoint: String) async throws {
        while (try? await stack.client.call(Broker.Services.self, Empty()))?.contains(where: { $0.name == Care.service }) != true {
            try await Task.sleep(for: .milliseconds(50))
        }
        for index in 0..<10 {
            _ = try await stack.client.call(
                Care.AddPlant.self, Care.Plant(id: "bench-\(index)", scientificName: "Monstera deliciosa", customName: "Bench \(index)"),
                principal: "bench")
        }
        let token = try await TokenAuthority(key: key).issue(user: "bench", lifetime: .seconds(3_600))
        let script = directory.appendingPathComponent("canopy.lua")
        try EdgeBenchmark.wrkScript.write(to: script, atomically: true, encoding: .utf8)
        let runner = WrkRunner(wrk: wrk, script: script.path)

        let collectorEnvironment = ["OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"]
        let setups: [(name: String, environment: [String: String])] = [
            ("no collector (no tracing code)", [:]),
            ("disabled", collectorEnvironment.merging(["OTEL_SDK_DISABLED": "true"]) { $1 }),
            ("collector, nothing sampled", collectorEnvironment.merging(["OTEL_TRACES_SAMPLER": "parentbased_always_off"]) { $1 }),
            ("1% sampled", collectorEnvironment.merging(["OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"]) { $1 }),
            ("100% sampled", collectorEnvironment.merging(["OTEL_TRACES_SAMPLER": "parentbased_always_on"]) { $1 }),
        ]
        print(
            "canopy-bench tracing, edge: canopy-api (a process) under wrk \(runner.version), \(connections) connections, GET /v1/plants (10 plants, through the broker to canopy-care), \(seconds) s per setup, \(rounds) rounds"
        )
        var comparison = Comparison(setups: setups.map(\.name), generator: "wrk cores", cpuColumns: ["canopy-api"])
        for round in 1...rounds {
            var measured: [String: any Figures] = [:], cpu: [String: [Double]] = [:]
            for setup in comparison.order(round: round).compactMap({ name in setups.first { $0.name == name } }) {
                progress("  round \(round)/\(rounds): edge, \(setup.name)…\n")
                let (result, used) = try await Self.withEdge(
                    api, bus: stack.broker.endpoint, keyFile: keyFile.path, data: directory.path,
                    environment: setup.environment
                ) { http, pid in
                    let before = ProcStat(path: "/proc/\(pid)/stat")?.cpuTicks ?? 0
                    let result = try runner.run(
                        url: "http://\(http)/v1/plants", connections: connections, seconds: seconds, header: "Authorization: Bearer \(token)")
                    let ticks = (ProcStat(path: "/proc/\(pid)/stat")?.cpuTicks ?? 0) - before
                    return (result, Double(ticks) / Double(sysconf(Int32(_SC_CLK_TCK))) * 1e6 / Double(max(1, result.requests)))
                }
                measured[setup.name] = result
                cpu[setup.name] = [used]
            }
            comparison.add(round: round, measured, cpu: cpu)
        }
        comparison.print(target: "off and 1% within 3%")
    }

    /// Runs `body` against a `canopy-api serve` process with `environment`, then stops it.
    static func withEdge<T>(
        _ executable: URL, bus: String, keyFile: String, data: String, environment: [String: String],
        _ body: (_ http: String, _ pid: Int32) throws -> T
    ) async throws -> T {
        let port = FreePorts.any()
        let process = Process()
        process.executableURL = executable
        process.arguments = [
            "serve", "--endpoint", bus, "--http", "127.0.0.1:\(port)", "--metrics-bind", "off", "--token-key-file", keyFile,
            "--data-dir", data + "/edge-\(port)", "--rate-limit", "100000", "--rate-burst", "1000000", "--log-level", "error",
        ]
        var merged = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("OTEL_") }
        merged.merge(environment) { $1 }
        process.environment = merged
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        defer {
            process.terminate()
            process.waitUntilExit()
        }
        let deadline = ContinuousClock.now + .seconds(30)
        while !(try await answers(port)) {
            guard ContinuousClock.now < deadline, process.isRunning else { throw BenchmarkFailure("canopy-api did not start listening on \(port)") }
            try await Task.sleep(for: .milliseconds(50))
        }
        return try body("127.0.0.1:\(port)", process.processIdentifier)
    }

    static func answers(_ port: Int) async throws -> Bool {
        (try? await HTTPClient.shared.execute(HTTPClientRequest(url: "http://127.0.0.1:\(port)/v1/plants"), timeout: .seconds(1))) != nil
    }

}

/// What a load generator's run gives a comparison.
protocol Figures {
    var throughput: Double { get }
    var p50: UInt64 { get }
    var p99: UInt64 { get }
    var generatorCoreShare: Double { get }
    var errors: Int { get }
}

extension LoadResult: Figures {}
extension WrkResult: Figures {}

/// Setups measured in turn, round by round (the order rotating, so none always runs on a
/// warmer or busier machine), each against the first, the baseline: a table of every round,
/// then the median of the round-by-round ratios. CPU time per request (named columns, such as
/// the broker's thread) is compared too: on a shared, noisy machine it moves less than
/// throughput does.
struct Comparison {
    let setups: [String]
    let cpuColumns: [String]
    private var rows: [[String]]
    private var ratios: [String: [String: [Double]]] = [:] // figure -> setup -> round ratios

    init(setups: [String], generator: String, cpuColumns: [String] = []) {
        self.setups = setups
        self.cpuColumns = cpuColumns
        rows = [
            ["round", "setup", "req/s", "p50 µs", "p99 µs", generator, "errors", "req/s vs \(setups[0])", "p99 vs \(setups[0])"]
                + cpuColumns.map { "\($0) µs/req" }
        ]
    }

    /// The setups in the order round `round` runs them.
    func order(round: Int) -> [String] {
        setups.indices.map { setups[($0 + round - 1) % setups.count] }
    }

    /// One round's figures, and per setup its CPU microseconds per request, one per CPU column.
    mutating func add(round: Int, _ measured: [String: any Figures], cpu: [String: [Double]] = [:]) {
        guard let baseline = measured[setups[0]] else { return }
        for setup in setups {
            guard let result = measured[setup] else { continue }
            var figures = [("req/s", result.throughput / baseline.throughput), ("p99", Double(result.p99) / Double(max(1, baseline.p99)))]
            for (index, column) in cpuColumns.enumerated() {
                if let mine = cpu[setup]?[index], let base = cpu[setups[0]]?[index], base > 0 { figures.append((column, mine / base)) }
            }
            for (figure, ratio) in figures { ratios[figure, default: [:]][setup, default: []].append(ratio) }
            rows.append(
                [
                    "\(round)", setup, String(format: "%.0f", result.throughput), "\(result.p50)", "\(result.p99)",
                    String(format: "%.2f", result.generatorCoreShare), "\(result.errors)", String(format: "%.3f", figures[0].1),
                    String(format: "%.2f", figures[1].1),
                ]
                    + (cpu[setup] ?? []).map { String(format: "%.2f", $0) })
        }
    }

    func print(target: String) {
        printTable(rows)
        func median(_ values: [Double]?) -> Double { values.map { $0.sorted()[$0.count / 2] } ?? 0 }
        Swift.print("median of rounds against \(setups[0]) (target: \(target)):")
        var table = [["setup", "req/s", "p99"] + cpuColumns.map { "\($0) CPU/req" }]
        for setup in setups.dropFirst() {
            table.append(
                [setup, String(format: "%.3f", median(ratios["req/s"]?[setup])), String(format: "%.2f", median(ratios["p99"]?[setup]))]
                    + cpuColumns.map { String(format: "%.3f", median(ratios[$0]?[setup])) })
        }
        printTable(table)
    }
}
