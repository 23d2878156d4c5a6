import CanopyBroker
import CanopyBus
import Logging

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
    /// Where the test's services log (quiet unless `CANOPY_TEST_LOG_LEVEL` says otherwise).
    public let logger: Logger

    init(mode: BusMode, live: LiveBus?, configuration: BrokerConfiguration) {
        self.mode = mode
        self.live = live
        inProcess = live == nil ? InProcessBus(maximumFrameBytes: configuration.maximumFrameBytes) : nil
        logger = live?.logger ?? LiveBus.testLogger
    }

    /// Serves `service` from now on: registered in process, or a runner with `credit` that
    /// the broker has seen register, live.
    public func serve(_ service: some BusService, credit: Int = 4) async throws {
        if let inProcess {
            inProcess.register(service)
        } else if let live {
            live.startRunner(service, credit: credit)
            try await live.waitForWorkers(1, service: service.name)
        }
    }

    /// A caller whose calls wait at most `timeout` unless they say otherwise.
    public func client(timeout: Duration = .seconds(10)) throws -> any BusCalling {
        if let live { return try live.client(timeout: timeout) }
        return inProcess!.timingOut(after: timeout)
    }
}

/// Runs `body` with a ``TestBus`` in `mode`, and stops whatever it started afterwards, also
/// when `body` throws.
public func withTestBus<T>(_ mode: BusMode = .inProcess, configuration: BrokerConfiguration = .testing,
                           _ body: (TestBus) async throws -> T) async throws -> T {
    switch mode {
    case .inProcess:
        return try await body(TestBus(mode: mode, live: nil, configuration: configuration))
    case .live:
        return try await withLiveBus(configuration: configuration) { live in
            try await body(TestBus(mode: mode, live: live, configuration: configuration))
        }
    }
}
