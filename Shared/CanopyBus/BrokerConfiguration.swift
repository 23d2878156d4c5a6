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
    /// Deadline for requests whose header gives none (and for every Majordomo request).
    public var defaultTimeout: Duration = .seconds(30)
    /// Longest deadline a request may ask for.
    public var maximumTimeout: Duration = .seconds(600)
    /// How long a graceful shutdown waits for in-flight requests.
    public var drainTimeout: Duration = .seconds(5)

    // MARK: Coalescing

    /// Coalesce identical in-flight requests of operations workers declare coalescable.
    public var coalescing = true
    /// Services whose requests are never coalesced, whatever their workers declare.
    public var coalescingDisabledServices: Set<String> = []
    /// Waiters one flight takes before identical requests are answered `busy`.
    public var maximumWaitersPerFlight = 10_000
    /// Coalescable flights open at once before new distinct requests are answered `busy`.
    public var maximumOpenFlights = 10_000
    /// A flight older than this takes no new waiters; the next identical request starts a
    /// fresh flight (so one stuck worker call does not collect everyone).
    public var stuckFlightAge: Duration = .seconds(10)
    /// Majordomo (7/MDP) services whose requests are coalesced (Majordomo workers declare
    /// nothing, so the operator says which are safe: they must be idempotent).
    public var majordomoCoalescedServices: Set<String> = []

    /// The defaults.
    public init() {}

    /// How long a worker may stay silent before it counts as dead.
    public var workerExpiry: Duration { heartbeatInterval * liveness }
}
