import ArgumentParser
import Logging

/// The options every Canopy executable shares: where the broker is and how much to log.
public struct CommonOptions: ParsableArguments {
    /// The broker endpoint to connect to.
    @Option(name: .long, help: ArgumentHelp("Broker endpoint. Env: CANOPY_ENDPOINT.", valueName: "endpoint"))
    public var endpoint: String = Environment.string("CANOPY_ENDPOINT") ?? "tcp://127.0.0.1:5555"

    /// The lowest log level written.
    @Option(name: .long, help: ArgumentHelp("trace, debug, info, notice, warning, error or critical. Env: CANOPY_LOG_LEVEL.", valueName: "level"))
    public var logLevel: Logger.Level = Environment.string("CANOPY_LOG_LEVEL").flatMap(Logger.Level.init(rawValue:)) ?? .info

    /// Parsed by argument parser.
    public init() {}
}

extension Logger.Level: @retroactive ExpressibleByArgument {}

/// Where every executable's logs go: structured lines on standard error.
public enum LogSetup {
    /// Bootstraps swift-log once for the process and returns the executable's logger.
    public static func logger(label: String, level: Logger.Level) -> Logger {
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = .trace // each Logger below decides
            return handler
        }
        var logger = Logger(label: label)
        logger.logLevel = level
        return logger
    }
}
