/// The timing both ends of the bus share unless told otherwise: the broker's and every
/// worker's defaults come from here, so they cannot drift apart.
public enum BusDefaults {
    /// How often the broker and workers send heartbeats (busy workers included).
    public static let heartbeatInterval: Duration = .seconds(1)
    /// Missed heartbeats before a peer counts as gone.
    public static let liveness = 3
    /// How long a graceful shutdown waits for requests in flight, for the broker and for
    /// workers alike (both read `CANOPY_DRAIN_TIMEOUT_MS`).
    public static let drainTimeout: Duration = .seconds(10)
    /// The largest frame, by default (16 MiB).
    public static let maximumFrameBytes = 16 * 1024 * 1024
}
