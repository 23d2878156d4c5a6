import CanopyIO
import CanopyServiceKit
import Logging
import ServiceLifecycle

/// Everything `canopy-broker serve` can be told.
public struct BrokerSettings: Sendable {
    /// Where the broker listens, such as `tcp://127.0.0.1:5555` (`tcp://127.0.0.1:*` for a
    /// port the system chooses).
    public var endpoint: String
    /// Heartbeats, bounds, deadlines and coalescing.
    public var configuration: BrokerConfiguration
    /// The broker's key pair and allow-list; `nil` runs without CurveZMQ.
    public var curve: CurveServerSettings?
    /// Where `/metrics` and `/health` listen; `nil` for nowhere (the broker then records no
    /// metrics at all).
    public var metrics: ListenAddress?

    /// - Parameters:
    ///   - endpoint: where the broker listens.
    ///   - configuration: its routing settings.
    ///   - curve: its CurveZMQ settings, `nil` for none.
    ///   - metrics: where `/metrics` and `/health` listen, `nil` for nowhere.
    public init(endpoint: String, configuration: BrokerConfiguration = .init(), curve: CurveServerSettings? = nil, metrics: ListenAddress? = nil) {
        self.endpoint = endpoint
        self.configuration = configuration
        self.curve = curve
        self.metrics = metrics
    }
}

/// Builds what `canopy-broker serve` runs, in start order: the broker (bound when this
/// returns) and the `/metrics` and `/health` listener when `settings` name one. Its
/// `/health` is healthy while the broker's loop turns.
///
/// - Throws: ``CommandFailure`` saying what to do when the endpoint cannot be bound or a
///   key is unusable.
public func buildBroker(settings: BrokerSettings, context: ZMQContext, logger: Logger) throws -> [any Service] {
    if let curve = settings.curve {
        logger.info(
            "broker.curve",
            metadata: [
                "broker.public_key": "\(curve.keyPair.publicKey)",
                "broker.worker_keys": "\(curve.allowList.workers.services.count)",
                "broker.client_keys": "\(curve.allowList.clients.count)",
            ])
    }
    // The listener's port first, so a taken one stops the broker before it binds the bus.
    try OperatingEndpoint.ensureFree(settings.metrics)
    var configuration = settings.configuration
    configuration.metrics = settings.metrics != nil
    let broker: BrokerServer
    do {
        broker = try BrokerServer(endpoint: settings.endpoint, configuration: configuration, curve: settings.curve, context: context, logger: logger)
    } catch let error as ZMQError {
        let holder = ListenAddress(zeroMQEndpoint: settings.endpoint).flatMap { PortCheck.holder(ofPort: $0.port) }
        throw CommandFailure(
            "cannot listen on \(settings.endpoint) for the bus: \(error)\(holder.map { " (held by \($0))" } ?? ""); stop what holds it or choose another endpoint with --bind (CANOPY_BIND)"
        )
    } catch let error as Curve.KeyError {
        throw CommandFailure(error.description)
    }
    guard let address = settings.metrics else { return [broker] }
    let endpoint = try OperatingEndpoint(
        host: address.host, port: address.port,
        health: {
            let serving = broker.isServing
            return HealthReport(healthy: serving, checks: ["loop": serving ? "bound, turning" : "not turning"])
        }, logger: logger)
    return [broker, endpoint]
}
