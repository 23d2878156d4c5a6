import Metrics
import Synchronization

/// canopy-api's figures in swift-metrics, each series made once (routes and statuses are
/// bounded: the document's routes, `unknown` for the rest, and HTTP status codes):
/// - `canopy_api_requests_total{route,status}`: requests answered;
/// - `canopy_api_request_duration_seconds{route}`: from arrival to the answer;
/// - `canopy_api_rate_limited_total`: requests answered 429 for their rate;
/// - `canopy_api_over_budget_total`: photo work answered 429 for a person's work budget;
/// - `canopy_api_batch_operations`: operations per `POST /v1/batch`.
final class APIMetrics: Sendable {
    private let counters = Mutex<[String: Counter]>([:])
    private let timers = Mutex<[String: Metrics.Timer]>([:])
    let rateLimited = Counter(label: "canopy_api_rate_limited_total")
    let overBudget = Counter(label: "canopy_api_over_budget_total")
    let batchOperations = Recorder(label: "canopy_api_batch_operations", aggregate: true)

    func record(route: String, status: Int, duration: Duration) {
        let key = route + "|" + String(status)
        let counter = counters.withLock { counters in
            if let counter = counters[key] { return counter }
            let counter = Counter(label: "canopy_api_requests_total", dimensions: [("route", route), ("status", String(status))])
            counters[key] = counter
            return counter
        }
        counter.increment()
        let timer = timers.withLock { timers in
            if let timer = timers[route] { return timer }
            let timer = Metrics.Timer(label: "canopy_api_request_duration_seconds", dimensions: [("route", route)])
            timers[route] = timer
            return timer
        }
        timer.recordNanoseconds(duration.nanoseconds)
    }
}
