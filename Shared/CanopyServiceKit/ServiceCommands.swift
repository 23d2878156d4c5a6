import ArgumentParser
import CanopyBus
import Foundation
import Logging

/// What the subcommands every service executable shares (``HealthCommand``, ``ServeOptions``)
/// need to know of it. Each executable declares one.
public protocol ServiceExecutable {
    /// Its name: `canopy-care`.
    static var name: String { get }
    /// Its directory under the data directory: `care`.
    static var directoryName: String { get }
    /// Where its `/metrics` and `/health` listen by default (one of ``OperatingOptions/Defaults``).
    static var defaultListener: String { get }
    /// What healthy means for it, for `health --help`.
    static var healthyMeans: String { get }
}

extension ServiceExecutable {
    public static var healthyMeans: String { "registered with its broker" }
}

/// `health`: asks the running executable's `/health`; exit 0 when healthy, 1 when not (for
/// container health checks).
public struct HealthCommand<Executable: ServiceExecutable>: AsyncParsableCommand {
    public static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: "health",
            abstract: "Exit 0 when the running \(Executable.name) is healthy (\(Executable.healthyMeans)), 1 when not (for container health checks).",
            discussion: "Example: \(Executable.name) health --metrics-bind \(Executable.defaultListener)")
    }

    @OptionGroup var operating: OperatingOptions

    public init() {}

    public func run() async throws {
        try await HealthProbe.run(operating, default: Executable.defaultListener)
    }
}

/// The options of every service worker's `serve`: the broker and how to reach it
/// (``CommonOptions``), the worker's (``WorkerOptions``), where `/metrics` and `/health`
/// listen (``OperatingOptions``) and the data directory.
public struct ServeOptions<Executable: ServiceExecutable>: ParsableArguments {
    @OptionGroup public var common: CommonOptions
    @OptionGroup public var worker: WorkerOptions
    @OptionGroup public var operating: OperatingOptions
    @OptionGroup public var traces: TraceOptions
    @Option(help: ArgumentHelp("Data directory; this service keeps its files in <dir>/\(Executable.directoryName). Env: CANOPY_DATA_DIR.", valueName: "dir"))
    public var dataDir: String = Environment.string("CANOPY_DATA_DIR") ?? "./.canopy"

    public init() {}

    /// `<data-dir>/<the executable's directory>`.
    public var directory: URL { URL(fileURLWithPath: dataDir).appendingPathComponent(Executable.directoryName, isDirectory: true) }

    /// The executable's logger, at `--log-level`, logging and metrics bootstrapped.
    public func logger() -> Logger { LogSetup.logger(label: Executable.name, level: common.logLevel) }

    /// The worker's runner configuration.
    public func runner() throws -> ServiceRunner.Configuration { try worker.runnerConfiguration(common) }

    /// Where `/metrics` and `/health` listen, nil for nowhere.
    public func metrics() throws -> ListenAddress? { try operating.listener(default: Executable.defaultListener) }
}
