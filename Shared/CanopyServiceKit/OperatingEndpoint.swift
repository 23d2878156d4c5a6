import CanopyBus
import Foundation
import Hummingbird
import Logging
import Metrics
import Prometheus
import ServiceLifecycle
import Synchronization

/// What `/health` answers: healthy or not, and one line per check saying why.
public struct HealthReport: Codable, Sendable, Equatable {
    /// Whether every check passed.
    public var healthy: Bool
    /// Each check's state in words, by name.
    public var checks: [String: String]

    /// - Parameters:
    ///   - healthy: whether every check passed.
    ///   - checks: each check's state in words.
    public init(healthy: Bool, checks: [String: String]) {
        self.healthy = healthy
        self.checks = checks
    }

    /// One line for people: `healthy` or `unhealthy`, then the checks.
    public var summary: String {
        "\(healthy ? "healthy" : "unhealthy"): " + checks.keys.sorted().map { "\($0) \(checks[$0]!)" }.joined(separator: "; ")
    }
}

/// The HTTP listener every executable runs beside its work: `GET /metrics` (Prometheus text
/// from ``Observability/registry``) and `GET /health` (a ``HealthReport`` as JSON, 200 when
/// healthy, 503 when not). One implementation for every executable.
public final class OperatingEndpoint: Service, Sendable {
    private let application: Application<RouterResponder<BasicRequestContext>>
    /// The bound port, shared with the listener's start-up callback.
    private let port = BoundPort(listener: "the metrics listener")

    /// The address, for the sentence a failed bind stops the process with.
    private let address: ListenAddress

    /// - Parameters:
    ///   - host: the address to listen on, e.g. `127.0.0.1` or `0.0.0.0`.
    ///   - port: the port; 0 lets the system choose (see ``boundPort(within:)``).
    ///   - health: the executable's checks, run on every `/health` request.
    ///   - logger: where the listener logs.
    /// - Throws: ``CommandFailure`` naming the port, `--metrics-bind` and what holds it when
    ///   the address cannot be listened on, before anything starts.
    public init(host: String, port: Int, health: @escaping @Sendable () async -> HealthReport, logger: Logger) throws {
        address = ListenAddress(host: host, port: port)
        try PortCheck.ensureFree(address, for: Self.purpose, option: Self.option)
        let registry = Observability.registry
        let router = Router()
        router.get("/metrics") { _, _ -> Response in
            var buffer = [UInt8]()
            buffer.reserveCapacity(16_384)
            registry.emit(into: &buffer)
            return Response(
                status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(bytes: buffer)))
        }
        router.get("/health") { _, _ -> Response in
            let report = await health()
            let body = (try? JSONEncoder().encode(report)) ?? Data()
            return Response(
                status: report.healthy ? .ok : .serviceUnavailable, headers: [.contentType: "application/json"],
                body: .init(byteBuffer: ByteBuffer(bytes: body)))
        }
        var quiet = logger
        quiet.logLevel = max(logger.logLevel, .warning)
        let bound = self.port
        application = Application(
            router: router,
            configuration: .init(address: .hostname(host, port: port), serverName: "canopy"),
            onServerRunning: { channel in
                let port = channel.localAddress?.port
                bound.set(port)
                logger.info("operating.listening", metadata: ["operating.address": "\(host):\(port ?? 0)", "operating.paths": "/metrics /health"])
            },
            logger: quiet)
    }

    /// What listens, and the option that moves it, for sentences.
    public static let purpose = "/metrics and /health"
    public static let option = "--metrics-bind HOST:PORT or off (CANOPY_METRICS_BIND)"

    /// Throws the sentence a taken `address` stops the process with; build functions call it
    /// first, before they open stores or connect.
    public static func ensureFree(_ address: ListenAddress?) throws {
        guard let address else { return }
        try PortCheck.ensureFree(address, for: purpose, option: option)
    }

    /// Serves until graceful shutdown. A bind that fails (the port taken since the check)
    /// throws the same sentence as the check.
    public func run() async throws {
        try await PortCheck.translatingBindErrors(address, for: Self.purpose, option: Self.option) {
            try await application.run()
        }
    }

    /// The port it listens on, once it does.
    public func boundPort(within limit: Duration = .seconds(10)) async throws -> Int {
        try await port.wait(within: limit)
    }
}

extension OperatingEndpoint {
    /// A bus worker's services with their listener appended when `address` is set: what every
    /// worker executable's build function returns. Its `/health` is ``workerHealth(_:)`` of
    /// those services.
    public static func serving(_ services: [any Service], at address: ListenAddress?, logger: Logger) throws -> [any Service] {
        guard let address else { return services }
        return services + [try OperatingEndpoint(host: address.host, port: address.port, health: workerHealth(services), logger: logger)]
    }

    /// The health of a bus worker's services: every ``ServiceRunner`` among them registered
    /// with its broker (READY taken, heartbeats flowing), and every ``HealthReporting``
    /// service's own checks (its store answering, for example).
    public static func workerHealth(_ services: [any Service]) -> @Sendable () async -> HealthReport {
        let runners = services.compactMap { $0 as? ServiceRunner }
        let reporters = services.compactMap { $0 as? any HealthReporting }
        return {
            let registered = runners.allSatisfy(\.isRegistered)
            var report = HealthReport(
                healthy: registered,
                checks: [
                    "broker": registered ? "registered, heartbeats flowing" : "not registered with the broker (is canopy-broker running at --endpoint?)"
                ])
            for reporter in reporters {
                for check in await reporter.healthChecks() {
                    report.checks[check.name] = check.detail
                    report.healthy = report.healthy && check.healthy
                }
            }
            return report
        }
    }
}

/// A service that says how it is, for `/health`: each check a name, whether it passes, and
/// a few words.
public protocol HealthReporting: Sendable {
    /// The checks, run on every `/health` request (keep them cheap).
    func healthChecks() async -> [(name: String, healthy: Bool, detail: String)]
}
