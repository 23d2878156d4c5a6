import Metrics
import Prometheus

/// Prometheus behind swift-metrics, set up once per process: every metric any Canopy module
/// creates through swift-metrics lands in ``registry``, which `/metrics` emits.
public enum Observability {
    /// Histogram buckets for durations, from 50 µs to 30 s: bus round trips at the low end,
    /// full-size image work and deadlines at the high end.
    public static let durationBuckets: [Duration] = [
        .microseconds(50), .microseconds(100), .microseconds(250), .microseconds(500),
        .milliseconds(1), .microseconds(2_500), .milliseconds(5), .milliseconds(10), .milliseconds(25),
        .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500),
        .seconds(1), .milliseconds(2_500), .seconds(5), .seconds(10), .seconds(30),
    ]

    /// The process's registry; the first use bootstraps swift-metrics with it.
    public static let registry: PrometheusCollectorRegistry = {
        let registry = PrometheusCollectorRegistry()
        var factory = PrometheusMetricsFactory(registry: registry)
        factory.defaultDurationHistogramBuckets = durationBuckets
        MetricsSystem.bootstrap(factory)
        return registry
    }()
}
