import ArgumentParser
import CanopyBroker
import CanopyBus
import CanopyMessages
import Foundation
import Logging

/// Coalescing at the broker: what it saves on identical requests, and what it costs on a
/// load with none. Every figure has its baseline from the same run.
struct Coalescing: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Coalescing on against off (and against zmq_proxy) on bursts, mixed and duplicate-free loads.",
        discussion: "Example: canopy-bench coalescing --seconds 3 --rounds 3")

    @Option(help: "Seconds measured per closed-loop setup.") var seconds = 3.0
    @Option(help: "Rounds per setup; the best counts (the machine is shared and noisy).") var rounds = 3
    @Option(help: "Echo workers.") var workers = 4
    @Option(help: "Requests a worker serves at once (its credit).") var capacity = 8
    @Option(help: "Milliseconds each worker call takes (a database lookup, say).") var serviceMs = 2

    func run() async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        print("canopy-bench coalescing: \(workers) echo workers serving \(capacity) at once, \(serviceMs) ms per call, best of \(rounds), loopback TCP")
        try await burst(logger: logger)
        try await mixed(logger: logger)
        try await duplicateFree(logger: logger)
    }

    private func configuration(coalescing: Bool) -> BrokerConfiguration {
        var configuration = BrokerConfiguration()
        configuration.coalescing = coalescing
        configuration.maximumQueuedPerService = 20_000
        return configuration
    }

    /// (a) 10,000 concurrent identical requests from 100 clients.
    private func burst(logger: Logger) async throws {
        let request = benchRequest(operation: "lookup", body: Array(#"{"species":"Monstera deliciosa"}"#.utf8))
        let rig = Rig(workers: workers, capacity: capacity, serviceTime: .milliseconds(serviceMs))
        var rows: [[String]] = [["coalescing", "wall ms", "replies", "errors", "worker calls", "flights", "calls per flight", "waiters p50", "waiters max"]]
        var best: [Bool: Double] = [:]
        for round in 1...rounds {
            for coalescing in [true, false] {
                progress("  (a) round \(round)/\(rounds), coalescing \(coalescing ? "on" : "off")…\n")
                let (result, calls, stats) = try await rig.broker(configuration: configuration(coalescing: coalescing), logger: logger) { endpoint, echo in
                    let result = try identicalBurst(endpoint: endpoint, request: request)
                    return (result, echo.calls.load(ordering: .relaxed), try brokerStatistics(endpoint: endpoint))
                }
                if result.seconds < best[coalescing] ?? .infinity {
                    best[coalescing] = result.seconds
                    let lookup = stats.operations.first { $0.operation == "lookup" }
                    let flights = lookup?.flights ?? 0
                    rows.removeAll { $0[0] == (coalescing ? "on" : "off") }
                    rows.append([
                        coalescing ? "on" : "off", String(format: "%.1f", result.seconds * 1000), "\(result.replies)", "\(result.errors)", "\(calls)",
                        "\(flights)", flights == 0 ? "-" : String(format: "%.2f", Double(calls) / Double(flights)),
                        "\(lookup?.waitersPerFlightP50 ?? 0)", "\(lookup?.waitersPerFlightMax ?? 0)",
                    ])
                }
            }
        }
        print("\n(a) 10,000 concurrent identical requests from 100 clients (100 each)")
        printTable(rows)
        if let on = best[true], let off = best[false] {
            print(String(format: "wall time on/off: %.3f (%.1fx faster)", on / off, off / on))
        }
    }

    /// (b) A closed loop where 90% of requests repeat one of 50 bodies.
    private func mixed(logger: Logger) async throws {
        let popular = (0..<50).map { Array("{\"species\":\"popular-\($0)\"}".utf8) }
        let rig = Rig(workers: workers, capacity: capacity, serviceTime: .milliseconds(serviceMs))
        let measure = Duration.milliseconds(Int64(seconds * 1000))
        @Sendable func generator(_ endpoint: String) -> LoadGenerator {
            var generator = LoadGenerator(endpoint: endpoint, clients: 64, request: benchRequest(operation: "lookup", body: []))
            generator.bodies = .mixed(popular: popular, repeatShare: 0.9)
            return generator
        }
        var results: [String: LoadGenerator.Result] = [:]
        for round in 1...rounds {
            progress("  (b) round \(round)/\(rounds)…\n")
            let proxy = try await rig.proxy { endpoint, _ in try generator(endpoint).run(warmUp: .milliseconds(500), duration: measure) }
            let on = try await rig.broker(configuration: configuration(coalescing: true), logger: logger) { endpoint, _ in
                try generator(endpoint).run(warmUp: .milliseconds(500), duration: measure)
            }
            let off = try await rig.broker(configuration: configuration(coalescing: false), logger: logger) { endpoint, _ in
                try generator(endpoint).run(warmUp: .milliseconds(500), duration: measure)
            }
            for (name, result) in [("zmq_proxy", proxy), ("broker, coalescing on", on), ("broker, coalescing off", off)]
            where result.throughput > results[name]?.throughput ?? -1 {
                results[name] = result
            }
        }
        print("\n(b) 64 clients, closed loop, 90% of requests repeat one of 50 bodies")
        var rows = [["setup", "req/s", "p50 µs", "p99 µs", "vs proxy"]]
        let baseline = results["zmq_proxy"]!.throughput
        for name in ["zmq_proxy", "broker, coalescing off", "broker, coalescing on"] {
            let result = results[name]!
            rows.append([
                name, String(format: "%.0f", result.throughput), "\(result.p50)", "\(result.p99)", String(format: "%.2f", result.throughput / baseline),
            ])
        }
        printTable(rows)
        print(
            String(
                format: "coalescing on/off: throughput %.2f, p99 %.2f",
                results["broker, coalescing on"]!.throughput / results["broker, coalescing off"]!.throughput,
                Double(results["broker, coalescing on"]!.p99) / Double(results["broker, coalescing off"]!.p99)))
    }

    /// (c) What coalescing costs when nothing repeats: unique bodies, instant workers.
    private func duplicateFree(logger: Logger) async throws {
        let rig = Rig(workers: workers, capacity: 64)
        let measure = Duration.milliseconds(Int64(seconds * 1000))
        @Sendable func generator(_ endpoint: String) -> LoadGenerator {
            var generator = LoadGenerator(endpoint: endpoint, clients: 64, request: benchRequest(operation: "lookup", body: []))
            generator.bodies = .unique
            return generator
        }
        var best: [Bool: LoadGenerator.Result] = [:]
        for round in 1...rounds {
            for coalescing in [true, false] {
                progress("  (c) round \(round)/\(rounds), coalescing \(coalescing ? "on" : "off")…\n")
                let result = try await rig.broker(configuration: configuration(coalescing: coalescing), logger: logger) { endpoint, _ in
                    try generator(endpoint).run(warmUp: .milliseconds(500), duration: measure)
                }
                if result.throughput > best[coalescing]?.throughput ?? -1 { best[coalescing] = result }
            }
        }
        print("\n(c) 64 clients, closed loop, no two requests alike, workers answer at once")
        var rows = [["coalescing", "req/s", "p50 µs", "p99 µs"]]
        for coalescing in [false, true] {
            let result = best[coalescing]!
            rows.append([coalescing ? "on" : "off", String(format: "%.0f", result.throughput), "\(result.p50)", "\(result.p99)"])
        }
        printTable(rows)
        print(String(format: "throughput on/off: %.3f (target: at least 0.95)", best[true]!.throughput / best[false]!.throughput))
    }
}

/// Asks the broker for `broker.stats` on a socket of its own.
func brokerStatistics(endpoint: String) throws -> BrokerStatistics {
    let context = ZMQContext()
    let socket = try ZMQSocket(context, type: .dealer)
    defer { socket.close() }
    try socket.connect(endpoint)
    try socket.send(
        [
            Wire.version, Wire.Command.request.frame, Wire.frame(UInt64(1)), Array("broker".utf8), Array("stats".utf8),
            RequestHeader(timeoutMilliseconds: 5_000).frame, Array("{}".utf8),
        ], dontWait: false)
    guard let reply = try socket.receive(dontWait: false), reply.count == 5 else { throw CanopyError(.internal, "no stats reply") }
    return try MessageCodec().decode(BrokerStatistics.self, from: reply[4])
}

/// 100 clients sending 100 identical requests each at once.
private func identicalBurst(endpoint: String, request: [[UInt8]]) throws -> (seconds: Double, replies: Int, errors: Int) {
    try burst(endpoint: endpoint, clients: 100, perClient: 100, request: request)
}
