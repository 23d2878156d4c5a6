import CanopyIO
import CanopyMessages
import CanopyWire
import Metrics

/// The broker's figures in swift-metrics, refreshed from ``BrokerState/statistics(now:)``
/// about once a second by the broker's loop (so the routing path itself records nothing).
/// Counters advance by what changed since the last refresh. Per-service and per-operation
/// series are created on first sight; both are bounded by the broker (services by their
/// workers and the start-up grace, operations by its table of 1,024).
///
/// Not thread-safe: owned by the broker's loop thread.
final class BrokerMetrics {
    /// Every series carries `broker="NAME"` (``BrokerConfiguration/name``): with several live
    /// brokers, each one's figures are told apart, and summed, by it.
    private let broker: String
    private let malformed, rejected, slowReaderDrops, staleAnswers, captureRecords, captureDropped: Counter
    private let heldBytes, unreadReplyBytes, openFlights, capturing: Gauge

    init(broker: String) {
        self.broker = broker
        let named = [("broker", broker)]
        malformed = Counter(label: "canopy_broker_malformed_messages_total", dimensions: named)
        rejected = Counter(label: "canopy_broker_rejected_requests_total", dimensions: named)
        heldBytes = Gauge(label: "canopy_broker_held_bytes", dimensions: named)
        unreadReplyBytes = Gauge(label: "canopy_broker_unread_reply_bytes", dimensions: named)
        slowReaderDrops = Counter(label: "canopy_broker_slow_reader_drops_total", dimensions: named)
        staleAnswers = Counter(label: "canopy_broker_stale_answers_total", dimensions: named)
        openFlights = Gauge(label: "canopy_broker_open_flights", dimensions: named)
        captureRecords = Counter(label: "canopy_broker_capture_records_total", dimensions: named)
        captureDropped = Counter(label: "canopy_broker_capture_dropped_total", dimensions: named)
        capturing = Gauge(label: "canopy_broker_capturing", dimensions: named)
    }

    private struct ServiceSeries {
        let queued, queuedBytes, inFlight, workers: Gauge
        let served, errors: Counter
        init(_ name: String, broker: String) {
            let dimensions = [("broker", broker), ("service", name)]
            queued = Gauge(label: "canopy_broker_queued_requests", dimensions: dimensions)
            queuedBytes = Gauge(label: "canopy_broker_queued_bytes", dimensions: dimensions)
            inFlight = Gauge(label: "canopy_broker_in_flight_requests", dimensions: dimensions)
            workers = Gauge(label: "canopy_broker_workers", dimensions: dimensions)
            served = Counter(label: "canopy_broker_served_requests_total", dimensions: dimensions)
            errors = Counter(label: "canopy_broker_error_replies_total", dimensions: dimensions)
        }
    }

    private struct OperationSeries {
        let broker, service, operation: String
        let coalesced: Counter
        /// `canopy_broker_requests_total{broker,service,operation,outcome}`, made per outcome as it occurs.
        var answered: [String: Counter] = [:]
        init(_ service: String, _ operation: String, broker: String) {
            self.broker = broker
            self.service = service
            self.operation = operation
            coalesced = Counter(
                label: "canopy_broker_coalesced_requests_total", dimensions: [("broker", broker), ("service", service), ("operation", operation)])
        }
        mutating func answered(_ outcome: String) -> Counter {
            if let counter = answered[outcome] { return counter }
            let counter = Counter(
                label: "canopy_broker_requests_total", dimensions: [("broker", broker), ("service", service), ("operation", operation), ("outcome", outcome)])
            answered[outcome] = counter
            return counter
        }
    }

    private var services: [String: ServiceSeries] = [:]
    /// `canopy_broker_request_duration_seconds{service}`: receipt to answer, per answer.
    private var latency: [String: Metrics.Timer] = [:]

    /// Records one answer's latency (receipt to answer) for `service`.
    func recordLatency(service: String, nanoseconds: Int64) {
        if let timer = latency[service] { return timer.recordNanoseconds(nanoseconds) }
        let timer = Metrics.Timer(label: "canopy_broker_request_duration_seconds", dimensions: [("broker", broker), ("service", service)])
        latency[service] = timer
        timer.recordNanoseconds(nanoseconds)
    }
    private var operations: [String: OperationSeries] = [:]
    /// The totals of the last refresh, by series name.
    private var totals = CounterTotals()

    /// Brings every series up to `statistics`.
    func refresh(_ statistics: BrokerStatistics) {
        func advance(_ counter: Counter, _ name: String, _ total: UInt64) {
            totals.advance(counter, name, to: total)
        }
        advance(malformed, "malformed", statistics.malformed)
        advance(rejected, "rejected", statistics.rejected)
        heldBytes.record(statistics.heldBytes)
        unreadReplyBytes.record(statistics.unreadReplyBytes ?? 0)
        advance(slowReaderDrops, "slow reader drops", statistics.slowReaderDrops ?? 0)
        advance(staleAnswers, "stale answers", statistics.staleAnswers ?? 0)
        openFlights.record(statistics.openFlights)
        if let capture = statistics.capture {
            // A new capture counts from zero: the totals start again.
            advance(captureRecords, "capture records", capture.records)
            advance(captureDropped, "capture dropped", capture.dropped)
            capturing.record(capture.capturing ? 1 : 0)
        }
        let seen = Set(statistics.services.map(\.name))
        for (name, series) in services where !seen.contains(name) {
            series.queued.record(0)
            series.queuedBytes.record(0)
            series.inFlight.record(0)
            series.workers.record(0)
        }
        for service in statistics.services {
            let series = services[service.name] ?? ServiceSeries(service.name, broker: broker)
            services[service.name] = series
            series.queued.record(service.queued)
            series.queuedBytes.record(service.queuedBytes)
            series.inFlight.record(service.inFlight)
            series.workers.record(service.workers)
            advance(series.served, "served " + service.name, service.served)
            advance(series.errors, "errors " + service.name, service.errors)
        }
        for operation in statistics.operations {
            let key = operation.service + "." + operation.operation
            var series = operations[key] ?? OperationSeries(operation.service, operation.operation, broker: broker)
            advance(series.coalesced, "coalesced " + key, operation.coalesced)
            for (outcome, total) in operation.outcomes {
                advance(series.answered(outcome), "answered " + key + " " + outcome, total)
            }
            operations[key] = series
        }
    }
}
