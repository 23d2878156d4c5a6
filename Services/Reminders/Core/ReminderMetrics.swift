import Metrics

/// canopy-remind's own figures in swift-metrics, created once (the service kit adds the
/// per-operation series every service has):
/// - `canopy_remind_held{kind}`: pending reminders and unfinished sends in the dispatcher's heaps;
/// - `canopy_remind_attempts_total{outcome}`: delivery attempts, `accepted`, `retry` or `rejected`;
/// - `canopy_remind_lateness_seconds`: from a reminder's time to its channel accepting it.
final class ReminderMetrics: Sendable {
    private let heldReminders = Gauge(label: "canopy_remind_held", dimensions: [("kind", "reminders")])
    private let heldSends = Gauge(label: "canopy_remind_held", dimensions: [("kind", "sends")])
    private let accepted = Counter(label: "canopy_remind_attempts_total", dimensions: [("outcome", "accepted")])
    private let retried = Counter(label: "canopy_remind_attempts_total", dimensions: [("outcome", "retry")])
    private let rejected = Counter(label: "canopy_remind_attempts_total", dimensions: [("outcome", "rejected")])
    private let lateness = Metrics.Timer(label: "canopy_remind_lateness_seconds")

    func held(reminders: Int, sends: Int) {
        heldReminders.record(reminders)
        heldSends.record(sends)
    }

    func attempt(_ outcome: DeliveryOutcome, lateBy seconds: Double?) {
        switch outcome {
        case .accepted:
            accepted.increment()
            if let seconds { lateness.recordNanoseconds(Int64(max(0, seconds) * 1e9)) }
        case .retry: retried.increment()
        case .rejected: rejected.increment()
        }
    }
}
