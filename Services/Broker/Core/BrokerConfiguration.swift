import CanopyCapture
import CanopyIO
import CanopyWire
import Tracing

/// The broker's tunables. Defaults match `canopy-broker --help`.
public struct BrokerConfiguration: Sendable {
    /// This broker's name among several live ones (`--name`): the `broker` label of its
    /// metrics, and what its logs and `canopy status` call it.
    public var name = "broker"
    /// How often the broker and workers send heartbeats (busy workers included).
    public var heartbeatInterval: Duration = BusDefaults.heartbeatInterval
    /// Missed heartbeats before a worker counts as dead.
    public var liveness: Int = BusDefaults.liveness
    /// Largest frame accepted; larger requests are answered `tooLarge`, and so are the
    /// callers of a worker whose reply is larger.
    public var maximumFrameBytes: Int = BusDefaults.maximumFrameBytes
    /// Deadline for requests whose header gives none (and for every Majordomo request).
    public var defaultTimeout: Duration = .seconds(30)
    /// Longest deadline a request may ask for.
    public var maximumTimeout: Duration = .seconds(600)
    /// How long a graceful shutdown waits for in-flight requests; the same default as a
    /// worker's (``BusDefaults/drainTimeout``), as both read
    /// `CANOPY_DRAIN_TIMEOUT_MS`.
    public var drainTimeout: Duration = BusDefaults.drainTimeout

    /// The defaults, for options that show them.
    public static let defaults = BrokerConfiguration()

    // MARK: Memory bounds

    /// Requests waiting for credit per service before new ones are answered `busy` (NATS'
    /// slow-consumer limit: a count high enough that the byte bound below decides).
    public var maximumQueuedPerService: Int = 500_000
    /// Bytes of request bodies waiting for credit per service before new ones are answered
    /// `busy` (NATS' 64 MiB per subscription).
    public var maximumQueuedBytesPerService: Int = 64 * 1024 * 1024
    /// Bytes of request bodies the broker holds in all (queued, or at a worker and kept to be
    /// sent again if it dies) before new requests are answered `busy`.
    public var maximumHeldBytes: Int = 512 * 1024 * 1024
    /// Bytes of replies that may wait unread for one client (in libzmq, for a client that
    /// reads slowly) before further replies to it are dropped and it is told `busy` for each
    /// (NATS' 64 MiB per slow consumer). A client with nothing waiting always gets its reply.
    public var maximumUnreadBytesPerClient: Int = 64 * 1024 * 1024
    /// Bytes of replies that may wait unread for all clients together.
    public var maximumUnreadBytes: Int = 512 * 1024 * 1024
    /// Services without workers that requests may name during the start-up grace (after a
    /// broker restart, clients reconnect before workers do); past it they are answered
    /// `noWorkers` at once.
    public var maximumGraceServices: Int = 64
    /// How long after the broker starts requests for services no worker has registered yet
    /// wait for one (the start-up grace); nil: one ``workerExpiry``, by when every worker the
    /// broker had before has noticed it silent and registered again.
    public var startupGrace: Duration?

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

    // MARK: Metrics

    /// Record metrics: each answer's latency per service, and every series refreshed from
    /// the broker's counters once a second (see `BrokerMetrics`). Off, the loop records
    /// nothing (what the metrics-off benchmark compares against).
    public var metrics = true

    /// The tracer of the broker's spans of sampled requests (``BrokerTracing``); `nil` takes
    /// the process's when one is installed (`Traces`, from `OTEL_EXPORTER_OTLP_ENDPOINT` or
    /// `--otlp-endpoint`), else the broker records no spans and passes trace contexts on.
    public var tracer: (any Tracer)?

    // MARK: Trust

    /// Who may register as a worker, by CurveZMQ public key; `nil` lets any peer register
    /// (the embedded loopback default, where the broker runs without CURVE).
    public var workerKeys: WorkerKeys?
    /// Keys that may call (besides worker keys, which may call too); `nil` lets any key that
    /// connected call. Checked on every request, so a key taken off a reloaded allow-list
    /// stops working on the connection it already has.
    public var clientKeys: Set<String>?
    /// The stack this broker belongs to (`--stack`, set by `canopy up`): announced on every
    /// connection, and peers that announce another stack are refused (their READY with
    /// DISCONNECT, their requests with `unauthorized`), so two stacks on one machine never mix.
    /// Peers that announce none (an operator's `canopy send`, Majordomo peers) are served.
    public var stack: String?
    /// A capture that begins with the broker (`--capture FILE`); with an empty path, only the
    /// settings (rotation, queue, pseudonyms) of captures started over the bus.
    public var capture: CaptureSettings?
    /// Where `broker.capture.start` (`canopy capture start NAME`) may create capture files;
    /// without one, capture cannot be started over the bus. Captures started so take their
    /// rotation and queue settings from ``capture`` when set.
    public var captureDirectory: String?

    /// The defaults.
    public init() {}

    /// How long a worker may stay silent before it counts as dead.
    public var workerExpiry: Duration { heartbeatInterval * liveness }
}

/// The allow-list of worker keys: which CurveZMQ public keys (Z85, 40 characters) may
/// register, and for which services.
public struct WorkerKeys: Sendable, Equatable {
    /// Services by public key; `"*"` allows every service.
    public var services: [String: Set<String>]

    /// - Parameter services: the services each public key may serve (`"*"`: any).
    public init(_ services: [String: Set<String>] = [:]) {
        self.services = services
    }

    /// Whether the peer that authenticated with `key` may register for `service`.
    public func allows(_ key: String?, service: String) -> Bool {
        guard let key, let allowed = services[key] else { return false }
        return allowed.contains("*") || allowed.contains(service)
    }
}
