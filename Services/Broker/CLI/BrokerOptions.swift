import ArgumentParser
import CanopyBroker
import CanopyBus
import CanopyCapture
import CanopyServiceKit
import Foundation
import Logging

/// Every option of `canopy-broker serve`; each also reads a `CANOPY_*` variable (flags win).
struct BrokerOptions: ParsableArguments {
    /// Where every default comes from: one place, the configuration type.
    static let defaults = BrokerConfiguration.defaults

    @Option(help: ArgumentHelp("Endpoint to listen on. Env: CANOPY_BIND.", valueName: "endpoint"))
    var bind: String = Environment.string("CANOPY_BIND") ?? "tcp://127.0.0.1:5555"

    @Option(help: ArgumentHelp("This broker's name among several live ones: the 'broker' label of its metrics. Env: CANOPY_BROKER_NAME.", valueName: "name"))
    var name: String = Environment.string("CANOPY_BROKER_NAME") ?? Self.defaults.name

    @Option(
        help: ArgumentHelp(
            "The stack this broker belongs to (canopy up sets it): announced to every peer, and peers of another stack are refused. Env: CANOPY_STACK.",
            valueName: "id"))
    var stack: String? = Environment.string("CANOPY_STACK")

    @Option(help: ArgumentHelp("Heartbeat interval in milliseconds, both ways. Env: CANOPY_HEARTBEAT_MS.", valueName: "ms"))
    var heartbeatMs: Int = Environment.milliseconds("CANOPY_HEARTBEAT_MS", default: Self.defaults.heartbeatInterval)

    @Option(help: ArgumentHelp("Missed heartbeats before a worker counts as dead. Env: CANOPY_LIVENESS.", valueName: "beats"))
    var liveness: Int = Environment.int("CANOPY_LIVENESS", default: Self.defaults.liveness)

    @Option(help: ArgumentHelp("Requests waiting per service before new ones get 'busy'. Env: CANOPY_MAX_QUEUE.", valueName: "count"))
    var maxQueue: Int = Environment.int("CANOPY_MAX_QUEUE", default: Self.defaults.maximumQueuedPerService)

    @Option(help: ArgumentHelp("Bytes of requests waiting per service before new ones get 'busy'. Env: CANOPY_MAX_QUEUE_BYTES.", valueName: "bytes"))
    var maxQueueBytes: Int = Environment.int("CANOPY_MAX_QUEUE_BYTES", default: Self.defaults.maximumQueuedBytesPerService)

    @Option(
        help: ArgumentHelp(
            "Bytes of requests the broker holds in all (queued or at workers) before new ones get 'busy'. Env: CANOPY_MAX_HELD_BYTES.", valueName: "bytes"))
    var maxHeldBytes: Int = Environment.int("CANOPY_MAX_HELD_BYTES", default: Self.defaults.maximumHeldBytes)

    @Option(
        help: ArgumentHelp(
            "Bytes of replies waiting unread for one client before more are dropped (it gets 'busy' instead). Env: CANOPY_MAX_UNREAD_BYTES_PER_CLIENT.",
            valueName: "bytes"))
    var maxUnreadBytesPerClient: Int = Environment.int("CANOPY_MAX_UNREAD_BYTES_PER_CLIENT", default: Self.defaults.maximumUnreadBytesPerClient)

    @Option(help: ArgumentHelp("Bytes of replies waiting unread for all clients before more are dropped. Env: CANOPY_MAX_UNREAD_BYTES.", valueName: "bytes"))
    var maxUnreadBytes: Int = Environment.int("CANOPY_MAX_UNREAD_BYTES", default: Self.defaults.maximumUnreadBytes)

    @Option(help: ArgumentHelp("Largest frame accepted, in bytes. Env: CANOPY_MAX_FRAME_BYTES.", valueName: "bytes"))
    var maxFrameBytes: Int = Environment.int("CANOPY_MAX_FRAME_BYTES", default: Self.defaults.maximumFrameBytes)

    @Option(help: ArgumentHelp("Deadline of requests that give none, in milliseconds. Env: CANOPY_DEFAULT_TIMEOUT_MS.", valueName: "ms"))
    var defaultTimeoutMs: Int = Environment.milliseconds("CANOPY_DEFAULT_TIMEOUT_MS", default: Self.defaults.defaultTimeout)

