import Foundation
import Logging
import OTel
import ServiceLifecycle
import Tracing

/// Traces, exported over OTLP/HTTP to a collector, configured by the standard `OTEL_*`
/// variables (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_PROTOCOL` — `http/protobuf`, the
/// default, or `http/json` —, `OTEL_TRACES_SAMPLER` and its argument, `OTEL_SERVICE_NAME`,
/// `OTEL_BSP_*`).
///
/// Off unless an endpoint is named: then no tracer is installed, and every span the code starts
/// is swift-distributed-tracing's no-op. With an endpoint, the sampler is parent-based and
/// always-off by default: a request is traced when its caller sampled it (an app's
/// `traceparent`), or when `OTEL_TRACES_SAMPLER` says so (`parentbased_traceidratio` with
/// `OTEL_TRACES_SAMPLER_ARG=0.01` samples 1% of new traces).
public enum Traces {
    /// Installs the process's tracer when `environment` names an OTLP endpoint, and returns the
    /// service that exports its spans (to run first and stop last, so that the last spans
    /// are sent); nil when tracing is off.
    public static func bootstrap(serviceName: String, environment: [String: String] = ProcessInfo.processInfo.environment) throws -> (any Service)? {
        let endpoint = environment["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] ?? environment["OTEL_EXPORTER_OTLP_ENDPOINT"] ?? ""
        guard !endpoint.isEmpty else { return nil }
        var configuration = OTel.Configuration.default
        configuration.serviceName = serviceName // OTEL_SERVICE_NAME, when set, wins
        configuration.logs.enabled = false
        configuration.metrics.enabled = false
        configuration.traces.sampler = .parentBasedAlwaysOff
        let (tracer, service) = try OTel.makeTracingBackend(configuration: configuration)
        InstrumentationSystem.bootstrap(tracer)
        return service
    }

    /// This executable's name, the service name its spans carry by default.
    public static var executableName: String {
        URL(fileURLWithPath: CommandLine.arguments.first ?? "canopy").lastPathComponent
    }
}
