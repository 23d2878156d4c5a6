/// The broker's tunables. Defaults match `canopy-broker --help`.
public struct BrokerConfiguration: Sendable {
    /// How often the broker and workers send heartbeats (busy workers included).
    public var heartbeatInterval: Duration = .seconds(1)
    /// Missed heartbeats before a worker counts as dead.
    public var liveness: Int = 3
    /// Requests waiting for credit per service before new ones are answered `busy`.
    public var maximumQueuedPerService: Int = 1_000
    /// Largest frame accepted; larger requests are answered `tooLarge`.
    public var maximumFrameBytes: Int = 16 * 1024 * 1024
    /// Deadline for requests whose header gives none.
    public var defaultTimeout: Duration = .seconds(30)
    /// Longest deadline a request may ask for.
    public var maximumTimeout: Duration = .seconds(600)
    /// How long a graceful shutdown waits for in-flight requests.
    public var drainTimeout: Duration = .seconds(5)

    /// The defaults.
    public init() {}

    /// How long a worker may stay silent before it counts as dead.
    public var workerExpiry: Duration { heartbeatInterval * liveness }
}