    @Option(help: ArgumentHelp("How long shutdown waits for in-flight requests, in milliseconds. Env: CANOPY_DRAIN_TIMEOUT_MS.", valueName: "ms"))
    var drainTimeoutMs: Int = Environment.milliseconds("CANOPY_DRAIN_TIMEOUT_MS", default: Self.defaults.drainTimeout)

    @Flag(inversion: .prefixedNo, help: ArgumentHelp("Coalesce identical in-flight requests of coalescable operations. Env: CANOPY_COALESCING=0 turns it off."))
    var coalescing: Bool = Environment.string("CANOPY_COALESCING").map { !["0", "false", "no", "off"].contains($0.lowercased()) } ?? true

    @Option(help: ArgumentHelp("Services never coalesced, comma-separated. Env: CANOPY_UNCOALESCED_SERVICES.", valueName: "services"))
    var uncoalescedServices: String = Environment.string("CANOPY_UNCOALESCED_SERVICES") ?? ""

    @Option(
        help: ArgumentHelp(
            "Majordomo (7/MDP) services whose requests are coalesced, comma-separated; they must be idempotent. Env: CANOPY_MAJORDOMO_COALESCED.",
            valueName: "services"))
    var majordomoCoalesced: String = Environment.string("CANOPY_MAJORDOMO_COALESCED") ?? ""

    @Option(help: ArgumentHelp("Waiters one flight takes before identical requests get 'busy'. Env: CANOPY_MAX_WAITERS.", valueName: "count"))
    var maxWaiters: Int = Environment.int("CANOPY_MAX_WAITERS", default: Self.defaults.maximumWaitersPerFlight)

    @Option(help: ArgumentHelp("Coalescable flights open at once before new ones get 'busy'. Env: CANOPY_MAX_FLIGHTS.", valueName: "count"))
    var maxFlights: Int = Environment.int("CANOPY_MAX_FLIGHTS", default: Self.defaults.maximumOpenFlights)

    @Option(help: ArgumentHelp("Age in milliseconds after which a flight takes no new waiters. Env: CANOPY_STUCK_FLIGHT_MS.", valueName: "ms"))
    var stuckFlightMs: Int = Environment.milliseconds("CANOPY_STUCK_FLIGHT_MS", default: Self.defaults.stuckFlightAge)

    @Option(
        help: ArgumentHelp(
            "The broker's key file from 'canopy keys generate'; turns CurveZMQ on (needs --curve-allow). Env: CANOPY_CURVE_SECRET_KEY_FILE, or the key itself in CANOPY_CURVE_SECRET_KEY.",
            valueName: "file"))
    var curveSecretKeyFile: String?

    @Option(
        help: ArgumentHelp("The allow-list: lines 'worker KEY SERVICES' (comma-separated, or *) and 'client KEY'. Env: CANOPY_CURVE_ALLOW.", valueName: "file"))
    var curveAllow: String?

    /// The key file from the flag, else `CANOPY_CURVE_SECRET_KEY_FILE`.
    private var secretKeyFile: String? { curveSecretKeyFile ?? Environment.string("CANOPY_CURVE_SECRET_KEY_FILE") }
    /// The allow-list from the flag, else `CANOPY_CURVE_ALLOW`.
    private var allowFile: String? { curveAllow ?? Environment.string("CANOPY_CURVE_ALLOW") }

    @Flag(help: ArgumentHelp("With CURVE, let any key call (workers still need an allowed key). Env: CANOPY_CURVE_ANY_CLIENT=1."))
    var curveAnyClient: Bool = Environment.flag("CANOPY_CURVE_ANY_CLIENT")

    @Option(
        help: ArgumentHelp(
            "Capture every request and reply that crosses the broker into this file from the start (see canopy capture --help). Env: CANOPY_CAPTURE.",
            valueName: "file"))
    var capture: String? = Environment.string("CANOPY_CAPTURE")

    @Option(
        help: ArgumentHelp(
            "Directory where 'canopy capture start NAME' may create captures on the running broker; without it the broker refuses. Env: CANOPY_CAPTURE_DIR.",
            valueName: "dir"))
    var captureDir: String? = Environment.string("CANOPY_CAPTURE_DIR")

