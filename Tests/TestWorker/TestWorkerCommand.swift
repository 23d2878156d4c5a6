import ArgumentParser
import CanopyBus
import CanopyServiceKit
import CanopyTesting

/// A `test` service worker in its own process, for tests that kill workers with SIGKILL.
@main
struct TestWorkerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "canopy-test-worker",
        abstract: "Serve the 'test' service (echo, append, fail) for Canopy's live tests.",
        discussion: "Example: canopy-test-worker --endpoint tcp://127.0.0.1:5555 --credit 4 --name w1")

    @OptionGroup var common: CommonOptions
    @Option(help: "Requests held at once.") var credit = 4
    @Option(help: "Heartbeat interval in milliseconds.") var heartbeatMs = 1_000
    @Option(help: "Name shown in replies.") var name = "worker"

    func run() async throws {
        let logger = LogSetup.logger(label: "canopy-test-worker", level: common.logLevel)
        var configuration = ServiceRunner.Configuration(endpoint: common.endpoint)
        configuration.credit = credit
        configuration.heartbeatInterval = .milliseconds(heartbeatMs)
        let runner = ServiceRunner(service: TestWorkerService(workerName: name), configuration: configuration, context: ZMQContext(), logger: logger)
        try await runUntilShutdown([runner], logger: logger)
    }
}
