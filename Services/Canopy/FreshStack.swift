import CanopyBus
import CanopyDeployment
import CanopyServiceKit
import Foundation
import Glibc

/// A throwaway local stack started from a capture's snapshot (`canopy replay NAME --fresh`):
/// a temporary data directory holding a copy of the snapshot's stores, free ports, every
/// service on a clock that stands at the capture's cut at one instant of the system's clock
/// (``anchor``) and runs from there, canopy-remind rehearsing (no notification leaves the
/// machine), and the environment's database and endpoint settings left out (it is a stack
/// of its own). ``stop()`` ends it and removes the directory.
final class FreshStack {
    let directory: URL
    let endpoint: String
    /// The operator's key for its bus (its keys are its own).
    let curve: CurveClientSettings?
    /// The system-clock instant at which every service's clock shows the cut.
    let anchor: Date
    /// The cut, as the services' clocks have it (seconds since 1970, to the millisecond).
    let anchorCut: Double
    private let supervisor: StackSupervisor

    private init(directory: URL, endpoint: String, curve: CurveClientSettings?, anchor: Date, anchorCut: Double, supervisor: StackSupervisor) {
        self.directory = directory
        self.endpoint = endpoint
        self.curve = curve
        self.anchor = anchor
        self.anchorCut = anchorCut
        self.supervisor = supervisor
    }

    /// Starts a stack of `executables` from `snapshot`, its clocks meeting the cut `lead` from
    /// now; returns once every service is healthy. `nil` when starting took longer than the
    /// lead (the caller tries again with a longer one): the clocks would already have passed
    /// the cut.
    static func start(
        snapshot: URL, manifest: StackSnapshot.Manifest, executables: URL, lead: Duration,
        progress: (String) -> Void
    ) throws -> FreshStack? {
        try Backup.checkStores(in: snapshot) // another program's file is named, not handed to a service
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-replay-\(UUID().uuidString)", isDirectory: true)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        var started = false
        defer { if !started { try? FileManager.default.removeItem(at: directory) } }
        for store in manifest.stores {
            let target = directory.appendingPathComponent(store)
            try FileManager.default.createDirectory(
                at: target.deletingLastPathComponent(), withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            try FileManager.default.copyItem(at: snapshot.appendingPathComponent(store), to: target)
        }
        _ = try StackSnapshot.linkOriginals(from: snapshot.appendingPathComponent("images/originals"), to: directory.appendingPathComponent("images/originals"))
        let layout = StackLayout(dataDirectory: directory)
        try Up.makeTokenKey(layout.tokenKey)
        let keys = StackKeys(dataDirectory: directory) // its own, as every stack's
        try keys.ensure()
        let operatorKey = try StackKeys.operatorSettings(dataDirectory: directory)
        let stackID = try Up.stackID(layout.stackIDFile)
        try FileManager.default.createDirectory(at: layout.logs, withIntermediateDirectories: true)

        // Milliseconds, as the clock option and the replay both read them.
        let cut = Date(timeIntervalSince1970: (Double(manifest.cutAt) / 1e6).rounded() / 1e3)
        let anchor = Date(timeIntervalSince1970: ((Date().timeIntervalSince1970 + lead.seconds) * 1e3).rounded() / 1e3)
        let format = Date.ISO8601FormatStyle(includingFractionalSeconds: true)
        var environment = [
            "CANOPY_CLOCK": "from:\(cut.formatted(format)),at:\(anchor.formatted(format))", "CANOPY_STACK": stackID,
            "CANOPY_LOG_LEVEL": "notice", "CANOPY_REHEARSAL": "1",
        ]
        // Not the environment's stack: its database, originals, endpoint and keys stay out.
        for name in [
            "CANOPY_DATABASE_URL", "CANOPY_DATABASE_PASSWORD_FILE", "CANOPY_ORIGINALS_DIR", "CANOPY_ENDPOINT", "CANOPY_HTTP",
            "CANOPY_CURVE_SERVER_KEY", "CANOPY_CURVE_SECRET_KEY", "CANOPY_CURVE_SECRET_KEY_FILE", "CANOPY_DATA_DIR",
        ] {
            environment[name] = ""
        }
        let (bus, http, metrics) = try freePorts()
        let endpoint = "tcp://127.0.0.1:\(bus)"
        let supervisor = StackSupervisor(
            settings: .init(
                layout: layout, executables: executables, endpoint: endpoint, http: "127.0.0.1:\(http)",
                metricsBase: metrics, environment: environment, curve: keys.files))
        progress("starting a fresh stack from \(snapshot.lastPathComponent) in \(directory.path)…")
        do {
            try supervisor.startAll(within: .seconds(120)) { _ in }
        } catch {
            supervisor.stopAll(grace: .seconds(5))
            throw error
        }
        guard anchor.timeIntervalSinceNow > 0.25 else {
            supervisor.stopAll(grace: .seconds(5))
            return nil
        }
        started = true
        return FreshStack(
            directory: directory, endpoint: endpoint, curve: operatorKey, anchor: anchor,
            anchorCut: cut.timeIntervalSince1970, supervisor: supervisor)
    }

    /// Stops every service and removes the directory.
    func stop() {
        supervisor.stopAll(grace: .seconds(10))
        try? FileManager.default.removeItem(at: directory)
    }

    /// A free port for the bus and the API, and six in a row for the services' `/metrics`:
    /// below the system's ephemeral ports, which outgoing connections take at random.
    private static func freePorts() throws -> (bus: Int, http: Int, metrics: Int) {
        func free(_ port: Int) -> Bool { (try? PortCheck.check(ListenAddress(host: "127.0.0.1", port: port))) != nil }
        let range =
            (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8))?
            .split(whereSeparator: \.isWhitespace).compactMap { Int($0) } ?? []
        let ceiling = max(11_000, (range.first ?? 32_768) - 10)
        var found: [Int] = []
        for _ in 0..<200 {
            let base = Int.random(in: 10_000...ceiling)
            guard (0..<8).allSatisfy({ free(base + $0) }) else { continue }
            found = Array(base..<(base + 8))
            break
        }
        guard found.count == 8 else { throw CommandFailure("found no free ports on 127.0.0.1 for a fresh stack; free some and try again") }
        return (found[6], found[7], found[0])
    }
}
