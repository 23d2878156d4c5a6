import ArgumentParser
import CanopyBus
import CanopyMessages
import CanopyServiceKit

/// `canopy services`: the connected services as a table.
struct Services: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the services that have workers, with their operations (each broker's, with several).",
        discussion: "Example: canopy services --endpoint tcp://127.0.0.1:5555")

    @OptionGroup var common: CommonOptions
    @OptionGroup var stack: StackOptions // the local stack's keys, when it runs CurveZMQ

    func run() async throws {
        // With several brokers, every broker's own view, in a column of their own.
        let several = common.brokerEndpoints.count > 1
        var table = Table(headers: (several ? ["BROKER"] : []) + ["SERVICE", "WORKERS", "OPERATION", "IDEMPOTENT", "COALESCABLE"])
        var any = false
        try await withEachBroker(common, stack: stack) { endpoint, bus in
            let services = try await bus.call(Broker.Services.self, .init(), timeout: .seconds(5))
            any = any || !services.isEmpty
            for (serviceIndex, service) in services.enumerated() {
                for (index, operation) in service.operations.enumerated() {
                    let row = [
                        index == 0 ? service.name : "", index == 0 ? "\(service.workers)" : "",
                        operation.name, operation.idempotent ? "yes" : "no", operation.coalescable ? "yes" : "no",
                    ]
                    table.append(several ? [serviceIndex == 0 && index == 0 ? endpoint : ""] + row : row)
                }
            }
        }
        print(any ? table.render() : "no services connected")
    }
}

/// `canopy stats`: per-service counters and latency as a table.
struct Stats: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print each broker's per-service counters and latency.",
        discussion: "Example: canopy stats --endpoint tcp://127.0.0.1:5555")

    @OptionGroup var common: CommonOptions
    @OptionGroup var stack: StackOptions // the local stack's keys, when it runs CurveZMQ

    func run() async throws {
        try await withEachBroker(common, stack: stack) { endpoint, bus in
            let stats = try await bus.call(Broker.Stats.self, .init(), timeout: .seconds(5))
            if common.brokerEndpoints.count > 1 { print("broker \(endpoint)") }
            var table = Table("SERVICE", "WORKERS", "QUEUED", "IN FLIGHT", "SERVED", "ERRORS", "P50 µs", "P99 µs")
            for service in stats.services {
                table.append([
                    service.name, "\(service.workers)", "\(service.queued)", "\(service.inFlight)",
                    "\(service.served)", "\(service.errors)", "\(service.p50Micros)", "\(service.p99Micros)",
                ])
            }
            print(
                "uptime \(Int(stats.uptimeSeconds)) s, \(stats.rejected) request(s) rejected by the broker (\(stats.malformed) malformed), \(stats.heldBytes) bytes of requests held, \(stats.openFlights) open flight(s)"
            )
            if let unread = stats.unreadReplyBytes, let drops = stats.slowReaderDrops {
                print("\(unread) bytes of replies wait for clients to read them; \(drops) dropped for slow readers")
            }
            if let stale = stats.staleAnswers, stale > 0 {
                print("\(stale) worker answer(s) dropped: every caller of the request had left (cancel or deadline)")
            }
            print(stats.services.isEmpty ? "no services" : table.render())
            if !stats.operations.isEmpty {
                var operations = Table("OPERATION", "REQUESTS", "COALESCED", "WORKER CALLS", "SAVED", "DETACHED", "REDISPATCHED", "WAITERS P50", "WAITERS P99")
                for operation in stats.operations {
                    operations.append([
                        operation.operation.isEmpty ? operation.service : "\(operation.service).\(operation.operation)",
                        "\(operation.requests)", "\(operation.coalesced)", "\(operation.workerCalls)", "\(operation.workerCallsSaved)",
                        "\(operation.detachedWaiters)", "\(operation.redispatchedFlights)", "\(operation.waitersPerFlightP50)",
                        "\(operation.waitersPerFlightP99)",
                    ])
                }
                print("")
                print(operations.render())
            }
            print("")
        }
    }
}
