import CanopyMessages
import Metrics

/// canopy-remind's own figures in swift-metrics, created once (the service kit adds the
/// per-operation series every service has):
/// - `canopy_remind_held{kind}`: pending reminders and unfinished sends in the dispatcher's heaps;
/// - `canopy_remind_attempts_total{channel,outcome}`: delivery attempts by channel (`none` when
///   the device is gone or its channel is not configured), `accepted`, `retry` or `rejected`;
/// - `canopy_remind_lateness_seconds`: from a reminder's time to its channel accepting it.
final class ReminderMetrics: Sendable {
    private let heldReminders = Gauge(label: "canopy_remind_held", dimensions: [("kind", "reminders")])
    private let heldSends = Gauge(label: "canopy_remind_held", dimensions: [("kind", "sends")])
    /// Every channel's counters by outcome, made at start so that each series exists before its first attempt.
    private let attempts: [String: (accepted: Counter, retried: Counter, rejected: Counter)] = Dictionary(
        uniqueKeysWithValues: (Reminders.Channel.allCases.map(\.rawValue) + ["none"]).map { channel in
            (
                channel,
                (
                    Counter(label: "canopy_remind_attempts_total", dimensions: [("channel", channel), ("outcome", "accepted")]),
                    Counter(label: "canopy_remind_attempts_total", dimensions: [("channel", channel), ("outcome", "retry")]),
                    Counter(label: "canopy_remind_attempts_total", dimensions: [("channel", channel), ("outcome", "rejected")])
                )
            )
        })
    private let lateness = Metrics.Timer(label: "canopy_remind_lateness_seconds")

    func held(reminders: Int, sends: Int) {
        heldReminders.record(reminders)
        heldSends.record(sends)
    }

    func attempt(_ outcome: DeliveryOutcome, channel: Reminders.Channel?, lateBy seconds: Double?) {
        guard let counters = attempts[channel?.rawValue ?? "none"] else { return }
        switch outcome {
        case .accepted:
            counters.accepted.increment()
            if let seconds { lateness.recordNanoseconds(Int64(max(0, seconds) * 1e9)) }
        case .retry: counters.retried.increment()
        case .rejected: counters.rejected.increment()
        }
    }
}
