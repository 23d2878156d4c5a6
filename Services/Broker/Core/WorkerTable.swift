import CanopyMessages
import CanopyWire

extension BrokerState {
    /// Connected workers and the services they make up: who serves what, in which protocol,
    /// with how much credit, and each operation's counters (kept across workers' comings and
    /// goings). Bookkeeping only: what a worker's arrival or loss means for the flights it
    /// holds, the router decides.
    struct WorkerTable {
        private(set) var services: [String: ServiceEntry] = [:]
        private var workers: [PeerKey: Worker] = [:]
        private var counters: [String: OperationCounters] = [:]

        subscript(peer: PeerKey) -> Worker? { workers[peer] }

        /// The service named `name`, while it has workers or requests waiting for some.
        func service(_ name: String) -> ServiceEntry? { services[name] }

        var count: Int { workers.count }

        /// Every worker, in no order.
        var all: Dictionary<PeerKey, Worker>.Values { workers.values }

        /// Adds a worker to its service (made on first use), or says why it cannot join.
        mutating func add(
            _ peer: PeerKey, dialect: Dialect, service name: String, operations: [String: OperationDescriptor],
            majordomoDescriptor: OperationDescriptor? = nil, credit: Int, key: String?, expiry: ContinuousClock.Instant
        ) -> Result<Worker, Refusal> {
            let service = services[name] ?? ServiceEntry(name: name)
            if let existing = service.dialect, existing != dialect, !service.workers.isEmpty {
                return .failure(
                    Refusal(reason: "'\(name)' is served by \(existing == .canopy ? "Canopy" : "Majordomo") workers already; one service speaks one protocol"))
            }
            service.dialect = dialect
            services[name] = service
            let worker = Worker(
                identity: peer, dialect: dialect, service: service, operations: operations,
                majordomoDescriptor: majordomoDescriptor, credit: credit, key: key, expiry: expiry)
            workers[peer] = worker
            service.workers.append(worker)
            return .success(worker)
        }

        /// Why a worker may not join.
        struct Refusal: Error {
            let reason: String
        }

        /// Removes a worker from the table and its service; the flights it held are the
        /// caller's to settle.
        mutating func remove(_ peer: PeerKey) -> Worker? {
            guard let worker = workers.removeValue(forKey: peer) else { return nil }
            worker.service.workers.removeAll { $0 === worker }
            worker.service.inFlight -= worker.held.count
            return worker
        }

        /// A service made for requests that came before any of its workers (the start-up
        /// grace), or nil when `limit` such services wait already.
        mutating func awaitedService(_ name: String, limit: Int) -> ServiceEntry? {
            guard services.values.count(where: { $0.workers.isEmpty }) < limit else { return nil }
            let service = ServiceEntry(name: name)
            services[name] = service
            return service
        }

        /// Forgets a service with no workers left.
        mutating func drop(_ service: ServiceEntry) {
            if services[service.name] === service { services[service.name] = nil }
        }

        /// Workers whose last sign of life is older than their expiry.
        func expired(now: ContinuousClock.Instant) -> [Worker] {
            workers.values.filter { $0.expiry < now }
        }

        /// `operation` of `service` as its workers serve it, or `nil` when none does.
        mutating func resolve(_ operation: String, of service: ServiceEntry) -> ResolvedOperation? {
            if let known = service.resolved[operation] { return known }
            guard let descriptor = service.describe(operation) else { return nil }
            // Past 1024 names (Majordomo workers take any) it is not kept, and so never told
            // when the workers change: it claims nothing about them.
            let kept = service.resolved.count < 1024
            let resolved = ResolvedOperation(
                descriptor: descriptor, counters: counters(service: service.name, operation: operation),
                servedByAll: kept && service.workers.allSatisfy { $0.descriptor(for: operation) != nil })
            if kept { service.resolved[operation] = resolved }
            return resolved
        }

        /// The counters of one operation. Majordomo workers take any operation name, so past
        /// 1024 names new ones share one `service.*` entry and the table stays bounded.
        mutating func counters(service: String, operation: String) -> OperationCounters {
            var operation = operation
            var name = operation.isEmpty ? service : "\(service).\(operation)"
            if counters[name] == nil && counters.count >= 1024 {
                operation = "*"
                name = "\(service).*"
            }
            if let existing = counters[name] { return existing }
            let created = OperationCounters(service: service, operation: operation)
            counters[name] = created
            return created
        }

        /// Every operation's counters, by name.
        var operationStatistics: [OperationStatistics] {
            counters.keys.sorted().map { counters[$0]!.statistics }
        }

        /// What `broker.services` answers.
        func descriptions() -> [ServiceDescription] {
            services.values.filter { !$0.workers.isEmpty }.sorted { $0.name < $1.name }.map { service in
                ServiceDescription(name: service.name, workers: service.workers.count, operations: service.operations, majordomo: service.dialect == .majordomo)
            }
        }

        /// Each service's figures for `broker.stats`.
        func statistics() -> [ServiceStatistics] {
            services.values.sorted { $0.name < $1.name }.map { service in
                let histogram = service.latencyMicros
                return ServiceStatistics(
                    name: service.name, workers: service.workers.count, queued: service.queuedCount, queuedBytes: service.queuedBytes,
                    inFlight: service.inFlight,
                    served: service.served, errors: service.errors,
                    p50Micros: histogram.totalCount == 0 ? 0 : histogram.valueAtPercentile(50),
                    p99Micros: histogram.totalCount == 0 ? 0 : histogram.valueAtPercentile(99))
            }
        }
    }
}
