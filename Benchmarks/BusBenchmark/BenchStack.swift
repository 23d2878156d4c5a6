import CanopyBroker
import CanopyBus
import CanopyServiceKit
import Logging
import ServiceLifecycle

/// A broker on an ephemeral port, the services a build function made (run in serve's own
/// `ServiceGroup`), and a client with a long deadline: what a benchmark section measures
/// over the bus. ``shutdown()`` stops them gracefully, in reverse order.
final class BenchStack {
    let broker: BrokerServer
    let client: BusClient
    private let brokerTask: Task<Void, Error>
    private let group: ServiceGroup
    private let serving: Task<Void, Error>

    /// - Parameters:
    ///   - configuration: the broker's settings.
    ///   - logger: where everything logs.
    ///   - asService: the client stands in for a service (canopy-care sending windows), so
    ///     its requests say a service made them (service-to-service operations take only those).
    ///   - build: the services to run, given the broker's endpoint and the context to share.
    init(
        configuration: BrokerConfiguration = .init(), logger: Logger, asService: Bool = false,
        build: (_ endpoint: String, _ context: ZMQContext) async throws -> [any Service]
    ) async throws {
        let context = ZMQContext()
        let broker = try BrokerServer(endpoint: "tcp://127.0.0.1:*", configuration: configuration, context: context, logger: logger)
        self.broker = broker
        brokerTask = Task { try await broker.run() }
        let group = serviceGroup(try await build(broker.endpoint, context), signals: [], logger: logger)
        self.group = group
        serving = Task { try await group.run() }
        var clientConfiguration = BusClient.Configuration(endpoint: broker.endpoint)
        clientConfiguration.defaultTimeout = .seconds(60)
        clientConfiguration.derived = asService
        client = try BusClient(configuration: clientConfiguration, context: context, logger: logger)
    }

    /// Closes the client, shuts the services down gracefully, then stops the broker.
    func shutdown() async {
        client.close()
        await group.triggerGracefulShutdown()
        _ = try? await serving.value
        broker.stop()
        _ = try? await brokerTask.value
    }
}
