import CanopyBroker
import CanopyBus
import CanopyMessages
import CanopyTesting
import Foundation
import Testing

/// Two stacks on one machine never mix: a broker announces its stack, refuses the workers and
/// clients of another, and a worker of a stack stops rather than serve another stack's broker.
@Suite struct StackIsolationTests {
    static var stackA: BrokerConfiguration {
        var configuration = BrokerConfiguration.testing
        configuration.stack = "stack-a"
        return configuration
    }

    func runner(_ bus: LiveBus, stack: String?) -> ServiceRunner {
        var configuration = bus.runnerConfiguration(credit: 1)
        configuration.stack = stack
        return ServiceRunner(service: TestWorkerService(workerName: stack ?? "none"), configuration: configuration, context: bus.context, logger: bus.logger)
    }

    func client(_ bus: LiveBus, stack: String?) throws -> BusClient {
        var configuration = BusClient.Configuration(endpoint: bus.endpoint)
        configuration.stack = stack
        configuration.defaultTimeout = .seconds(30)
        return try BusClient(configuration: configuration, context: bus.context, logger: bus.logger)
    }

    @Test func aWorkerOfAnotherStackStopsWithASentenceAndNeverServes() async throws {
        try await withLiveBus(configuration: Self.stackA) { bus in
            let foreign = runner(bus, stack: "stack-b")
            await #expect {
                try await foreign.run() // ends by itself: it never serves stack-a's broker
            } throws: { error in
                let text = "\(error)"
                return error is ServiceRunner.ForeignBroker && text.contains("belongs to stack stack-a, not this service's stack stack-b")
                    && text.contains("canopy up --broker")
            }
            let services = try await bus.client().call(Broker.Services.self, .init())
            #expect(!services.contains { $0.name == TestService.name })
        }
    }

    @Test func aWorkerOfAStackStopsAtABrokerThatAnnouncesNone() async throws {
        try await withLiveBus { bus in
            await #expect(throws: ServiceRunner.ForeignBroker.self) { try await runner(bus, stack: "stack-b").run() }
        }
    }

    @Test func theBrokerServesItsOwnStackAndPeersWithoutOneButRefusesAnotherStacksClient() async throws {
        try await withLiveBus(configuration: Self.stackA) { bus in
            bus.run([runner(bus, stack: "stack-a")])
            try await bus.waitForWorkers(1)
            let own = try client(bus, stack: "stack-a")
            defer { own.close() }
            #expect(try await own.call(TestService.Echo.self, .init(text: "mine")).text == "mine")
            let operator_ = try client(bus, stack: nil) // canopy send from a terminal announces none
            defer { operator_.close() }
            #expect(try await operator_.call(TestService.Echo.self, .init(text: "op")).text == "op")
            let foreign = try client(bus, stack: "stack-b")
            defer { foreign.close() }
            await #expect {
                try await foreign.call(TestService.Echo.self, .init(text: "theirs"))
            } throws: { error in
                (error as? CanopyError)?.code == .unauthorized && "\(error)".contains("two stacks share one broker endpoint")
            }
        }
    }

    @Test func theStateRefusesAReadyFromAnotherStackWithDisconnect() {
        var state = BrokerState(configuration: Self.stackA, now: .now)
        var out: [BrokerState.Directive] = []
        let ready = WireMessage.ready(service: "plants", operations: [.init(name: "get", idempotent: true, coalescable: false)], credit: 1)
        state.receive(ready.encoded, from: [1], stack: "stack-b", now: .now, into: &out)
        #expect(out.contains { if case .send(_, .brokerDisconnect(let reason)) = $0 { reason.contains("stack-b") } else { false } })
        #expect(state.statistics(now: .now).services.isEmpty)
    }
}
