import ArgumentParser
import CanopyBus
import CanopyServiceKit
import CanopyTesting

/// A `test` service worker in its own process, for tests that kill workers with SIGKILL.
@main
struct TestWorkerCommand: MainCommand {
    static let configuration = CommandConfiguration(
        commandName: "canopy-test-worker",
        abstract: "Serve the 'test' service (echo, append, fail) for Canopy's live tests.",
        discussion: "Example: canopy-test-worker --endpoint tcp://127.0.0.1:5555 --credit 4 --name w1")

    @OptionGroup var common: CommonOptions
    @OptionGroup var worker: WorkerOptions
    @Option(help: "Name shown in replies. Env: CANOPY_WORKER_NAME.") var name = Environment.string("CANOPY_WORKER_NAME") ?? "worker"

    func run() async throws {
        let logger = LogSetup.logger(label: "canopy-test-worker", level: common.logLevel)
        let runner = ServiceRunner(
            service: TestWorkerService(workerName: name), configuration: try worker.runnerConfiguration(common),
            context: common.busContext(), logger: logger)
        try await runUntilShutdown([runner], logger: logger)
    }
}
