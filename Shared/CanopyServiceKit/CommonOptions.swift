import ArgumentParser
import CanopyBus
import Glibc
import Logging
import OTel

/// The options every Canopy executable shares: where the broker is, how to authenticate to
/// it, and how much to log.
public struct CommonOptions: ParsableArguments {
    /// The broker endpoints to connect to: one, or several live brokers.
    @Option(
        name: [.customLong("endpoint"), .customLong("broker")],
        help: ArgumentHelp(
            "Broker endpoint (--broker says the same); repeat it, or separate endpoints with commas, for several live brokers. Env: CANOPY_ENDPOINT (A,B for several).",
            valueName: "endpoint"))
    public var endpoints: [String] = [Environment.string("CANOPY_ENDPOINT") ?? "tcp://127.0.0.1:5555"]

    /// The endpoints as one string, `A,B` (what the bus configurations split again).
    public var endpoint: String { endpoints.joined(separator: ",") }

    /// Every broker named, one endpoint each (`--endpoint A --endpoint B` or `A,B`).
    public var brokerEndpoints: [String] { BusClient.Configuration(endpoint: endpoint).endpoints }

    /// The broker's CurveZMQ public key, or a file holding it.
    @Option(
        name: .long,
        help: ArgumentHelp(
            "The broker's CurveZMQ public key (Z85) or its .pub file; turns CURVE on. With several brokers, one per --endpoint in order, separated by commas. Env: CANOPY_CURVE_SERVER_KEY.",
            valueName: "key|file"))
    public var curveServerKey: String?

    /// This peer's secret key file.
    @Option(
        name: .long,
        help: ArgumentHelp(
            "This peer's key file from 'canopy keys generate' (its public key must be on the broker's allow-list). Env: CANOPY_CURVE_SECRET_KEY_FILE, or the key itself in CANOPY_CURVE_SECRET_KEY.",
            valueName: "file"))
    public var curveSecretKeyFile: String?

    /// The stack this executable belongs to.
    @Option(
        name: .long,
        help: ArgumentHelp(
            "The stack this belongs to (canopy up sets it): the broker must announce the same, or a worker stops rather than serve another stack. Env: CANOPY_STACK.",
            valueName: "id"))
    public var stack: String? = Environment.string("CANOPY_STACK")

    /// The lowest log level written.
    @Option(name: .long, help: ArgumentHelp("trace, debug, info, notice, warning, error or critical. Env: CANOPY_LOG_LEVEL.", valueName: "level"))
    public var logLevel: Logger.Level = Environment.string("CANOPY_LOG_LEVEL").flatMap(Logger.Level.init(rawValue:)) ?? .info

    /// Parsed by argument parser.
    public init() {}

    public func validate() throws {
        try Environment.validate()
        if let stack { try Self.validate(stack: stack) }
    }

    /// A stack id is 1 to 64 of a-z, A-Z, 0-9, '-' and '_' (it travels in ZMTP metadata).
    public static func validate(stack: String) throws {
        guard (1...64).contains(stack.utf8.count),
            stack.utf8.allSatisfy({ $0 == 0x2D || $0 == 0x5F || (0x30...0x39).contains($0) || (0x41...0x5A).contains($0) || (0x61...0x7A).contains($0) })
        else {
            throw ValidationError("--stack (CANOPY_STACK) is 1 to 64 of a-z, A-Z, 0-9, '-' and '_'; got '\(stack.prefix(80))'")
        }
    }

    /// The CurveZMQ settings these options describe: `nil` without a server key; with one but
    /// no key of its own, a fresh key pair (which only a broker taking any client accepts).
    public func curveSettings() throws -> CurveClientSettings? {
        guard let serverKey = curveServerKey ?? Environment.string("CANOPY_CURVE_SERVER_KEY") else { return nil }
        do {
            let keyPair: CurveKeyPair
            if let file = curveSecretKeyFile ?? Environment.string("CANOPY_CURVE_SECRET_KEY_FILE") {
                keyPair = try Curve.readKeyPair(file: file)
            } else if let inline = Environment.string("CANOPY_CURVE_SECRET_KEY") {
                keyPair = try CurveKeyPair(secretKey: inline)
            } else {
                keyPair = try CurveKeyPair.generate()
            }
            // One key for every broker, or one per broker in the order of the endpoints.
            let keys = try serverKey.split(separator: ",").map { try Curve.publicKey(String($0).trimmingCharacters(in: .whitespaces)) }
            let brokers = brokerEndpoints.count
            guard !keys.isEmpty, keys.count == 1 || keys.count == brokers else {
                throw ValidationError(
                    "--curve-server-key names \(keys.count) broker keys for \(brokers) brokers; give one key for all, or one per --endpoint in the same order")
            }
            return CurveClientSettings(serverKeys: keys, keyPair: keyPair)
        } catch let error as Curve.KeyError {
            throw ValidationError("\(error.description)")
        }
    }

    /// The process's libzmq context: one I/O thread per broker named, so that a broker whose
    /// name hangs in the resolver (libzmq resolves in the I/O thread of the connecting
    /// socket) or whose connection stalls never holds up another broker's connections:
    /// the bus pins each broker's sockets to a thread of their own (``ZMQSocket/pin(toIOThread:)``).
    public func busContext() -> ZMQContext {
        ZMQContext(ioThreads: Int32(min(max(1, brokerEndpoints.count), 16)))
    }

    /// A bus client configuration for the broker these options name.
    public func clientConfiguration() throws -> BusClient.Configuration {
        var configuration = BusClient.Configuration(endpoint: endpoint)
        configuration.curve = try curveSettings()
        configuration.stack = stack
        return configuration
    }
}

extension Logger.Level: @retroactive ExpressibleByArgument {}

/// Where every executable's logs go: structured lines on standard error.
public enum LogSetup {
    /// Bootstraps swift-log, and swift-metrics with Prometheus (``Observability``), once for
    /// the process and returns the executable's logger. Every executable calls it first, so
    /// every metric it creates afterwards reaches `/metrics`.
    public static func logger(label: String, level: Logger.Level) -> Logger {
        // Stores, photos, captures and keys hold people's data and secrets: whatever an
        // executable creates is its owner's alone (files 0600, directories 0700).
        umask(0o077)
        _ = Observability.registry
        // A line logged while serving a traced request carries its trace_id and span_id
        // (the span in the task's service context; nothing when there is none).
        LoggingSystem.bootstrap(
            { label, metadataProvider in
                var handler = StreamLogHandler.standardError(label: label, metadataProvider: metadataProvider)
                handler.logLevel = .trace // each Logger below decides
                return handler
            }, metadataProvider: OTel.makeLoggingMetadataProvider())
        var logger = Logger(label: label)
        logger.logLevel = level
        return logger
    }
}