    @Option(
        help: ArgumentHelp(
            "A capture file that reaches this size is closed and the next begun (FILE.1, FILE.2...). Env: CANOPY_CAPTURE_MAX_BYTES.", valueName: "bytes"))
    var captureMaxBytes: Int = Environment.int("CANOPY_CAPTURE_MAX_BYTES", default: 1 << 30)

    @Option(
        help: ArgumentHelp("Capture files kept; the oldest goes when a new one would exceed it (0 keeps all). Env: CANOPY_CAPTURE_KEEP.", valueName: "count"))
    var captureKeep: Int = Environment.int("CANOPY_CAPTURE_KEEP", default: 0)

    @Option(
        help: ArgumentHelp(
            "Bytes of records waiting for the disk; beyond it records are dropped and counted, never queued without bound. Env: CANOPY_CAPTURE_QUEUE_BYTES.",
            valueName: "bytes"))
    var captureQueueBytes: Int = Environment.int("CANOPY_CAPTURE_QUEUE_BYTES", default: 64 << 20)

    @Flag(
        help: ArgumentHelp("In captures, replace principals (headers and bodies) by keyed hashes, stable within a capture. Env: CANOPY_CAPTURE_PSEUDONYMIZE=1.")
    )
    var pseudonymize: Bool = Environment.flag("CANOPY_CAPTURE_PSEUDONYMIZE")

    @Flag(help: ArgumentHelp("In captures, leave attachment bytes (photos) out; their sizes are kept. Env: CANOPY_CAPTURE_WITHOUT_ATTACHMENTS=1."))
    var withoutAttachments: Bool = Environment.flag("CANOPY_CAPTURE_WITHOUT_ATTACHMENTS")

    @Option(help: ArgumentHelp("trace, debug, info, notice, warning, error or critical. Env: CANOPY_LOG_LEVEL.", valueName: "level"))
    var logLevel: Logger.Level = Environment.string("CANOPY_LOG_LEVEL").flatMap(Logger.Level.init(rawValue:)) ?? .info

