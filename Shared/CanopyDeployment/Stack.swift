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
        /// Whether several replicas may serve at once (they share load through the broker):
        /// those with a store, when it is in PostgreSQL (`--database-url`), which they share.
        public var scales: Bool
        /// Whether it keeps data (a volume of its own).
        public var keepsData: Bool

        /// Its SQLite store, relative to the data directory (`care/care.sqlite`), when it keeps data.
        public var store: String? { keepsData ? "\(name)/\(name).sqlite" : nil }
    }

    public static let broker = Service(name: "broker", executable: "canopy-broker", metricsPort: 9400, scales: false, keepsData: false)

    /// `docker-compose.yml`'s names of each service: two live brokers, the others by their names.
    public static func composeNames(_ service: Service) -> [String] {
        service == broker ? ["broker-a", "broker-b"] : [service.name]
    }

    /// Every service, the broker first.
    public static let services: [Service] = [
        broker,
        Service(name: "images", executable: "canopy-images", metricsPort: 9401, scales: true, keepsData: true),
        Service(name: "care", executable: "canopy-care", metricsPort: 9402, scales: true, keepsData: true),
        Service(name: "identify", executable: "canopy-identify", metricsPort: 9403, scales: true, keepsData: true),
        Service(name: "remind", executable: "canopy-remind", metricsPort: 9404, scales: true, keepsData: true),
        Service(name: "api", executable: "canopy-api", metricsPort: 9405, scales: false, keepsData: true),
    ]

    /// Where one local stack's processes listen and keep their data: what `canopy up` passes
    /// each service (and what `canopy-bench stack` starts without it, as its baseline).
    public struct Launch: Sendable {
        /// The brokers' endpoints (`tcp://HOST:PORT`, or several: `A,B`): every service is
        /// given them all; broker `n` listens on the `n`th.
        public var endpoint: String
        /// ``endpoint`` as a list.
        public var endpoints: [String] { endpoint.split(separator: ",").map(String.init) }
        /// canopy-api's HTTP address (`HOST:PORT`).
        public var http: String
        /// The stores' directory.
        public var dataDirectory: String
        /// The broker's metrics port; every other service's is its usual offset from 9400 above it.
        public var metricsBase: Int
        /// canopy-api's token signing key file.
        public var tokenKeyFile: String
        /// The stack's CurveZMQ key files, or nil for a bus without CurveZMQ (`--no-curve`).
        public var curve: CurveFiles?

        /// - Parameters:
        ///   - endpoint: the broker's endpoint.
        ///   - http: canopy-api's HTTP address.
        ///   - dataDirectory: the stores' directory.
        ///   - metricsBase: the broker's metrics port.
        ///   - tokenKeyFile: canopy-api's token signing key file.
        ///   - curve: the stack's CurveZMQ key files, or nil for none.
        public init(endpoint: String, http: String, dataDirectory: String, metricsBase: Int, tokenKeyFile: String, curve: CurveFiles? = nil) {
            self.endpoint = endpoint
            self.http = http
            self.dataDirectory = dataDirectory
            self.metricsBase = metricsBase
            self.tokenKeyFile = tokenKeyFile
            self.curve = curve
        }

        /// The port of `service`'s `/metrics` and `/health` listener.
        public func metricsPort(_ service: Service) -> Int {
            metricsBase + service.metricsPort - CanopyStack.broker.metricsPort
        }

        /// Where `service`'s `/metrics` and `/health` listen (`127.0.0.1:PORT`).
        public func metricsAddress(_ service: Service) -> String {
            "127.0.0.1:\(metricsPort(service))"
        }

        /// The arguments that start `service` (its subcommand first); a replica other than the
        /// first (`replica` 2, 3, …) listens on `metricsPort` and keeps what it keeps apart in
        /// `dataDirectory`; broker `replica` binds the `replica`th endpoint and is named
        /// `broker`, `broker-2`, ….
        public func arguments(_ service: Service, metricsPort: Int? = nil, dataDirectory: String? = nil, replica: Int = 1) -> [String] {
            let dataDirectory = dataDirectory ?? self.dataDirectory
            var arguments = [service.subcommand, "--metrics-bind", "127.0.0.1:\(metricsPort ?? self.metricsPort(service))"]
            switch service.name {
            case CanopyStack.broker.name:
                // Photos up to 25 MiB travel as attachments: frames up to 32 MiB.
                let endpoints = self.endpoints
                arguments += [
                    "--bind", endpoints[min(replica, endpoints.count) - 1], "--name", replica == 1 ? "broker" : "broker-\(replica)",
                    "--max-frame-bytes", "33554432", "--capture-dir", dataDirectory,
                ]
                if let curve { arguments += ["--curve-secret-key-file", curve.secretKey(CurveFiles.broker), "--curve-allow", curve.allowList] }
            case "api":
                arguments += ["--endpoint", endpoint, "--http", http, "--token-key-file", tokenKeyFile, "--data-dir", dataDirectory]
            default:
                arguments += ["--endpoint", endpoint, "--data-dir", dataDirectory]
            }
            if let curve, service != CanopyStack.broker {
                // Its own key (a worker's serves its own service alone), and the brokers' key.
                arguments += ["--curve-server-key", curve.publicKey(CurveFiles.broker), "--curve-secret-key-file", curve.secretKey(service.name)]
            }
            return arguments
        }
    }

    /// A local stack's CurveZMQ key files, in one directory (`canopy up` makes them in
    /// `<data-dir>/keys` on its first start): one pair the brokers share, one per service, one
    /// for the operator's CLI; and the brokers' allow-list, each service's key for its own
    /// service alone (`worker KEY care`), canopy-api's and the operator's as clients.
    public struct CurveFiles: Sendable, Equatable {
        /// The brokers' key pair's name.
        public static let broker = "broker"
        /// The key pairs that may serve, each its own service.
        public static let workers = CanopyStack.services.filter { $0 != CanopyStack.broker && $0.name != "api" }.map(\.name)
        /// The key pairs that may only call: the HTTP edge, and the operator's CLI.
        public static let clients = ["api", "operator"]

        /// The directory of the files.
        public var directory: String

        public init(directory: String) {
            self.directory = directory
        }

        /// `NAME.key`: the secret half, readable by its owner only.
        public func secretKey(_ name: String) -> String { "\(directory)/\(name).key" }
        /// `NAME.pub`: the public half.
        public func publicKey(_ name: String) -> String { "\(directory)/\(name).pub" }
        /// `curve.allow`: the brokers' allow-list.
        public var allowList: String { "\(directory)/curve.allow" }
    }
}
