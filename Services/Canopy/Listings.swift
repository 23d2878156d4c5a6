import ArgumentParser
import CanopyBus
import CanopyMessages
import CanopyServiceKit

/// `canopy services`: the connected services as a table.
struct Services: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the services that have workers, with their operations.",
        discussion: "Example: canopy services --endpoint tcp://127.0.0.1:5555")

    @OptionGroup var common: CommonOptions

    func run() async throws {
        try await withBus(common) { bus in
            let services = try await bus.call(Broker.Services.self, .init(), timeout: .seconds(5))
            var table = Table("SERVICE", "WORKERS", "OPERATION", "IDEMPOTENT", "COALESCABLE")
            for service in services {
                for (index, operation) in service.operations.enumerated() {
                    table.append([
                        index == 0 ? service.name : "", index == 0 ? "\(service.workers)" : "",
                        operation.name, operation.idempotent ? "yes" : "no", operation.coalescable ? "yes" : "no",
                    ])
                }
            }
            print(services.isEmpty ? "no services connected" : table.render())
        }
    }
}

/// `canopy stats`: per-service counters and latency as a table.
struct Stats: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the broker's per-service counters and latency.",
        discussion: "Example: canopy stats --endpoint tcp://127.0.0.1:5555")

    @OptionGroup var common: CommonOptions

    func run() async throws {
        try await withBus(common) { bus in
            let stats = try await bus.call(Broker.Stats.self, .init(), timeout: .seconds(5))
            var table = Table("SERVICE", "WORKERS", "QUEUED", "IN FLIGHT", "SERVED", "ERRORS", "P50 µs", "P99 µs")
            for service in stats.services {
                table.append([
                    service.name, "\(service.workers)", "\(service.queued)", "\(service.inFlight)",
                    "\(service.served)", "\(service.errors)", "\(service.p50Micros)", "\(service.p99Micros)",
                ])
            }
            print("uptime \(Int(stats.uptimeSeconds)) s, \(stats.rejected) request(s) rejected by the broker (\(stats.malformed) malformed), \(stats.heldBytes) bytes of requests held, \(stats.openFlights) open flight(s)")
            if let unread = stats.unreadReplyBytes, let drops = stats.slowReaderDrops {
                print("\(unread) bytes of replies wait for clients to read them; \(drops) dropped for slow readers")
            }
            print(stats.services.isEmpty ? "no services" : table.render())
            guard !stats.operations.isEmpty else { return }
            var operations = Table("OPERATION", "REQUESTS", "COALESCED", "WORKER CALLS", "SAVED", "DETACHED", "REDISPATCHED", "WAITERS P50", "WAITERS P99")
            for operation in stats.operations {
                operations.append([
                    operation.operation.isEmpty ? operation.service : "\(operation.service).\(operation.operation)",
                    "\(operation.requests)", "\(operation.coalesced)", "\(operation.workerCalls)", "\(operation.workerCallsSaved)",
                    "\(operation.detachedWaiters)", "\(operation.redispatchedFlights)", "\(operation.waitersPerFlightP50)", "\(operation.waitersPerFlightP99)",
                ])
            }
            print("")
            print(operations.render())
        }
    }
}
