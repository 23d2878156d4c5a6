import ArgumentParser
import CanopyBus
import CanopyMessages
import CanopyRemind
import CanopyServiceKit
import CanopyStore
import Foundation

@main
struct RemindCommand: MainCommand {
    static let configuration = CommandConfiguration(
        commandName: "canopy-remind",
        abstract: "Canopy's reminder service: care reminders delivered at the right local time, once, to each person's devices.",
        discussion: """
            Examples:
              canopy-remind serve --endpoint tcp://127.0.0.1:5555 --data-dir ./.canopy
              canopy-remind devices --user user-42
              canopy-remind pending --user user-42
              canopy-remind send-test --user user-42 --device 3f0c…
              canopy-remind health --metrics-bind 127.0.0.1:9404
            """,
        subcommands: [ServeRemind.self, DevicesCommand.self, PendingCommand.self, SendTestCommand.self, HealthCommand<CanopyRemind>.self])
}

/// What the shared subcommands (`health`, `serve`'s options) know of canopy-remind.
enum CanopyRemind: ServiceExecutable {
    static let name = "canopy-remind"
    static let directoryName = "remind"
    static let defaultListener = OperatingOptions.Defaults.remind
}

struct ServeRemind: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve", abstract: "Serve reminders.* and devices.* on the bus and deliver reminders until SIGTERM or SIGINT.",
        discussion: "Example: canopy-remind serve --endpoint tcp://127.0.0.1:5555 --data-dir ./.canopy")

    @OptionGroup var serve: ServeOptions<CanopyRemind>
    @Option(help: ArgumentHelp("Seconds within which one person's reminders go out as one notification. Env: CANOPY_DIGEST_SECONDS.", valueName: "s"))
    var digestSeconds: Int = Environment.int("CANOPY_DIGEST_SECONDS", default: 600)
    @Option(help: ArgumentHelp("Hours after which a missed reminder is recorded as stale instead of sent. Env: CANOPY_STALE_HOURS.", valueName: "h"))
    var staleHours: Int = Environment.int("CANOPY_STALE_HOURS", default: 12)
    @Option(
        help: ArgumentHelp(
            "A host webhooks and ntfy topics may name though it is private or loopback (repeatable). Env: CANOPY_ALLOW_HOSTS (comma-separated).",
            valueName: "host"))
    var allowHost: [String] = Environment.string("CANOPY_ALLOW_HOSTS")?.split(separator: ",").map(String.init) ?? []
    @OptionGroup var apns: APNsOptions
    @OptionGroup var database: DatabaseOptions
    @Flag(
        help: ArgumentHelp(
            "Send nothing: every notification becomes a log line, whatever its device's channel (a replay or staging stack). Env: CANOPY_REHEARSAL=1."))
    var rehearse = false

    func validate() throws {
        guard (0...86_400).contains(digestSeconds) else { throw ValidationError("--digest-seconds is 0 to 86400") }
        guard (1...720).contains(staleHours) else { throw ValidationError("--stale-hours is 1 to 720") }
        if let settings = try apns.settings(expiration: .seconds(staleHours * 3_600)) {
            do {
                try settings.validate()
            } catch {
                throw ValidationError(error.message)
            }
        }
    }

    func run() async throws {
        let logger = serve.logger()
        var settings = ReminderServiceSettings(directory: serve.directory, runner: try serve.runner(), metrics: try serve.metrics())
        settings.postgres = try database.postgres(serving: true)
        settings.dispatch.digestWindow = .seconds(digestSeconds)
        settings.dispatch.staleness = .seconds(staleHours * 3_600)
        settings.allowedHosts = Set(allowHost.map { $0.lowercased() })
        settings.apns = try apns.settings(expiration: settings.dispatch.staleness)
        settings.clock = serve.worker.serviceClock
        settings.rehearsal = rehearse || Environment.flag("CANOPY_REHEARSAL")
        let context = serve.common.busContext()
        guard
            let services = try await buildUnlessStopped(
                logger: logger,
                { [settings] in
                    try await buildReminderService(settings: settings, context: context, logger: logger)
                })
        else { return }
        try await runUntilShutdown(services, traces: serve.traces, logger: logger)
    }
}

/// A call to the running service for one person, with an error that says what to check.
func ask<Operation: BusOperation>(_ operation: Operation.Type, _ request: Operation.Request, user: String, common: CommonOptions) async throws
    -> Operation.Reply
{
    let bus = try BusClient(
        configuration: try common.clientConfiguration(), context: ZMQContext(), logger: LogSetup.logger(label: "canopy-remind", level: .error))
    defer { bus.close() }
    do {
        return try await bus.call(operation, request, principal: user, timeout: .seconds(10))
    } catch let error as CanopyError {
        throw CommandFailure("\(error.message). Is canopy-remind serving at \(common.endpoint)?")
    }
}

