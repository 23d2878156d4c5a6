import CanopyServiceKit
import Logging
import ServiceLifecycle
import Tracing

/// Runs `body` with a swift-otel tracer of its own exporting OTLP/JSON to `endpoint`
/// (sampling every trace by default), then shuts the exporter down gracefully, which sends
/// every span still batched, also when `body` throws.
public func withTracer<T>(serviceName: String, endpoint: String, _ body: (any Tracer) async throws -> T) async throws -> T {
    let (tracer, exporter) = try Traces.makeTracer(serviceName: serviceName, endpoint: endpoint)
    let group = ServiceGroup(configuration: .init(services: [.init(service: exporter)], gracefulShutdownSignals: [], logger: Logger(label: "otel")))
    let running = Task { try await group.run() }
    func stop() async {
        await group.triggerGracefulShutdown()
        _ = try? await running.value
    }
    return try await ending(with: stop) { try await body(tracer) }
}

/// Runs `body` with an ``OTLPReceiver`` listening, and stops it afterwards.
public func withCollector<T>(_ body: (OTLPReceiver, _ endpoint: String) async throws -> T) async throws -> T {
    let collector = OTLPReceiver()
    let server = Task { try await collector.application.run() }
    defer { server.cancel() }
    return try await body(collector, try await collector.endpoint())
}
