import ArgumentParser
import Foundation
import Logging
import OTel
import ServiceLifecycle
import Tracing

/// Traces, exported over OTLP/HTTP to a collector, configured by the standard `OTEL_*`
/// variables (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_PROTOCOL` — `http/protobuf`, the
/// default, or `http/json` —, `OTEL_TRACES_SAMPLER` and its argument, `OTEL_SERVICE_NAME`,
/// `OTEL_BSP_*`) or by the options of ``TraceOptions``, which win.
///
/// Off unless an endpoint is named: then no tracer is installed, and every span the code starts
/// is swift-distributed-tracing's no-op. `OTEL_SDK_DISABLED=true` turns it off even with one
/// (and leaves the edge's tracing middleware out). With an endpoint, the sampler is parent-based and
/// always-off by default: a request is traced when its caller sampled it (an app's
/// `traceparent`), or when `OTEL_TRACES_SAMPLER` says so (`parentbased_traceidratio` with
/// `OTEL_TRACES_SAMPLER_ARG=0.01` samples 1% of new traces).
public enum Traces {
    /// Installs the process's tracer when the environment or `options` (parsed options; an
    /// executable without them passes none) name an OTLP endpoint,
    /// and returns the service that exports its spans (to run first and stop last, so that
    /// the last spans are sent); nil when tracing is off.
    ///
    /// - Parameter edgeSampling: for the HTTP edge, which decides what it records itself
    ///   (``EdgeSampling``): its tracer then records every span it is given, and the sampler
    ///   variables are not swift-otel's to apply.
    public static func bootstrap(serviceName: String, options: TraceOptions? = nil, edgeSampling: EdgeSampling? = nil) throws -> (any Service)? {
        options?.export() // swift-otel reads the variables; an option stands in for its variable
        guard isEnabled() else { return nil }
        var configuration = OTel.Configuration.default
        configuration.serviceName = serviceName // OTEL_SERVICE_NAME, when set, wins
        configuration.logs.enabled = false
        configuration.metrics.enabled = false
        configuration.traces.sampler = .parentBasedAlwaysOff
        if let edgeSampling {
            // The variables would win over the configuration; the edge applied them already.
            unsetenv("OTEL_TRACES_SAMPLER")
            unsetenv("OTEL_TRACES_SAMPLER_ARG")
            configuration.traces.sampler = edgeSampling.tracerSampler
        }
        configuration.diagnosticLogLevel = .warning // its settings, line by line, only when asked (OTEL_LOG_LEVEL)
        // A collector that never answers holds up no request (spans go from a bounded queue on
        // a task of their own), and holds up a stopping process at most this long twice (the
        // last batch, then the flush): OTEL_EXPORTER_OTLP_TIMEOUT and OTEL_BSP_EXPORT_TIMEOUT win.
        configuration.traces.otlpExporter.timeout = .seconds(2)
        configuration.traces.batchSpanProcessor.exportTimeout = .seconds(2)
        let (tracer, service) = try OTel.makeTracingBackend(configuration: configuration)
        InstrumentationSystem.bootstrap(tracer)
        return service
    }

    /// A tracer of this process's own, not installed for the process (the tests' and the
    /// benchmark's brokers and workers, each with its own), exporting OTLP/JSON to
    /// `endpoint` (`http://HOST:PORT`), and the service that exports (run it; its graceful
    /// shutdown sends what is left).
    public static func makeTracer(
        serviceName: String, endpoint: String, sampler: OTel.Configuration.TracesConfiguration.SamplerConfiguration = .parentBasedAlwaysOn,
        scheduleDelay: Duration = .milliseconds(100)
    ) throws -> (tracer: any Tracer, exporter: any Service) {
        var configuration = OTel.Configuration.default
        configuration.serviceName = serviceName
        configuration.logs.enabled = false
        configuration.metrics.enabled = false
        configuration.traces.sampler = sampler
        configuration.traces.batchSpanProcessor.scheduleDelay = scheduleDelay
        configuration.traces.otlpExporter.endpoint = endpoint + "/v1/traces"
        configuration.traces.otlpExporter.protocol = .httpJSON
        configuration.diagnosticLogLevel = .warning
        let (tracer, service) = try OTel.makeTracingBackend(configuration: configuration)
        return (tracer, service)
    }

    /// Whether `OTEL_SDK_DISABLED=true` turns tracing off altogether, an endpoint or not.
    public static func isDisabled(_ environment: [String: String] = ProcessInfo.processInfo.environment) -> Bool {
        environment["OTEL_SDK_DISABLED"]?.lowercased() == "true"
    }

