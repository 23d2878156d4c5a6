/// The broker's own management operations. They live in the reserved `broker` service,
/// which no worker may register.
public enum Broker {
    /// The reserved service name.
    public static let service = "broker"

    /// `broker.services`: the services that have workers now, with their operations.
    public enum Services: BusOperation {
        /// Nothing.
        public typealias Request = Empty
        /// One description per service that has workers, sorted by name.
        public typealias Reply = [ServiceDescription]
        public static let service = Broker.service
        public static let name = "services"
        public static let access = Access.public
        public static let idempotent = true
    }

    /// `broker.stats`: per-service counters and latency.
    public enum Stats: BusOperation {
        /// Nothing.
        public typealias Request = Empty
        /// The broker's counters now.
        public typealias Reply = BrokerStatistics
        public static let service = Broker.service
        public static let name = "stats"
        public static let access = Access.operator
        public static let idempotent = true
    }

    /// `broker.capture.start`: begins capturing what crosses the broker into a file of the
    /// broker's capture directory (`--capture-dir`; without one the broker refuses).
    public enum CaptureStart: BusOperation {
        /// The file's name, and how to capture: pseudonymized, without attachments, or with a hold for
        /// a snapshot.
        public struct Request: Codable, Sendable, Equatable {
            /// The file's name in the capture directory: 1 to 100 of A-Z, a-z, 0-9, '.', '-',
            /// '_', not starting with '.'.
            public var name: String
            /// Principals replaced by keyed hashes.
            public var pseudonymize: Bool?
            /// Attachment bytes (photos) left out.
            public var withoutAttachments: Bool?
            /// For a snapshot (`canopy capture start NAME --snapshot`): the broker holds new
            /// requests, waits until the ones in the air are answered, and answers this
            /// request then (the *cut*: every request the capture records comes after it);
            /// the requests stay held until `broker.capture.release`, or this many
            /// milliseconds (at most 60,000), whichever is first.
            public var holdMilliseconds: Int?
            /// The pseudonyms' key (32 bytes, base64) when the caller pseudonymizes a snapshot
            /// with the same pseudonyms; without it the broker makes one and never tells it.
            public var pseudonymKey: String?

            public init(
                name: String, pseudonymize: Bool? = nil, withoutAttachments: Bool? = nil, holdMilliseconds: Int? = nil,
                pseudonymKey: String? = nil
            ) {
                self.name = name
                self.pseudonymize = pseudonymize
                self.withoutAttachments = withoutAttachments
                self.holdMilliseconds = holdMilliseconds
                self.pseudonymKey = pseudonymKey
            }
        }
        /// The capture's status once it runs (with a hold: at the cut, with `cutAt` and the requests
        /// held).
        public typealias Reply = CaptureStatus
        public static let service = Broker.service
        public static let name = "capture.start"
        public static let access = Access.operator
    }

    /// `broker.capture.release`: ends the hold a `capture.start` with `holdMilliseconds`
    /// began: a mark record goes into the capture (naming the snapshot taken during the hold,
    /// when one was), then the held requests, which go on to their workers.
    public enum CaptureRelease: BusOperation {
        /// The snapshot taken during the hold, named in the mark record.
        public struct Request: Codable, Sendable, Equatable {
            /// The snapshot taken while the requests were held (its directory's name), or nil
            /// when none could be taken.
            public var snapshot: String?

            public init(snapshot: String?) {
                self.snapshot = snapshot
            }
        }
        /// The capture's status once the held requests went on; `conflict` when no hold is in force.
        public typealias Reply = CaptureStatus
        public static let service = Broker.service
        public static let name = "capture.release"
        public static let access = Access.operator
    }

    /// `broker.hold`: holds every new client request (not those services make while serving)
    /// and answers once the requests in the air are answered: the cut, at which every store
    /// agrees with every other (what `canopy backup` copies). `capture.release` ends it; it
    /// ends by itself `holdMilliseconds` after the cut (at most 60 s), so a caller that dies
    /// never stops the stack for long. A capture running meanwhile records a mark at the
    /// release. Refused while another hold is in force.
    public enum Hold: BusOperation {
        /// How long the hold may last after the cut: 1 to 60,000 milliseconds.
        public struct Request: Codable, Sendable, Equatable {
            public var holdMilliseconds: Int