    func validate() throws {
        try Environment.validate()
        if let stack { try CommonOptions.validate(stack: stack) }
        // A label value: short, printable, no quotes or backslashes (Prometheus text format).
        guard (1...64).contains(name.utf8.count), name.utf8.allSatisfy({ (0x21...0x7E).contains($0) && $0 != 0x22 && $0 != 0x5C }) else {
            throw ValidationError("--name (CANOPY_BROKER_NAME) is 1 to 64 printable characters without spaces, quotes or backslashes, such as broker-a")
        }
        guard heartbeatMs >= 10 else { throw ValidationError("--heartbeat-ms must be at least 10; 1000 is the usual value") }
        guard liveness >= 1 else { throw ValidationError("--liveness must be at least 1 missed heartbeat; 3 is the usual value") }
        guard maxQueue >= 0 else { throw ValidationError("--max-queue cannot be negative; 0 answers 'busy' whenever no worker has credit") }
        guard maxQueueBytes >= 0, maxHeldBytes >= maxFrameBytes else {
            throw ValidationError("--max-queue-bytes cannot be negative, and --max-held-bytes must be at least --max-frame-bytes (one whole request)")
        }
        if allowFile != nil && secretKeyFile == nil && Environment.string("CANOPY_CURVE_SECRET_KEY") == nil {
            throw ValidationError("--curve-allow needs the broker's own key: --curve-secret-key-file (make one with canopy keys generate broker)")
        }
        if (secretKeyFile != nil || Environment.string("CANOPY_CURVE_SECRET_KEY") != nil) && allowFile == nil {
            throw ValidationError("CURVE needs an allow-list of worker keys: --curve-allow FILE (see canopy keys generate --help)")
        }
        guard maxFrameBytes >= 1024 else { throw ValidationError("--max-frame-bytes must be at least 1024") }
        guard maxUnreadBytesPerClient >= 1 << 20, maxUnreadBytes >= maxUnreadBytesPerClient else {
            throw ValidationError(
                "--max-unread-bytes-per-client must be at least 1048576 (1 MiB) and --max-unread-bytes at least as large; 67108864 and 536870912 are the defaults"
            )
        }
        guard defaultTimeoutMs >= 1 else { throw ValidationError("--default-timeout-ms must be at least 1") }
        guard drainTimeoutMs >= 0 else { throw ValidationError("--drain-timeout-ms cannot be negative") }
        guard maxWaiters >= 1, maxFlights >= 1 else {
            throw ValidationError("--max-waiters and --max-flights must be at least 1; turn coalescing off with --no-coalescing instead")
        }
        guard stuckFlightMs >= 1 else { throw ValidationError("--stuck-flight-ms must be at least 1") }
        guard captureMaxBytes >= 1 << 16 else { throw ValidationError("--capture-max-bytes must be at least 65536; 1073741824 (1 GiB) is the default") }
        guard captureKeep >= 0 else { throw ValidationError("--capture-keep cannot be negative; 0 keeps every file") }
        guard captureQueueBytes >= 1 << 20 else { throw ValidationError("--capture-queue-bytes must be at least 1048576 (1 MiB)") }
        if let captureDir {
            var directory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: captureDir, isDirectory: &directory), directory.boolValue else {
                throw ValidationError("--capture-dir \(captureDir) is not a directory; create it first (mkdir -p \(captureDir))")
            }
        }
    }

    /// The capture settings these options describe (the path empty when no --capture).
    var captureSettings: CaptureSettings {
        var settings = CaptureSettings(path: capture ?? "")
        settings.maximumFileBytes = captureMaxBytes
        settings.keepFiles = captureKeep
        settings.queueBytes = captureQueueBytes
        settings.pseudonymize = pseudonymize
        settings.withoutAttachments = withoutAttachments
        return settings
    }

    /// The broker configuration these options describe.
    var configuration: BrokerConfiguration {
        var configuration = BrokerConfiguration()
        configuration.name = name
        configuration.heartbeatInterval = .milliseconds(heartbeatMs)
        configuration.liveness = liveness
        configuration.maximumQueuedPerService = maxQueue
        configuration.maximumQueuedBytesPerService = maxQueueBytes
        configuration.maximumHeldBytes = maxHeldBytes
        configuration.maximumUnreadBytesPerClient = maxUnreadBytesPerClient
        configuration.maximumUnreadBytes = maxUnreadBytes
        configuration.maximumFrameBytes = maxFrameBytes
        configuration.defaultTimeout = .milliseconds(defaultTimeoutMs)
        configuration.drainTimeout = .milliseconds(drainTimeoutMs)
        configuration.coalescing = coalescing
        configuration.coalescingDisabledServices = Self.names(uncoalescedServices)
        configuration.majordomoCoalescedServices = Self.names(majordomoCoalesced)
        configuration.maximumWaitersPerFlight = maxWaiters
        configuration.maximumOpenFlights = maxFlights
        configuration.stuckFlightAge = .milliseconds(stuckFlightMs)
        if capture != nil || captureDir != nil { configuration.capture = captureSettings }
        configuration.captureDirectory = captureDir
        configuration.stack = stack
        return configuration
    }

    private static func names(_ list: String) -> Set<String> {
        Set(list.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty })
    }

    /// The settings these options describe, with `/metrics` and `/health` at `metrics`.
    func settings(metrics: ListenAddress?) throws -> BrokerSettings {
        BrokerSettings(endpoint: bind, configuration: configuration, curve: try curveSettings(), metrics: metrics)
    }

    /// The CurveZMQ settings, `nil` when CURVE is off (no key given).
    func curveSettings() throws -> CurveServerSettings? {
        guard let allowFile else { return nil }
        do {
            let keyPair =
                try secretKeyFile.map { try Curve.readKeyPair(file: $0) }
                ?? CurveKeyPair(secretKey: Environment.string("CANOPY_CURVE_SECRET_KEY") ?? "")
            return CurveServerSettings(
                keyPair: keyPair, allowList: try CurveServerSettings.readAllowList(allowFile), anyClient: curveAnyClient,
                allowListFile: allowFile)
        } catch let error as Curve.KeyError {
            throw ValidationError(error.description)
        }
    }
}
