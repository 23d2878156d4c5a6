import CanopyBus
import Logging
import ServiceLifecycle

/// Runs long-running services in one `ServiceGroup` that shuts down gracefully on SIGTERM
/// and SIGINT, in reverse order of `services`.
public func runUntilShutdown(_ services: [any Service], logger: Logger) async throws {
    let group = ServiceGroup(configuration: .init(
        services: services.map { .init(service: $0, successTerminationBehavior: .gracefullyShutdownGroup) },
        gracefulShutdownSignals: [.sigterm, .sigint],
        logger: logger))
    try await group.run()
}