            public init(holdMilliseconds: Int) {
                self.holdMilliseconds = holdMilliseconds
            }
        }
        /// Sent at the cut: the status, with `cutAt` and how many requests are held.
        public typealias Reply = CaptureStatus
        public static let service = Broker.service
        public static let name = "hold"
        public static let access = Access.operator
    }

    /// `broker.capture.stop`: writes what is queued, closes the file, answers the final counts.
    public enum CaptureStop: BusOperation {
        /// Nothing.
        public typealias Request = Empty
        /// The stopped capture's final counts; `conflict` when none runs.
        public typealias Reply = CaptureStatus
        public static let service = Broker.service
        public static let name = "capture.stop"
        public static let access = Access.operator
    }

    /// `broker.capture.status`: whether a capture runs, and its counts.
    public enum CaptureStatusOperation: BusOperation {
        /// Nothing.
        public typealias Request = Empty
        /// The running capture's counts (or the last one's), with the requests held now.
        public typealias Reply = CaptureStatus
        public static let service = Broker.service
        public static let name = "capture.status"
        public static let access = Access.operator
        public static let idempotent = true
    }
}

/// A capture's state and counts (of the running one, or the one just stopped).
public struct CaptureStatus: Codable, Sendable, Equatable {
    public var capturing: Bool
    /// The first file's path.
    public var path: String?
    public var records: UInt64
    public var bytes: UInt64
    /// Records dropped because the disk did not keep up.
    public var dropped: UInt64
    /// Records lost to a write error.
    public var failed: UInt64
    /// Files written (rotation by size).
    public var segments: Int
    /// The write error that stopped the capture.
    public var error: String?
    /// For a capture started with a hold: when the requests in the air were all answered
    /// and new ones began to be held (the cut a snapshot is consistent with), nanoseconds
    /// since 1970.
    public var cutAt: Int64?
    /// Requests held now (for a capture started with a hold, until it is released).
    public var held: Int?

    public init(
        capturing: Bool, path: String? = nil, records: UInt64 = 0, bytes: UInt64 = 0, dropped: UInt64 = 0, failed: UInt64 = 0,
        segments: Int = 0, error: String? = nil
    ) {
        self.capturing = capturing
        self.path = path
        self.records = records
        self.bytes = bytes
        self.dropped = dropped
        self.failed = failed
        self.segments = segments
        self.error = error
    }
}

/// A service as the broker sees it.
public struct ServiceDescription: Codable, Sendable, Equatable {
    /// The service name.
    public var name: String
    /// How many workers serve it.
    public var workers: Int
    /// The operations its workers announced, sorted by name. Majordomo workers take any
    /// operation; theirs is listed as `*`.
    public var operations: [OperationDescriptor]
    /// Whether its workers speak Majordomo (7/MDP) rather than Canopy's protocol.
    public var majordomo: Bool

    /// - Parameters:
    ///   - name: the service name.
    ///   - workers: how many workers serve it.
    ///   - operations: the operations its workers announced.
    ///   - majordomo: whether its workers speak Majordomo.
    public init(name: String, workers: Int, operations: [OperationDescriptor], majordomo: Bool = false) {
        self.name = name
        self.workers = workers
        self.operations = operations
        self.majordomo = majordomo
    }
}

/// The broker's counters, as `broker.stats` returns them.
public struct BrokerStatistics: Codable, Sendable, Equatable {
    /// Seconds since the broker started.
    public var uptimeSeconds: Double
    /// Requests answered by the broker itself because they were malformed, named no
    /// service, or hit a bound.
    public var rejected: UInt64
    /// Messages dropped or refused because they were malformed (bad frames or commands).
    public var malformed: UInt64
    /// Bytes of request bodies the broker holds now (queued, or at a worker).
    public var heldBytes: Int
    /// Coalescable flights in the air that identical requests can still join.
    public var openFlights: Int
    /// One entry per service that has workers, sorted by name.
    public var services: [ServiceStatistics]
    /// One entry per operation that was called, sorted by service and operation.
    public var operations: [OperationStatistics]
    /// The capture, when one runs or ran since the broker started.
    public var capture: CaptureStatus?
    /// Bytes of replies waiting for clients to read them (bounded per client and in all).
    public var unreadReplyBytes: Int?
    /// Replies dropped since the broker started because their client read too slowly (a
    /// bound on unread replies was reached); the client was told `busy` instead.
    public var slowReaderDrops: UInt64?
    /// Workers' answers dropped since the broker started because the request they named was
    /// no longer held (every caller left, by cancel or deadline): never passed to anyone.
    public var staleAnswers: UInt64?

