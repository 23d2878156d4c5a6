import CanopyBroker
import CanopyBus
import CanopyMessages
import CanopyServiceKit
import CanopyTesting
import Foundation
import Glibc
import Logging
import Synchronization
import Testing

/// Several live brokers (`canopy-broker` processes): clients that know them all go on through
/// another when theirs is killed.
@Suite(.serialized)
struct MultiBrokerTests {
    typealias BrokerProcess = BrokerProcessTests.BrokerProcess

    /// One call's end: when, how, and the text of one that is not idempotent.
    struct Outcome: Sendable {
        var at: Duration
        var ok: Bool
        var code: CanopyError.Code?
        var appended: String?
    }

    final class Flag: Sendable {
        let value = Atomic<Bool>(false)
    }

    final class Outcomes: Sendable {
        let value = Mutex<[Outcome]>([])
        func add(_ outcome: Outcome) { value.withLock { $0.append(outcome) } }
        var all: [Outcome] { value.withLock { $0 } }
    }

    @Test func aClientOfTwoBrokersGoesOnWhenOneIsKilledAndRunsNothingTwice() async throws {
        let (a, b) = (try BrokerProcess([]), try BrokerProcess([]))
        defer {
            a.stop()
            b.stop()
        }
        let endpoints = [try await a.endpoint(), try await b.endpoint()]
        var logger = Logger(label: "multi-broker")
        logger.logLevel = .warning
        let context = ZMQContext()
        // A worker on each broker (workers on every broker come with the next step).
        let services = [TestWorkerService(workerName: "on-a"), TestWorkerService(workerName: "on-b")]
        let runners = zip(services, endpoints).map { service, endpoint in
            ServiceRunner(service: service, configuration: .init(endpoint: endpoint), context: context, logger: logger)
        }
        try await withRunning(runners, logger: logger) {
            #expect(try await eventually { runners.allSatisfy(\.isRegistered) })
            var configuration = BusClient.Configuration(endpoints: endpoints)
            configuration.preferred = 0
            configuration.defaultTimeout = .seconds(60) // failover, not latency: the whole suite on two cores may take seconds a call
            let client = try BusClient(configuration: configuration, context: context, logger: logger)
            defer { client.close() }
            // New calls go to the preferred broker once its connection is up (the first calls
            // may go to whichever broker answered first).
            #expect(try await eventually { try await client.call(TestService.Echo.self, .init(text: "first")).worker == "on-a" }, "the preferred broker")

            // 32 callers at once, each calling again as soon as answered (one call in five one
            // that is not idempotent); broker a is SIGKILLed once 300 calls were answered, and
            // the load goes on for 2 s more (by counts, not a clock: a busy machine is slow).
            let started = ContinuousClock.now
            let outcomes = Outcomes()
            let stop = Flag()
            let killer = Task { () -> Duration in
                while outcomes.all.count < 300 { try await Task.sleep(for: .milliseconds(10)) }
                kill(a.process.processIdentifier, SIGKILL)
                let at = ContinuousClock.now - started
                try await Task.sleep(for: .seconds(2))
                stop.value.store(true, ordering: .relaxed)
                return at
            }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for caller in 0..<32 {
                    group.addTask {
                        var call = 0
                        while !stop.value.load(ordering: .relaxed) {
                            call += 1
                            let text = "\(caller)-\(call)"
                            let append = Int.random(in: 0..<5) == 0
                            do {
                                if append {
                                    _ = try await client.call(TestService.Append.self, .init(text: text, sleepMilliseconds: 20))
                                } else {
                                    _ = try await client.call(TestService.Echo.self, .init(text: text, sleepMilliseconds: 5))
                                }
                                outcomes.add(Outcome(at: ContinuousClock.now - started, ok: true, appended: append ? text : nil))
                            } catch let error as CanopyError {
                                outcomes.add(Outcome(at: ContinuousClock.now - started, ok: false, code: error.code, appended: append ? text : nil))
                            }
                        }
                    }
                }
                try await group.waitForAll()
            }
            let killedAt = try await killer.value
            let all = outcomes.all
            let failures = all.filter { !$0.ok }
            // Only calls that are not idempotent may fail, and only as brokerLost (some were at
            // broker a when it died: about half of what is in flight at a time).
            #expect(failures.allSatisfy { $0.appended != nil && $0.code == .brokerLost }, "\(failures.prefix(5))")
            #expect(!failures.isEmpty, "no call that is not idempotent was at broker a when it died")
            // Calls went on through broker b (how soon is a benchmark's figure, not a test's:
            // canopy-bench failover).
            let answered = all.filter(\.ok).map(\.at)
            #expect(answered.contains { $0 > killedAt + .milliseconds(500) } && answered.contains { $0 < killedAt }, "answers on both sides of the kill")
            // Nothing ran twice: each text that is not idempotent reached a handler at most once,
            // and every one answered OK reached one.
            let ran = services.flatMap { $0.counters.appended.withLock { $0 } }
            #expect(Set(ran).count == ran.count, "a call that is not idempotent ran twice")
            let answeredAppends = Set(all.filter { $0.ok }.compactMap(\.appended))
            #expect(answeredAppends.isSubset(of: Set(ran)))
            #expect(services[1].counters.calls.load(ordering: .relaxed) > 0, "broker b's worker took over")
        }
    }

    @Test func aWorkerServesEveryBrokerWithinItsCreditAndRegistersAgainWithOneThatComesBack() async throws {
        let portA = FreePorts.any()
        let endpointA = "tcp://127.0.0.1:\(portA)"
        var a = try BrokerProcess(["--bind", endpointA])
        let b = try BrokerProcess([])
        defer {
            a.stop()
            b.stop()
        }
        _ = try await a.endpoint()
        let endpoints = [endpointA, try await b.endpoint()]
        var logger = Logger(label: "multi-broker")
        logger.logLevel = .warning
        let context = ZMQContext()
        let service = TestWorkerService(workerName: "both")
        var configuration = ServiceRunner.Configuration(endpoints: endpoints)
        configuration.credit = 4
        let runner = ServiceRunner(service: service, configuration: configuration, context: context, logger: logger)
        try await withRunning([runner], logger: logger) {
            // A client for each broker alone.
            let clients = try endpoints.map { endpoint in
                var configuration = BusClient.Configuration(endpoint: endpoint)
                configuration.defaultTimeout = .seconds(20)
                return try BusClient(configuration: configuration, context: context, logger: logger)
            }
            defer { clients.forEach { $0.close() } }
            func registered(_ broker: Int) async -> Bool {
                ((try? await clients[broker].call(Broker.Services.self, .init(), timeout: .seconds(1))) ?? []).contains {
                    $0.name == TestService.name && $0.workers == 1
                }
            }
            #expect(
                try await eventually {
                    let (first, second) = (await registered(0), await registered(1))
                    return first && second
                }, "one worker registered with both brokers")

            // Twenty slow calls through each broker at once: the worker holds at most its credit.
            func burst(_ brokers: [Int]) async throws -> [String] {
                try await withThrowingTaskGroup(of: String.self) { group in
                    for index in 0..<20 {
                        let client = clients[brokers[index % brokers.count]]
                        group.addTask { try await client.call(TestService.Echo.self, .init(text: "\(index)", sleepMilliseconds: 100)).worker }
                    }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
            }
            #expect(try await burst([0, 1]).count == 20)
            #expect(
                service.counters.mostRunning.load(ordering: .relaxed) <= 4,
                "never more than its credit: \(service.counters.mostRunning.load(ordering: .relaxed))")
            #expect(service.counters.mostRunning.load(ordering: .relaxed) >= 3, "and both brokers' shares in use")

            // Broker a dies: the worker goes on with b, all its credit there but a's reserve.
            kill(a.process.processIdentifier, SIGKILL)
            #expect(try await burst([1]).count == 20)
            // a comes back on its endpoint: the worker registers with it again by itself.
            a = try BrokerProcess(["--bind", endpointA])
            _ = try await a.endpoint()
            #expect(try await eventually(within: .seconds(30)) { await registered(0) }, "registered again with the broker that came back")
            #expect(try await burst([0, 1]).count == 20)
            #expect(service.counters.mostRunning.load(ordering: .relaxed) <= 4)
        }
    }

    /// Each broker has a key pair of its own and the same allow-list: a worker and a client
    /// given every broker's public key (in the order of the endpoints) reach all of them.
    @Test func withCurveEachBrokerHasItsOwnKeyAndTheSameAllowList() async throws {
        guard Curve.isAvailable else { return }
        let (worker, client) = (try CurveKeyPair.generate(), try CurveKeyPair.generate())
        let brokerKeys = [try CurveKeyPair.generate(), try CurveKeyPair.generate()]
        let allowList = CurveAllowList(workers: WorkerKeys([worker.publicKey: [TestService.name]]), clients: [client.publicKey])
        // Not a test of expiry: heartbeats that a loaded machine cannot miss (100 ms, 30 missed).
        var patient = BrokerConfiguration.testing
        patient.liveness = 30
        try await withLiveBus(configuration: patient, curve: CurveServerSettings(keyPair: brokerKeys[0], allowList: allowList)) { a in
            try await withLiveBus(configuration: patient, curve: CurveServerSettings(keyPair: brokerKeys[1], allowList: allowList)) { b in
                let endpoints = [a.endpoint, b.endpoint]
                var runner = ServiceRunner.Configuration(endpoints: endpoints)
                runner.heartbeatInterval = patient.heartbeatInterval
                runner.liveness = patient.liveness
                runner.curve = CurveClientSettings(serverKeys: brokerKeys.map(\.publicKey), keyPair: worker)
                a.run([ServiceRunner(service: TestWorkerService(workerName: "both"), configuration: runner, context: a.context, logger: a.logger)])
                for (bus, key) in zip([a, b], brokerKeys) {
                    try await bus.waitForWorkers(1, curve: CurveClientSettings(serverKey: key.publicKey, keyPair: client))
                }
                // A client of both, preferring each in turn, is answered through each.
                for preferred in 0..<2 {
                    var configuration = BusClient.Configuration(endpoints: endpoints)
                    configuration.preferred = preferred
                    configuration.curve = CurveClientSettings(serverKeys: brokerKeys.map(\.publicKey), keyPair: client)
                    let bus = try BusClient(configuration: configuration, context: a.context, logger: a.logger)
                    defer { bus.close() }
                    #expect(try await bus.call(TestService.Echo.self, .init(text: "through \(preferred)")).text == "through \(preferred)")
                }
            }
        }
    }

    /// Both brokers restarted one after the other (SIGTERM: each drains what it holds and
    /// refuses new calls, which its clients send to the other) under a pipelined load: no call
    /// fails, idempotent or not.
    @Test func aRollingRestartOfBothBrokersFailsNoCall() async throws {
        let endpoints = ["tcp://127.0.0.1:\(FreePorts.any())", "tcp://127.0.0.1:\(FreePorts.any())"]
        var brokers = try endpoints.map { try BrokerProcess(["--bind", $0]) }
        defer { brokers.forEach { $0.stop() } }
        for broker in brokers { _ = try await broker.endpoint() }
        var logger = Logger(label: "multi-broker")
        logger.logLevel = .warning
        let context = ZMQContext()
        let service = TestWorkerService(workerName: "both")
        var configuration = ServiceRunner.Configuration(endpoints: endpoints)
        configuration.credit = 8
        let runner = ServiceRunner(service: service, configuration: configuration, context: context, logger: logger)
        try await withRunning([runner], logger: logger) {
            let clients = try (0..<4).map { index in
                var configuration = BusClient.Configuration(endpoints: endpoints)
                configuration.preferred = index % 2
                configuration.defaultTimeout = .seconds(20)
                return try BusClient(configuration: configuration, context: context, logger: logger)
            }
            defer { clients.forEach { $0.close() } }
            for client in clients.prefix(2) {
                #expect(try await eventually { (try? await client.call(TestService.Echo.self, .init(text: "up"), timeout: .seconds(1))) != nil })
            }
            let outcomes = Outcomes()
            let stop = Flag()
            let load = Task {
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for caller in 0..<16 {
                        let client = clients[caller % clients.count]
                        group.addTask {
                            var call = 0
                            while !stop.value.load(ordering: .relaxed) {
                                call += 1
                                let append = call % 5 == 0, text = "\(caller)-\(call)"
                                do {
                                    if append {
                                        _ = try await client.call(TestService.Append.self, .init(text: text, sleepMilliseconds: 10))
                                    } else {
                                        _ = try await client.call(TestService.Echo.self, .init(text: text, sleepMilliseconds: 10))
                                    }
                                    outcomes.add(Outcome(at: .zero, ok: true, appended: append ? text : nil))
                                } catch let error as CanopyError {
                                    outcomes.add(Outcome(at: .zero, ok: false, code: error.code, appended: append ? text : nil))
                                }
                            }
                        }
                    }
                    try await group.waitForAll()
                }
            }
            // One broker after the other: stopped gracefully, started again on its endpoint,
            // and the worker registered with it again before the next.
            for index in brokers.indices {
                try await Task.sleep(for: .milliseconds(500))
                brokers[index].stop()
                brokers[index] = try BrokerProcess(["--bind", endpoints[index]])
                _ = try await brokers[index].endpoint()
                let probe = try BusClient(configuration: .init(endpoint: endpoints[index]), context: context, logger: logger)
                defer { probe.close() }
                #expect(
                    try await eventually(within: .seconds(30)) {
                        ((try? await probe.call(Broker.Services.self, .init(), timeout: .seconds(1))) ?? []).contains { $0.name == TestService.name }
                    }, "the worker registered again with broker \(index + 1)")
                // And the callers are back on it (libzmq reconnects them with backoff; on a loaded
                // machine stopping the other broker first left some with none to go to).
                #expect(
                    try await eventually(within: .seconds(30)) {
                        let stats = try? await probe.call(Broker.Stats.self, .init(), timeout: .seconds(1))
                        return (stats?.operations.filter { $0.service == TestService.name }.map(\.requests).reduce(0, +) ?? 0) >= 20
                    }, "the callers call through broker \(index + 1) again")
            }
            try await Task.sleep(for: .milliseconds(500))
            stop.value.store(true, ordering: .relaxed)
            try await load.value
            let all = outcomes.all
            let failures = all.filter { !$0.ok }
            #expect(failures.isEmpty, "\(failures.count) of \(all.count) calls failed: \(failures.prefix(3).map { "\($0.code?.rawValue ?? "?")" })")
            #expect(all.count > 100)
            let ran = service.counters.appended.withLock { $0 }
            #expect(Set(ran).count == ran.count, "a call that is not idempotent ran twice")
        }
    }
}
