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
    ServiceGroup(
        configuration: .init(
            services: services.map { .init(service: $0, successTerminationBehavior: .gracefullyShutdownGroup) },
            gracefulShutdownSignals: signals,
            logger: logger))
}

/// Runs long-running services in one ``serviceGroup(_:signals:logger:)`` until SIGTERM or
/// SIGINT, with the span exporter first (so stopped last) when ``Traces`` is on (by the
/// `OTEL_*` variables, or `traces`).
public func runUntilShutdown(
    _ services: [any Service], traces options: TraceOptions? = nil, edgeSampling: EdgeSampling? = nil,
    logger: Logger
) async throws {
    let traces = try Traces.bootstrap(serviceName: Traces.executableName, options: options, edgeSampling: edgeSampling)
    try await serviceGroup((traces.map { [$0] } ?? []) + services, logger: logger).run()
}

/// Runs `build` (opening stores, which may wait for a database that is not up yet) so that
/// SIGTERM or SIGINT before the service group runs ends it as a stop asked for: `build` is
/// cancelled and nil comes back, and the process exits 0 as it would once serving. (Before
/// this, a signal there killed the process: its default action.)
public func buildUnlessStopped<T: Sendable>(logger: Logger, _ build: @escaping @Sendable () async throws -> T) async throws -> T? {
    let signals = await UnixSignalsSequence(trapping: .sigterm, .sigint)
    let built = try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await build() }
        group.addTask {
            for await _ in signals { return nil }
            throw CancellationError() // the sequence ended: only when this task is cancelled
        }
        defer { group.cancelAll() }
        return try await group.next()!
    }
    if built == nil { logger.notice("service.stopped.before.serving") }
    return built
}
