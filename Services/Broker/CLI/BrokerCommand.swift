import ArgumentParser
import CanopyBroker
import CanopyBus
import CanopyMessages
import CanopyServiceKit
import Dispatch
import Foundation
import Logging
import ServiceLifecycle

@main
struct BrokerCommand: MainCommand {
    static let configuration = CommandConfiguration(
        commandName: "canopy-broker",
        abstract: "Canopy's message broker: routes requests between clients and service workers over ZeroMQ.",
        discussion: """
            Examples:
              canopy-broker serve --bind tcp://127.0.0.1:5555
              CANOPY_BIND='tcp://*:5555' canopy-broker serve --log-level debug
              canopy-broker health --endpoint tcp://127.0.0.1:5555
            """,
        subcommands: [Serve.self, Health.self],
        defaultSubcommand: Serve.self)
}

/// `canopy-broker serve`: the broker, until SIGTERM or SIGINT.
struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the broker until SIGTERM or SIGINT.",
        discussion: "Example: canopy-broker serve --bind tcp://127.0.0.1:5555 --heartbeat-ms 1000 --liveness 3")

    @OptionGroup var options: BrokerOptions
    @OptionGroup var operating: OperatingOptions
    @OptionGroup var traces: TraceOptions

    func run() async throws {
        let logger = LogSetup.logger(label: "canopy-broker", level: options.logLevel)
        let settings = try options.settings(metrics: try operating.listener(default: OperatingOptions.Defaults.broker))
        let services = try buildBroker(settings: settings, context: ZMQContext(), logger: logger)
        // SIGHUP reads the allow-list again (canopy keys reload sends it).
        let broker = services.compactMap { $0 as? BrokerServer }.first
        signal(SIGHUP, SIG_IGN)
        let hangUp = DispatchSource.makeSignalSource(signal: SIGHUP, queue: .global())
        hangUp.setEventHandler {
            do {
                let counts = try broker?.reloadAllowList()
                logger.notice(
                    "broker.curve.reload", metadata: ["broker.worker_keys": "\(counts?.workers ?? 0)", "broker.client_keys": "\(counts?.clients ?? 0)"])
            } catch {
                logger.error("broker.curve.reload.failed", metadata: ["broker.error": "\(error)"])
            }
        }
        hangUp.resume()
        defer { hangUp.cancel() }
        try await runUntilShutdown(services, traces: traces, logger: logger)
    }
}

/// `canopy-broker health`: exits 0 when a broker answers `broker.services` (or, with
/// `--via http`, when its `/health` says healthy).
struct Health: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Exit 0 when the broker answers, 1 when it does not (for container health checks).",
        discussion: """
            Examples:
              canopy-broker health --endpoint tcp://127.0.0.1:5555
              canopy-broker health --via http --metrics-bind 127.0.0.1:9400
            """)

    enum Via: String, ExpressibleByArgument, CaseIterable { case bus, http }

    @OptionGroup var common: CommonOptions
    @OptionGroup var operating: OperatingOptions
    @Option(help: "Ask over the bus (broker.services) or the /health listener.") var via: Via = .bus

    func run() async throws {
        if via == .http {
            return try await HealthProbe.run(operating, default: OperatingOptions.Defaults.broker)
        }
        let logger = LogSetup.logger(label: "canopy-broker", level: .critical)
        let context = ZMQContext()
        let client = try BusClient(configuration: try common.clientConfiguration(), context: context, logger: logger)
        defer { client.close() }
        do {
            let services = try await client.call(Broker.Services.self, .init(), timeout: .seconds(2))
            print("healthy: \(services.count) service(s) connected")
        } catch {
            print("unhealthy: \(error)")
            throw ExitCode(1)
        }
    }
}
