import ArgumentParser
import Foundation
import Logging

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// Where an executable serves `/metrics` and `/health`: `--metrics-bind HOST:PORT`
/// (`CANOPY_METRICS_BIND`), `off` for nowhere. Each executable has its own default port
/// (``Defaults``), so a laptop runs them side by side.
public struct OperatingOptions: ParsableArguments {
    /// The default listeners, one port per executable.
    public enum Defaults {
        public static let broker = "127.0.0.1:9400"
        public static let images = "127.0.0.1:9401"
        public static let care = "127.0.0.1:9402"
        public static let identify = "127.0.0.1:9403"
        public static let remind = "127.0.0.1:9404"
        public static let api = "127.0.0.1:9405"
        public static let testWorker = "off"
    }

    @Option(
        help: ArgumentHelp(
            "Where /metrics and /health listen, HOST:PORT, or 'off' (default per executable: broker 9400, images 9401, care 9402, identify 9403, remind 9404, api 9405 on 127.0.0.1). Env: CANOPY_METRICS_BIND.",
            valueName: "host:port"))
    public var metricsBind: String?

    /// The flag, else `CANOPY_METRICS_BIND`, else `nil` (the executable's default).
    private var metricsBindOrEnvironment: String? { metricsBind ?? Environment.string("CANOPY_METRICS_BIND") }

    /// Parsed by argument parser.
    public init() {}

    /// The address to listen on, or `nil` for `off`.
    ///
    /// - Parameter fallback: the executable's default (one of ``Defaults``).
    public func listener(default fallback: String) throws -> ListenAddress? {
        try Self.parse(metricsBindOrEnvironment ?? fallback)
    }

    /// Parses `HOST:PORT` or `off`.
    public static func parse(_ text: String) throws -> ListenAddress? {
        if text.lowercased() == "off" { return nil }
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]), (0...65_535).contains(port),
            colon != text.startIndex
        else {
            throw ValidationError("--metrics-bind is HOST:PORT, such as 127.0.0.1:9400 or 0.0.0.0:9400, or 'off'; got '\(text)'")
        }
        return ListenAddress(host: String(text[..<colon]), port: port)
    }

    public func validate() throws {
        if let bind = metricsBindOrEnvironment { _ = try Self.parse(bind) }
    }
}

/// Where a listener binds: a host name or address and a port (0: the system chooses).
public struct ListenAddress: Sendable, Equatable, CustomStringConvertible {
    /// A host name or address, such as `127.0.0.1` or `0.0.0.0`.
    public var host: String
    /// The port; 0 lets the system choose one.
    public var port: Int

    /// - Parameters:
    ///   - host: a host name or address.
    ///   - port: the port, 0 for one the system chooses.
    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// `127.0.0.1` and a port the system chooses, for tests.
    public static let anyLoopbackPort = ListenAddress(host: "127.0.0.1", port: 0)

    public var description: String { "\(host):\(port)" }
}

/// What every executable's `health` subcommand does: asks `/health` on its listener and
/// exits 0 when healthy, 1 when not, with one line saying why.
public enum HealthProbe {
    /// Asks `http://host:port/health` and returns the report, or an unhealthy one that says
    /// why it could not ask.
    public static func check(host: String, port: Int, timeout: TimeInterval = 2) async -> HealthReport {
        let address = host == "0.0.0.0" ? "127.0.0.1" : host
        guard let url = URL(string: "http://\(address):\(port)/health") else {
            return HealthReport(healthy: false, checks: ["listener": "\(host):\(port) is not an address"])
        }
        var request = URLRequest(url: url)
        request.timeoutInterval = timeout
        do {
            let (data, _) = try await URLSession.shared.data(for: request)
            if let report = try? JSONDecoder().decode(HealthReport.self, from: data) { return report }
            return HealthReport(healthy: false, checks: ["listener": "answered something that is not a health report"])
        } catch {
            return HealthReport(healthy: false, checks: ["listener": "nothing answers at \(address):\(port) (is it running, with this --metrics-bind?)"])
        }
    }

    /// Prints the report's line and exits 0 or 1.
    public static func run(_ options: OperatingOptions, default fallback: String) async throws {
        guard let address = try options.listener(default: fallback) else {
            throw ValidationError("health asks the /health listener, which --metrics-bind off turns off; give --metrics-bind HOST:PORT")
        }
        let report = await check(host: address.host, port: address.port)
        print(report.summary)
        if !report.healthy { throw ExitCode(1) }
    }
}
