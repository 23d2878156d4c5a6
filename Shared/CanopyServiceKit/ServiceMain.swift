import CanopyBus
import Logging
import ServiceLifecycle
import UnixSignals

/// The `ServiceGroup` every executable runs its services in: started in order, shut down in
/// reverse order, and the whole group shut down gracefully when any one of them ends.
///
/// - Parameters:
///   - services: what a build function returned, in start order.
///   - signals: the signals that start a graceful shutdown (none for tests, which trigger it).
///   - logger: where the group logs.
public func serviceGroup(_ services: [any Service], signals: [UnixSignal] = [.sigterm, .sigint], logger: Logger) -> ServiceGroup {
    ServiceGroup(configuration: .init(
        services: services.map { .init(service: $0, successTerminationBehavior: .gracefullyShutdownGroup) },
        gracefulShutdownSignals: signals,
        logger: logger))
}

/// Runs long-running services in one ``serviceGroup(_:signals:logger:)`` until SIGTERM or
/// SIGINT, with the span exporter first (so stopped last) when ``Traces`` is on (by the
/// `OTEL_*` variables, or `traces`).
public func runUntilShutdown(_ services: [any Service], traces options: TraceOptions? = nil, edgeSampling: EdgeSampling? = nil,
                             logger: Logger) async throws {
    let traces = try Traces.bootstrap(serviceName: Traces.executableName, options: options, edgeSampling: edgeSampling)
    try await serviceGroup((traces.map { [$0] } ?? []) + services, logger: logger).run()
}
