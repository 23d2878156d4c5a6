import CanopyBroker
import CanopyBus
import CanopyServiceKit
import Foundation
import Logging
import ServiceLifecycle
import Synchronization

/// Where a service test's calls go: straight to the services' handlers (``inProcess``, the
/// default: no broker, no sockets, no waiting for workers) or over a broker and runners on
/// loopback (``live``), as Hummingbird's `.router` and `.live` test modes.
public enum BusMode: String, Sendable, CaseIterable {
    case inProcess
    case live
}

/// A bus for a service test, in either ``BusMode``: the services it serves, and callers.
public final class TestBus: Sendable {
    /// Which bus this is.
    public let mode: BusMode
    /// The live bus, in `.live` mode.
    public let live: LiveBus?
    private let inProcess: InProcessBus?
    /// How long each service refuses a person it erased (``ErasedPeople``).
    public let erasureWindow: Duration
    /// Where the test's services log (quiet unless `CANOPY_TEST_LOG_LEVEL` says otherwise).
    public let logger: Logger

    /// The test bus of a live bus a test started itself.
    public convenience init(live: LiveBus) {
        self.init(mode: .live, live: live, configuration: live.configuration)
    }

    init(mode: BusMode, live: LiveBus?, configuration: BrokerConfiguration, erasureWindow: Duration = ErasedPeople.defaultWindow) {
        self.mode = mode
        self.live = live
        self.erasureWindow = erasureWindow
        inProcess = live == nil ? InProcessBus(maximumFrameBytes: configuration.maximumFrameBytes, erasureWindow: erasureWindow) : nil
        logger = live?.logger ?? LiveBus.testLogger
    }

    /// Serves `service` from now on: registered in process, or a runner with `credit` that
    /// the broker has seen register, live.
    public func serve(_ service: any BusService, credit: Int = 4) async throws {
        if let inProcess {
            inProcess.register(service)
        } else if let live {
            live.startRunner(service, credit: credit)
            try await live.waitForWorkers(1, service: service.name)
        }
    }

    /// Runs a worker's parts (what its `make…Service` made): the handlers served as
    /// ``serve(_:credit:)`` does, the background services beside them until the test ends.
    public func run(_ parts: ServiceParts, credit: Int = 4) async throws {
        run(parts.background)
        try await serve(parts.handlers, credit: credit)
    }

    /// Starts a worker as its executable would: live, what its `build…Service` made, until
    /// the broker has seen `service` register; in process, the parts its `make…Service` made
    /// (given a caller of this bus for the services it calls).
    public func start(
        _ service: String, live build: (ZMQContext, Logger) async throws -> [any Service],
        inProcess make: (any BusCalling, Logger) async throws -> ServiceParts
    ) async throws {
        if let live {
            live.run(try await build(live.context, live.logger))
            try await live.waitForWorkers(1, service: service)
        } else {
            try await run(try await make(try client(asService: true), logger))
        }
    }

    /// Runs `services` (a fake peer's HTTP server, a worker's background) in a service group
    /// until the test ends.
    public func run(_ services: [any Service]) {
        if let live { return live.run(services) }
        guard !services.isEmpty else { return }
        let group = serviceGroup(services, signals: [], logger: logger)
        groups.withLock { $0.append((group, Task { try await group.run() })) }
    }

    /// Ends what ``run(_:)`` started, last first.
    func shutdown() async {
        for (group, task) in groups.withLock({ $0.reversed() }) {
            await group.triggerGracefulShutdown()
            _ = try? await task.value
        }
    }

    private let groups = Mutex<[(ServiceGroup, Task<Void, Error>)]>([])

    /// A runner configuration for a worker's settings: the live broker's, or (in process,
    /// where no runner connects) one that names no broker.
    public func runnerConfiguration(credit: Int = 4) -> ServiceRunner.Configuration {
        var configuration = live?.runnerConfiguration(credit: credit) ?? ServiceRunner.Configuration(endpoint: "inproc://canopy-in-process-bus")
        configuration.erasureWindow = erasureWindow
        return configuration
    }

    /// A caller whose calls wait at most `timeout` unless they say otherwise (60 s: a full
    /// parallel run on two cores, with the machine busy besides, kept handlers from a thread
    /// for over 30 s; the timeout is there to fail a hang, not to time anything).
    /// `asService` makes its requests as a service's own client does (operations of
    /// ``Access/service`` take only those): what a worker is given to call others with.
    public func client(timeout: Duration = .seconds(60), asService: Bool = false) throws -> any BusCalling {
        if let live { return try live.client(timeout: timeout, asService: asService) }
        return inProcess!.timingOut(after: timeout, asService: asService)
    }
}

/// Runs `body` with a ``TestBus`` in `mode`, and stops whatever it started afterwards, also
/// when `body` throws. `CANOPY_TEST_BUS=live` runs the in-process tests over a live broker too
/// (`CANOPY_TEST_BUS=live scripts/test`), to compare the two paths or their times.
public func withTestBus<T>(
    _ mode: BusMode = .inProcess, configuration: BrokerConfiguration = .testing, erasureWindow: Duration = ErasedPeople.defaultWindow,
    _ body: (TestBus) async throws -> T
) async throws -> T {
    let mode = ProcessInfo.processInfo.environment["CANOPY_TEST_BUS"] == "live" ? .live : mode
    switch mode {
    case .inProcess:
        let bus = TestBus(mode: mode, live: nil, configuration: configuration, erasureWindow: erasureWindow)
        return try await ending(with: bus.shutdown) { try await body(bus) }
    case .live:
        return try await withLiveBus(configuration: configuration) { live in
            try await body(TestBus(mode: mode, live: live, configuration: configuration, erasureWindow: erasureWindow))
        }
    }
}
