/// The broker's own management operations. They live in the reserved `broker` service,
/// which no worker may register.
public enum Broker {
    /// The reserved service name.
    public static let service = "broker"

    /// `broker.services`: the services that have workers now, with their operations.
    public enum Services: BusOperation {
        public typealias Request = Empty
        public typealias Reply = [ServiceDescription]
        public static let service = Broker.service
        public static let name = "services"
        public static let idempotent = true
    }

    /// `broker.stats`: per-service counters and latency.
    public enum Stats: BusOperation {
        public typealias Request = Empty
        public typealias Reply = BrokerStatistics
        public static let service = Broker.service
        public static let name = "stats"
        public static let idempotent = true
    }
}

/// A service as the broker sees it.
public struct ServiceDescription: Codable, Sendable, Equatable {
    /// The service name.
    public var name: String
    /// How many workers serve it.
    public var workers: Int
    /// The operations its workers announced, sorted by name.
    public var operations: [OperationDescriptor]

    /// - Parameters:
    ///   - name: the service name.
    ///   - workers: how many workers serve it.
    ///   - operations: the operations its workers announced.
    public init(name: String, workers: Int, operations: [OperationDescriptor]) {
        self.name = name
        self.workers = workers
        self.operations = operations
    }
}

/// The broker's counters, as `broker.stats` returns them.
public struct BrokerStatistics: Codable, Sendable, Equatable {
    /// Seconds since the broker started.
    public var uptimeSeconds: Double
    /// Requests answered by the broker itself because they were malformed, named no
    /// service, or hit a bound.
    public var rejected: UInt64
    /// One entry per service that has workers or has served requests, sorted by name.
    public var services: [ServiceStatistics]

    /// - Parameters:
    ///   - uptimeSeconds: seconds since the broker started.
    ///   - rejected: requests the broker answered itself with an error.
    ///   - services: per-service figures.
    public init(uptimeSeconds: Double, rejected: UInt64, services: [ServiceStatistics]) {
        self.uptimeSeconds = uptimeSeconds
        self.rejected = rejected
        self.services = services
    }
}

/// One service's counters.
public struct ServiceStatistics: Codable, Sendable, Equatable {
    /// The service name.
    public var name: String
    /// Workers connected now.
    public var workers: Int
    /// Requests waiting for a worker's credit now.
    public var queued: Int
    /// Requests held by workers now.
    public var inFlight: Int
    /// Requests answered with a reply from a worker.
    public var served: UInt64
    /// Requests answered with an error (from a worker or the broker: timeout, busy, worker lost).
    public var errors: UInt64
    /// Median time from the broker receiving a request to it sending the answer, in microseconds.
    public var p50Micros: UInt64
    /// 99th percentile of the same, in microseconds.
    public var p99Micros: UInt64

    /// Makes a statistics entry; every figure is as named.
    public init(
        name: String, workers: Int, queued: Int, inFlight: Int, served: UInt64, errors: UInt64,
        p50Micros: UInt64, p99Micros: UInt64
    ) {
        self.name = name
        self.workers = workers
        self.queued = queued
        self.inFlight = inFlight
        self.served = served
        self.errors = errors
        self.p50Micros = p50Micros
        self.p99Micros = p99Micros
    }
}
