/// The services a whole Canopy stack runs, in start order: one list that `canopy up` starts
/// as local processes and that `docker-compose.yml` runs as containers (a test checks that the
/// compose file names the same ones, with executables, subcommands, options and variables
/// that exist).
public enum CanopyStack {
    /// One service of the stack.
    public struct Service: Sendable, Equatable {
        /// Its name in the stack (`docker-compose.yml`'s service, `canopy logs NAME`).
        public var name: String
        /// The executable, and the subcommand that serves.
        public var executable: String
        public var subcommand = "serve"
        /// Where its `/metrics` and `/health` listen by default (``OperatingOptions/Defaults``).
        public var metricsPort: Int
        /// Whether several instances may serve at once on one host (they share load through
        /// the broker; those with a store share its SQLite file in WAL mode on one volume).
        public var scales: Bool
        /// Whether it keeps data (a volume of its own).
        public var keepsData: Bool
    }

    public static let broker = Service(name: "broker", executable: "canopy-broker", metricsPort: 9400, scales: false, keepsData: false)

    /// Every service, the broker first.
    public static let services: [Service] = [
        broker,
        Service(name: "images", executable: "canopy-images", metricsPort: 9401, scales: true, keepsData: true),
        Service(name: "care", executable: "canopy-care", metricsPort: 9402, scales: false, keepsData: true),
        Service(name: "identify", executable: "canopy-identify", metricsPort: 9403, scales: true, keepsData: true),
        Service(name: "remind", executable: "canopy-remind", metricsPort: 9404, scales: false, keepsData: true),
        Service(name: "batch", executable: "canopy-batch", metricsPort: 9405, scales: false, keepsData: false),
    ]
}
