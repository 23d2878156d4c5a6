import Metrics
import Synchronization

/// canopy-batch's figures in swift-metrics, each series made once (routes and statuses are
/// bounded: the document's routes, `unknown` for the rest, and HTTP status codes):
/// - `canopy_batch_requests_total{route,status}`: requests answered;
/// - `canopy_batch_request_duration_seconds{route}`: from arrival to the answer;
/// - `canopy_batch_rate_limited_total`: requests answered 429 for their rate;
/// - `canopy_batch_over_budget_total`: photo work answered 429 for a person's work budget;
/// - `canopy_batch_batch_operations`: operations per `POST /v1/batch`.
final class BatchMetrics: Sendable {
    private let counters = Mutex<[String: Counter]>([:])
    private let timers = Mutex<[String: Metrics.Timer]>([:])
    let rateLimited = Counter(label: "canopy_batch_rate_limited_total")
    let overBudget = Counter(label: "canopy_batch_over_budget_total")
    let batchOperations = Recorder(label: "canopy_batch_batch_operations", aggregate: true)

    func record(route: String, status: Int, duration: Duration) {
        let key = route + "|" + String(status)
        let counter = counters.withLock { counters in
            if let counter = counters[key] { return counter }
            let counter = Counter(label: "canopy_batch_requests_total", dimensions: [("route", route), ("status", String(status))])
            counters[key] = counter
            return counter
        }
        counter.increment()
        let timer = timers.withLock { timers in
            if let timer = timers[route] { return timer }
            let timer = Metrics.Timer(label: "canopy_batch_request_duration_seconds", dimensions: [("route", route)])
            timers[route] = timer
            return timer
        }
        timer.recordNanoseconds(duration.nanoseconds)
    }
}