    /// - Parameters:
    ///   - uptimeSeconds: seconds since the broker started.
    ///   - rejected: requests the broker answered itself with an error.
    ///   - malformed: messages dropped or refused as malformed.
    ///   - heldBytes: bytes of request bodies held now.
    ///   - openFlights: coalescable flights that can still be joined.
    ///   - services: per-service figures.
    ///   - operations: per-operation coalescing figures.
    public init(
        uptimeSeconds: Double, rejected: UInt64, malformed: UInt64, heldBytes: Int, openFlights: Int,
        services: [ServiceStatistics], operations: [OperationStatistics]
    ) {
        self.uptimeSeconds = uptimeSeconds
        self.rejected = rejected
        self.malformed = malformed
        self.heldBytes = heldBytes
        self.openFlights = openFlights
        self.services = services
        self.operations = operations
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
    /// Bytes of the request bodies waiting for credit now.
    public var queuedBytes: Int
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
        name: String, workers: Int, queued: Int, queuedBytes: Int, inFlight: Int, served: UInt64, errors: UInt64,
        p50Micros: UInt64, p99Micros: UInt64
    ) {
        self.name = name
        self.workers = workers
        self.queued = queued
        self.queuedBytes = queuedBytes
        self.inFlight = inFlight
        self.served = served
        self.errors = errors
        self.p50Micros = p50Micros
        self.p99Micros = p99Micros
    }
}

/// One operation's coalescing counters.
public struct OperationStatistics: Codable, Sendable, Equatable {
    /// The service.
    public var service: String
    /// The operation (empty for a Majordomo client's request to a Majordomo service).
    public var operation: String
    /// Requests admitted (joined a flight or started one).
    public var requests: UInt64
    /// Requests that joined a flight already in the air.
    public var coalesced: UInt64
    /// Calls made to workers (a re-dispatched flight counts twice).
    public var workerCalls: UInt64
    /// Worker calls not made because a request joined a flight (equals ``coalesced``).
    public var workerCallsSaved: UInt64
    /// Waiters that left a flight others still waited on (their deadline or a cancel).
    public var detachedWaiters: UInt64
    /// Flights sent once more to another worker after theirs was lost.
    public var redispatchedFlights: UInt64
    /// Flights that ended.
    public var flights: UInt64
    /// Median waiters per ended flight.
    public var waitersPerFlightP50: UInt64
    /// 99th percentile of waiters per ended flight.
    public var waitersPerFlightP99: UInt64
    /// Most waiters one flight had.
    public var waitersPerFlightMax: UInt64
    /// Requests answered, by outcome: `ok` or an error code (only outcomes that occurred).
    public var outcomes: [String: UInt64]

    /// Makes an entry; every figure is as named.
    public init(
        service: String, operation: String, requests: UInt64, coalesced: UInt64, workerCalls: UInt64, workerCallsSaved: UInt64,
        detachedWaiters: UInt64, redispatchedFlights: UInt64, flights: UInt64,
        waitersPerFlightP50: UInt64, waitersPerFlightP99: UInt64, waitersPerFlightMax: UInt64, outcomes: [String: UInt64] = [:]
    ) {
        self.outcomes = outcomes
        self.service = service
        self.operation = operation
        self.requests = requests
        self.coalesced = coalesced
        self.workerCalls = workerCalls
        self.workerCallsSaved = workerCallsSaved
        self.detachedWaiters = detachedWaiters
        self.redispatchedFlights = redispatchedFlights
        self.flights = flights
        self.waitersPerFlightP50 = waitersPerFlightP50
        self.waitersPerFlightP99 = waitersPerFlightP99
        self.waitersPerFlightMax = waitersPerFlightMax
    }
}
