import ArgumentParser
import CanopyBus
import CanopyMessages
import CanopyServiceKit
import CanopyTesting
import Foundation
import Histogram
import Logging
import Synchronization

/// Two live brokers (`canopy-broker` processes): what a second broker costs a worker, and what
/// happens to a pipelined load when one broker is SIGKILLed mid-run.
///
/// - Cost: the same load through one broker (the worker registered there alone) and through
///   two (the worker on both, the clients spread over them), in the same run: throughput, and
///   CPU per request in this process (clients, worker, handlers) and in the brokers.
/// - Failover: the load through two brokers, broker 1 SIGKILLed after `--kill-at`: the longest
///   time no call was answered (the gap), p99 before and after, and the calls in flight at the
///   kill: answered (idempotent ones at the dead broker sent again), answered `brokerLost` (one
///   call in ten is not idempotent), and lost (any other failure: target 0).
struct FailoverBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "failover",
        abstract: "Two live brokers: a second broker's cost for a worker, and a broker SIGKILLed under a pipelined load.",
        discussion: "Example: canopy-bench failover --seconds 6 --clients 8 --window 16")

    @Option(help: "Seconds of each load.") var seconds = 6.0
    @Option(help: "When broker 1 is killed, seconds into the failover load.") var killAt = 2.0
    @Option(help: "Bus clients (half prefer each broker).") var clients = 8
    @Option(help: "Calls each client keeps in flight.") var window = 16
    @Option(help: "The worker's credit.") var credit = 32
    @Option(help: "Each call's work in the handler, in milliseconds.") var workMs = 1

    /// One call's end: when it started and ended (from the load's start), and how.
    struct Call: Sendable {
        var started: Duration
        var ended: Duration
        var code: CanopyError.Code?
        var idempotent: Bool
    }

    final class Calls: Sendable {
        let value = Mutex<[Call]>([])
        func add(_ call: Call) { value.withLock { $0.append(call) } }
        var all: [Call] { value.withLock { $0 } }
    }

    /// A broker process on a free port, killed or stopped by the benchmark.
    final class Broker: @unchecked Sendable { // its Process is touched by one task at a time
        let process = Process()
        let endpoint: String
        init(name: String) throws {
            endpoint = "tcp://127.0.0.1:\(FreePorts.any())"
            process.executableURL = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("canopy-broker")
            process.arguments = ["serve", "--bind", endpoint, "--name", name, "--metrics-bind", "off", "--log-level", "error"]
            process.standardOutput = FileHandle.nullDevice
            try process.run()
        }
        var cpuSeconds: Double { databaseCPUSeconds(process.processIdentifier) }
        func stop() {
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
        }
    }

    func run() async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .critical
        print("canopy-bench failover: \(clients) clients × \(window) calls in flight, a worker of credit \(credit), \(workMs) ms a call, \(seconds) s a load")

        // (1) One broker against two, the same load.
        var cost: [(label: String, perSecond: Double, process: Double, brokers: Double)] = []
        for count in [1, 2] {
            let brokers = try (0..<count).map { try Broker(name: "broker-\($0 + 1)") }
            defer { brokers.forEach { $0.stop() } }
            let result = try await load(brokers: brokers, killing: nil, logger: logger)
            cost.append((count == 1 ? "one broker" : "two brokers, the worker on both", result.perSecond, result.processCPU, result.brokerCPU))
        }
        var table = [["load", "calls/s", "CPU µs/call, this process", "CPU µs/call, brokers", "throughput vs one broker"]]
        for row in cost {
            table.append([
                row.label, String(format: "%.0f", row.perSecond), String(format: "%.0f", row.process * 1e6), String(format: "%.0f", row.brokers * 1e6),
                String(format: "%.2f", row.perSecond / cost[0].perSecond),
            ])
        }
        print("\n(1) a second broker's cost (the same pipelined load; this process runs the clients, the worker and its handlers)")
        printTable(table)

        // (2) Two brokers, broker 1 SIGKILLed mid-run.
        let brokers = try (0..<2).map { try Broker(name: "broker-\($0 + 1)") }
        defer { brokers.forEach { $0.stop() } }
        let result = try await load(brokers: brokers, killing: brokers[0], logger: logger)
        let calls = result.calls
        let kill = Duration.seconds(killAt)
        let answered = calls.filter { $0.code == nil }.map(\.ended).sorted()
        let gap = zip(answered, answered.dropFirst()).map { $1 - $0 }.max() ?? .zero
        // The gap around the kill: from the kill to the first answer of a call sent after it.
        let firstAfter = calls.filter { $0.code == nil && $0.started >= kill }.map(\.ended).min().map { $0 - kill } ?? .seconds(99)
        func p99(_ calls: [Call]) -> String {
            var histogram = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
            for call in calls { _ = histogram.record(UInt64(max(0, (call.ended - call.started).microseconds))) }
            return calls.isEmpty ? "-" : "\(histogram.valueAtPercentile(99))"
        }
        let ok = calls.filter { $0.code == nil }
        let before = ok.filter { $0.ended < kill }, around = ok.filter { $0.ended >= kill && $0.ended < kill + .seconds(1) }
        let after = ok.filter { $0.started >= kill + .seconds(1) }
        let inFlight = calls.filter { $0.started < kill && $0.ended >= kill }
        let inFlightAnswered = inFlight.filter { $0.code == nil }.count
        let brokerLost = calls.filter { $0.code == .brokerLost }.count
        let lost = calls.filter { $0.code != nil && $0.code != .brokerLost }
        print("\n(2) broker 1 SIGKILLed \(killAt) s into a \(seconds) s load through two brokers")
        printTable([
            ["figure", "value"],
            ["calls answered", "\(ok.count)"],
            ["longest time without an answer (the gap)", String(format: "%.1f ms", gap.seconds * 1000)],
            ["from the kill to the first answer of a call made after it", String(format: "%.1f ms", firstAfter.seconds * 1000)],
            ["p99 µs, calls answered before the kill", p99(before)],
            ["p99 µs, calls answered in the second after the kill", p99(around)],
            ["p99 µs, calls made later", p99(after)],
            ["calls in flight at the kill (at either broker)", "\(inFlight.count)"],
            ["  of them answered (idempotent ones at broker 1 sent again through broker 2)", "\(inFlightAnswered)"],
            ["  sent again (idempotent, at broker 1 when it died)", "\(result.sentAgain)"],
            ["  answered brokerLost (at broker 1, not idempotent: never sent twice)", "\(brokerLost)"],
            ["calls lost (any other failure; target 0)", "\(lost.count)"],
        ])
        print(
            String(
                format: "target: calls go through again within 1 s of the kill at p99: %@ (the gap %.1f ms)",
                gap < .seconds(1) && lost.isEmpty ? "met" : "NOT met", gap.seconds * 1000))
        if let first = lost.first { print("first lost call: \(first.code?.rawValue ?? "?")") }
    }

    struct Result {
        var perSecond: Double
        var processCPU: Double
        var brokerCPU: Double
        var calls: [Call]
        /// Calls the clients sent a second time (idempotent ones at the broker that died).
        var sentAgain = 0
    }

    /// The pipelined load through `brokers` (clients spread over them, the worker on all) for
    /// `--seconds`, killing `killing` at `--kill-at`.
    private func load(brokers: [Broker], killing: Broker?, logger: Logger) async throws -> Result {
        let context = ZMQContext()
        let endpoints = brokers.map(\.endpoint)
        var runner = ServiceRunner.Configuration(endpoints: endpoints)
        runner.credit = credit
        let service = TestWorkerService(workerName: "bench")
        let worker = ServiceRunner(service: service, configuration: runner, context: context, logger: logger)
        let running = Task { try await worker.run() }
        defer {
            worker.stop()
            running.cancel()
        }
        let buses = try (0..<clients).map { index in
            var configuration = BusClient.Configuration(endpoints: endpoints)
            configuration.preferred = index % endpoints.count
            configuration.defaultTimeout = .seconds(20)
            return try BusClient(configuration: configuration, context: context, logger: logger)
        }
        defer { buses.forEach { $0.close() } }
        // Every broker has the worker before the load starts.
        for bus in buses.prefix(endpoints.count) {
            while (try? await bus.call(TestService.Echo.self, .init(text: "warm"), timeout: .seconds(1))) == nil {
                try await Task.sleep(for: .milliseconds(50))
            }
        }
        let calls = Calls()
        let (process, broker) = (processCPU(), brokers.reduce(0) { $0 + $1.cpuSeconds })
        let started = ContinuousClock.now, end = started + .seconds(seconds)
        let killer = Task {
            guard let killing else { return }
            try await Task.sleep(until: started + .seconds(killAt))
            kill(killing.process.processIdentifier, SIGKILL)
        }
        let work = workMs
        try await withThrowingTaskGroup(of: Void.self) { group in
            for bus in buses {
                for slot in 0..<window {
                    group.addTask {
                        var call = 0
                        while ContinuousClock.now < end {
                            call += 1
                            let idempotent = (call + slot) % 10 != 0
                            let request = TestService.Request(text: "\(slot)-\(call)", sleepMilliseconds: work)
                            let began = ContinuousClock.now - started
                            var code: CanopyError.Code?
                            do {
                                if idempotent {
                                    _ = try await bus.call(TestService.Echo.self, request)
                                } else {
                                    _ = try await bus.call(TestService.Append.self, request)
                                }
                            } catch let error as CanopyError {
                                code = error.code
                            }
                            calls.add(Call(started: began, ended: ContinuousClock.now - started, code: code, idempotent: idempotent))
                        }
                    }
                }
            }
            try await group.waitForAll()
        }
        try await killer.value
        let elapsed = (ContinuousClock.now - started).seconds
        let all = calls.all
        let count = Double(max(1, all.count))
        return Result(
            perSecond: Double(all.filter { $0.code == nil }.count) / elapsed, processCPU: (processCPU() - process) / count,
            brokerCPU: (brokers.reduce(0) { $0 + $1.cpuSeconds } - broker) / count, calls: all,
            sentAgain: buses.reduce(0) { $0 + $1.callsSentAgain })
    }
}
