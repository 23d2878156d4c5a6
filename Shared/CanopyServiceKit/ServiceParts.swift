import CZeroMQ
import CanopyBus
import Logging
import ServiceLifecycle

/// What a bus worker is made of before it is put on a bus: the handlers a runner serves, and
/// the services that run beside them (an outbox, a dispatcher, a pressure monitor). Each
/// worker's `make…Service(settings:bus:logger:)` makes its parts from any ``BusCalling`` (the
/// one it calls other services with); its `build…Service` puts them on the real bus
/// (``assembled(runner:bus:metrics:context:logger:)``), and tests put them on an in-process
/// bus instead.
public struct ServiceParts: Sendable {
    /// What the runner serves.
    public var handlers: any BusService
    /// What runs beside the handlers, in start order.
    public var background: [any Service]
    /// Called the moment graceful shutdown begins, before the runner drains: a PostgreSQL
    /// store stops waiting on connections not made yet (``PostgresStore/beginShutdown()``).
    public var onShutdown: [@Sendable () -> Void]

    public init(handlers: any BusService, background: [any Service] = [], onShutdown: [@Sendable () -> Void] = []) {
        self.handlers = handlers
        self.background = background
        self.onShutdown = onShutdown
    }

    /// What a worker process runs, in start order: the bus client it calls others with (when it
    /// has one: started first, closed last), the background services, the runner (stopped
    /// first: it drains its requests while the rest still run), and the `/metrics` and
    /// `/health` listener when `metrics` names one.
    public func assembled(
        runner configuration: ServiceRunner.Configuration, bus: BusClient?, metrics: ListenAddress?, context: ZMQContext,
        logger: Logger
    ) throws -> [any Service] {
        let runner = ServiceRunner(service: handlers, configuration: configuration, context: context, logger: logger)
        let notice: [any Service] = onShutdown.isEmpty ? [] : [ShutdownNotice(actions: onShutdown)]
        let services: [any Service] = (bus.map { [$0] } ?? []) + background + [runner] + notice
        return try OperatingEndpoint.serving(services, at: metrics, logger: logger)
    }
}

/// Runs `actions` when graceful shutdown begins. Placed after the runner in the group, it is
/// told first (a group shuts down in reverse order), so the actions run before the runner
/// drains.
public struct ShutdownNotice: Service {
    let actions: [@Sendable () -> Void]

    public init(actions: [@Sendable () -> Void]) {
        self.actions = actions
    }

    public func run() async throws {
        try? await gracefulShutdown()
        for action in actions { action() }
    }
}