    /// Whether `environment` turns traces on: an OTLP endpoint is named and tracing is not
    /// disabled. When not, the edge leaves its tracing middleware out altogether (a no-op one
    /// still cost canopy-api some 8% of its CPU per request in `canopy-bench tracing`).
    public static func isEnabled(_ environment: [String: String] = ProcessInfo.processInfo.environment) -> Bool {
        let endpoint = environment["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] ?? environment["OTEL_EXPORTER_OTLP_ENDPOINT"] ?? ""
        return !endpoint.isEmpty && !isDisabled(environment)
    }

    /// This executable's name, the service name its spans carry by default.
    public static var executableName: String {
        URL(fileURLWithPath: CommandLine.arguments.first ?? "canopy").lastPathComponent
    }
}

/// The trace options every long-running executable takes, beside the `OTEL_*` variables
/// they stand for (an option wins over its variable).
public struct TraceOptions: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "An OpenTelemetry collector's OTLP/HTTP endpoint, such as http://127.0.0.1:4318; turns traces on. Env: OTEL_EXPORTER_OTLP_ENDPOINT.",
            valueName: "url"))
    public var otlpEndpoint: String?
    @Option(help: ArgumentHelp("http/protobuf (the default) or http/json. Env: OTEL_EXPORTER_OTLP_PROTOCOL.", valueName: "protocol"))
    public var otlpProtocol: String?
    @Option(
        help: ArgumentHelp(
            "Which new traces to record: parentbased_always_off (the default: only those an app's traceparent samples), parentbased_traceidratio, parentbased_always_on, always_on, always_off or traceidratio. Env: OTEL_TRACES_SAMPLER.",
            valueName: "sampler"))
    public var tracesSampler: String?
    @Option(
        help: ArgumentHelp("The share of new traces a *traceidratio sampler records, 0 to 1 (0.01 is 1%). Env: OTEL_TRACES_SAMPLER_ARG.", valueName: "ratio"))
    public var tracesSamplerArg: String?
    @Option(help: ArgumentHelp("The service.name on this process's spans (default: the executable's name). Env: OTEL_SERVICE_NAME.", valueName: "name"))
    public var otelServiceName: String?

    public init() {}

    static let protocols: Set = ["http/protobuf", "http/json"]
    static let samplers: Set = ["parentbased_always_off", "parentbased_always_on", "parentbased_traceidratio", "always_on", "always_off", "traceidratio"]

    /// Each option given, with the variable it stands for.
    private var given: [(name: String, value: String)] {
        [
            (otlpEndpoint, "OTEL_EXPORTER_OTLP_ENDPOINT"), (otlpProtocol, "OTEL_EXPORTER_OTLP_PROTOCOL"), (tracesSampler, "OTEL_TRACES_SAMPLER"),
            (tracesSamplerArg, "OTEL_TRACES_SAMPLER_ARG"), (otelServiceName, "OTEL_SERVICE_NAME"),
        ].compactMap { value, name in value.map { (name, $0) } }
    }

    /// The process's environment with each option given in place of its variable.
    public var environment: [String: String] {
        var environment = ProcessInfo.processInfo.environment
        for (name, value) in given { environment[name] = value }
        return environment
    }

    /// Sets the variable of each option given, for swift-otel to read.
    func export() {
        for (name, value) in given { setenv(name, value, 1) }
    }

    public func validate() throws {
        let environment = self.environment
        if let value = environment["OTEL_EXPORTER_OTLP_PROTOCOL"], !value.isEmpty, !Self.protocols.contains(value) {
            throw ValidationError("--otlp-protocol (OTEL_EXPORTER_OTLP_PROTOCOL) is http/protobuf or http/json; got '\(value.prefix(40))'")
        }
        if let value = environment["OTEL_TRACES_SAMPLER"], !value.isEmpty, !Self.samplers.contains(value) {
            throw ValidationError(
                "--traces-sampler (OTEL_TRACES_SAMPLER) is one of \(Self.samplers.sorted().joined(separator: ", ")); got '\(value.prefix(40))'")
        }
        if let value = environment["OTEL_TRACES_SAMPLER_ARG"], !value.isEmpty, Double(value).map({ (0...1).contains($0) }) != true {
            throw ValidationError("--traces-sampler-arg (OTEL_TRACES_SAMPLER_ARG) is a ratio from 0 to 1, such as 0.01; got '\(value.prefix(40))'")
        }
        if let value = environment["OTEL_EXPORTER_OTLP_ENDPOINT"], !value.isEmpty,
            URL(string: value).map({ ["http", "https"].contains($0.scheme ?? "") && $0.host != nil }) != true
        {
            throw ValidationError("--otlp-endpoint (OTEL_EXPORTER_OTLP_ENDPOINT) is an http(s) URL such as http://127.0.0.1:4318; got '\(value.prefix(80))'")
        }
    }
}
