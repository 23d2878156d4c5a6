import ArgumentParser
import CanopyBus

/// The options every service worker shares (`serve` of each service executable).
public struct WorkerOptions: ParsableArguments {
    /// Where every default comes from: the runner's configuration.
    static let defaults = ServiceRunner.Configuration(endpoint: "")

    /// Requests held at once.
    @Option(help: ArgumentHelp("Requests this worker holds at once. Env: CANOPY_CREDIT.", valueName: "count"))
    public var credit: Int = Environment.int("CANOPY_CREDIT", default: Self.defaults.credit)

    /// Heartbeat interval in milliseconds.
    @Option(help: ArgumentHelp("Heartbeat interval in milliseconds; match the broker's. Env: CANOPY_HEARTBEAT_MS.", valueName: "ms"))
    public var heartbeatMs: Int = Environment.milliseconds("CANOPY_HEARTBEAT_MS", default: Self.defaults.heartbeatInterval)

    /// Missed broker heartbeats before reconnecting.
    @Option(help: ArgumentHelp("Missed broker heartbeats before reconnecting. Env: CANOPY_LIVENESS.", valueName: "beats"))
    public var liveness: Int = Environment.int("CANOPY_LIVENESS", default: Self.defaults.liveness)

    /// How long shutdown waits for running handlers.
    @Option(help: ArgumentHelp("How long shutdown waits for running handlers, in milliseconds. Env: CANOPY_DRAIN_TIMEOUT_MS.", valueName: "ms"))
    public var drainTimeoutMs: Int = Environment.milliseconds("CANOPY_DRAIN_TIMEOUT_MS", default: Self.defaults.drainTimeout)

    /// The time the service goes by.
    @Option(
        help: ArgumentHelp(
            "The time this service goes by: system, fixed:2026-11-24T09:00:00Z (stopped there, for tests and exact replays), from:2026-11-24T09:00:00Z (starting there, running) or from:2026-11-24T09:00:00Z,at:INSTANT (standing there at that instant of the system clock, running: what a fresh replay stack runs on). Env: CANOPY_CLOCK.",
            valueName: "clock"))
    public var clock: String = Environment.string("CANOPY_CLOCK") ?? "system"

    /// Parsed by argument parser.
    public init() {}

    /// The clock `--clock` names (checked by ``validate()``).
    public var serviceClock: ServiceClock { ServiceClock(parsing: clock) ?? .system }

    public func validate() throws {
        try Environment.validate()
        guard credit >= 1, credit <= 100_000 else { throw ValidationError("--credit must be from 1 to 100000; 8 is the usual value") }
        guard heartbeatMs >= 10 else { throw ValidationError("--heartbeat-ms must be at least 10; use the broker's value (1000 by default)") }
        guard liveness >= 1 else { throw ValidationError("--liveness must be at least 1 missed heartbeat; 3 is the usual value") }
        guard drainTimeoutMs >= 0 else { throw ValidationError("--drain-timeout-ms cannot be negative") }
        guard ServiceClock(parsing: clock) != nil else {
            throw ValidationError("--clock '\(clock.prefix(60))' is not a clock; give system, fixed:2026-11-24T09:00:00Z or from:2026-11-24T09:00:00Z")
        }
    }

    /// The runner configuration these options describe, for the broker `common` names.
    public func runnerConfiguration(_ common: CommonOptions) throws -> ServiceRunner.Configuration {
        var configuration = ServiceRunner.Configuration(endpoint: common.endpoint)
        guard credit >= configuration.endpoints.count else {
            throw ValidationError(
                "--credit \(credit) cannot be shared by \(configuration.endpoints.count) brokers: each holds at least one; raise --credit (CANOPY_CREDIT) to \(configuration.endpoints.count) or more"
            )
        }
        configuration.curve = try common.curveSettings()
        configuration.stack = common.stack
        configuration.credit = credit
        configuration.heartbeatInterval = .milliseconds(heartbeatMs)
        configuration.liveness = liveness
        configuration.drainTimeout = .milliseconds(drainTimeoutMs)
        return configuration
    }
}