struct DevicesCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "devices", abstract: "List a person's devices (asks the running service).", discussion: "Example: canopy-remind devices --user user-42")
    @OptionGroup var common: CommonOptions
    @Option(help: "The person's user id.") var user: String

    func run() async throws {
        let devices = try await ask(Reminders.ListDevices.self, .init(), user: user, common: common)
        var table = Table("ID", "CHANNEL", "NAME", "ACTIVE", "REGISTERED (UTC)", "ADDRESS")
        for device in devices {
            table.append([
                device.id, device.channel.rawValue, device.name ?? "", device.active ? "yes" : "no: \(device.deactivatedReason ?? "")",
                device.registeredAt.formatted(.iso8601), String(device.address.prefix(60)),
            ])
        }
        print(table.render())
    }
}

struct PendingCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pending", abstract: "List a person's next reminders (asks the running service).",
        discussion: "Example: canopy-remind pending --user user-42")
    @OptionGroup var common: CommonOptions
    @Option(help: "The person's user id.") var user: String
    @Option(help: "How many, 1 to 256.") var limit = 64

    func run() async throws {
        let reminders = try await ask(Reminders.Pending.self, .init(limit: limit), user: user, common: common)
        var table = Table("DUE (UTC)", "TASK", "STATE", "PLANT")
        for reminder in reminders {
            table.append([reminder.due.formatted(.iso8601), reminder.title, reminder.state.rawValue, reminder.plantID])
        }
        print(table.render())
    }
}

struct SendTestCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "send-test", abstract: "Send a test notification to one of a person's devices now.",
        discussion: "Example: canopy-remind send-test --user user-42 --device 3f0c…")
    @OptionGroup var common: CommonOptions
    @Option(help: "The person's user id.") var user: String
    @Option(help: "The device's id (canopy-remind devices lists them).") var device: String

    func run() async throws {
        let reply = try await ask(Reminders.SendTest.self, .init(deviceID: device), user: user, common: common)
        var table = Table("DEVICE", "ACCEPTED", "DETAIL")
        table.append([device, reply.accepted ? "yes" : "no", reply.detail])
        print(table.render())
        if !reply.accepted { throw ExitCode.failure }
    }
}

/// Apple's push service: all four of key file, key id, team id and topic, or none (then there
/// is no `apns` channel). Never logged.
struct APNsOptions: ParsableArguments {
    @Option(help: ArgumentHelp("The .p8 signing key from Apple's developer account, for APNs. Env: CANOPY_APNS_KEY_FILE.", valueName: "file"))
    var apnsKeyFile: String? = Environment.string("CANOPY_APNS_KEY_FILE")
    @Option(help: ArgumentHelp("The signing key's 10-character id. Env: CANOPY_APNS_KEY_ID.", valueName: "id"))
    var apnsKeyID: String? = Environment.string("CANOPY_APNS_KEY_ID")
    @Option(help: ArgumentHelp("The developer team's 10-character id. Env: CANOPY_APNS_TEAM_ID.", valueName: "id"))
    var apnsTeamID: String? = Environment.string("CANOPY_APNS_TEAM_ID")
    @Option(help: ArgumentHelp("The app's bundle id (apns-topic). Env: CANOPY_APNS_TOPIC.", valueName: "bundle-id"))
    var apnsTopic: String? = Environment.string("CANOPY_APNS_TOPIC")
    @Option(
        help: ArgumentHelp(
            "APNs' address: \(APNsSettings.production), or \(APNsSettings.sandbox) for development builds. Env: CANOPY_APNS_SERVER.", valueName: "url"))
    var apnsServer: String = Environment.string("CANOPY_APNS_SERVER") ?? APNsSettings.production
    @Option(
        help: ArgumentHelp("Certificate authorities (PEM) to trust for APNs instead of the system's, for a proxy. Env: CANOPY_APNS_CA_FILE.", valueName: "file")
    )
    var apnsCAFile: String? = Environment.string("CANOPY_APNS_CA_FILE")

    /// The settings, `nil` when APNs is not configured; an error naming what is missing when
    /// it is only partly.
    func settings(expiration: Duration) throws -> APNsSettings? {
        let given = [("--apns-key-file", apnsKeyFile), ("--apns-key-id", apnsKeyID), ("--apns-team-id", apnsTeamID), ("--apns-topic", apnsTopic)]
        let missing = given.filter { $0.1?.isEmpty ?? true }.map(\.0)
        if missing.count == given.count { return nil }
        guard missing.isEmpty, let apnsKeyFile, let apnsKeyID, let apnsTeamID, let apnsTopic else {
            throw ValidationError("APNs needs \(missing.joined(separator: ", ")) too (or none of the --apns options)")
        }
        var settings = APNsSettings(keyFile: apnsKeyFile, keyID: apnsKeyID, teamID: apnsTeamID, topic: apnsTopic)
        settings.server = apnsServer
        settings.caFile = apnsCAFile
        settings.expiration = expiration
        return settings
    }
}
