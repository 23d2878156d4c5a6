import ArgumentParser
import CanopyBus
import CanopyCare
import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation

@main
struct CareCommand: MainCommand {
    static let configuration = CommandConfiguration(
        commandName: "canopy-care",
        abstract: "Canopy's care service: plant collections, care profiles, schedules and tasks.",
        discussion: """
            Examples:
              canopy-care serve --endpoint tcp://127.0.0.1:5555 --data-dir ./.canopy
              canopy-care serve --endpoint tcp://127.0.0.1:5555 --database-url postgres://canopy@db:5432/canopy --database-password-file /run/secrets/db
              canopy-care catalog search monstera
              canopy-care plan --species "Monstera deliciosa" --days 30 --tz Europe/Berlin
              canopy-care upcoming --user user-42 --days 7
              canopy-care health --metrics-bind 127.0.0.1:9402
            """,
        subcommands: [ServeCare.self, CatalogCommand.self, Plan.self, Upcoming.self, HealthCommand<CanopyCare>.self])
}

/// What the shared subcommands (`health`, `serve`'s options) know of canopy-care.
enum CanopyCare: ServiceExecutable {
    static let name = "canopy-care"
    static let directoryName = "care"
    static let defaultListener = OperatingOptions.Defaults.care
}

struct ServeCare: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve", abstract: "Serve care.* on the bus until SIGTERM or SIGINT.",
        discussion: "Example: canopy-care serve --endpoint tcp://127.0.0.1:5555 --data-dir ./.canopy")

    @OptionGroup var serve: ServeOptions<CanopyCare>
    @OptionGroup var database: DatabaseOptions
    @Option(
        help: ArgumentHelp(
            "A species care catalog used instead of the shipped one (the shape of Resources/catalog.json). Env: CANOPY_CATALOG.", valueName: "file"))
    var catalog: String? = Environment.string("CANOPY_CATALOG")
    @Option(
        help: ArgumentHelp(
            "Seconds after an account's deletion its second pass erases what requests already on their way added (longer than any request waits). Env: CANOPY_ERASURE_SECOND_PASS.",
            valueName: "seconds"))
    var erasureSecondPass: Int = Environment.int("CANOPY_ERASURE_SECOND_PASS", default: 60)

    func validate() throws {
        guard (1...86_400).contains(erasureSecondPass) else {
            throw ValidationError("--erasure-second-pass is 1 to 86400 seconds (a day); 60 is longer than any request waits")
        }
        if let catalog {
            do { _ = try Catalog.load(file: catalog) } catch let error as CanopyError { throw ValidationError(error.message) }
        }
    }

    func run() async throws {
        let logger = serve.logger()
        var settings = CareServiceSettings(directory: serve.directory, runner: try serve.runner(), metrics: try serve.metrics())
        settings.postgres = try database.postgres(serving: true)
        settings.clock = serve.worker.serviceClock
        if let catalog { settings.catalog = try Catalog.load(file: catalog) }
        settings.erasureSecondPass = .seconds(erasureSecondPass)
        let context = serve.common.busContext()
        guard
            let services = try await buildUnlessStopped(
                logger: logger,
                { [settings] in
                    try await buildCareService(settings: settings, context: context, logger: logger)
                })
        else { return }
        try await runUntilShutdown(services, traces: serve.traces, logger: logger)
    }
}

struct CatalogCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "catalog", abstract: "Look things up in the species care catalog.", subcommands: [Search.self])

    struct Search: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Species whose common name, scientific name or family contains TEXT.",
            discussion: "Example: canopy-care catalog search \"swiss cheese\"")
        @Argument(help: "Part of a name or family, any case.") var text: String

        func run() async throws {
            let found = CareTools.catalog.search(text, limit: 100)
            guard !found.isEmpty else {
                print("no species matches '\(text)'; try part of a common name (\"fern\"), a genus or a family (\"araceae\")")
                return
            }
            var table = Table("SCIENTIFIC NAME", "COMMON NAME", "FAMILY", "LIGHT", "WATER DAYS", "PET-SAFE")
            for species in found {
                table.append([
                    species.scientificName, species.commonNames.first ?? "", species.family, species.profile.light.rawValue,
                    "\(species.profile.wateringIntervalDays)", species.profile.toxicToPets ? "no" : "yes",
                ])
            }
            print(table.render())
        }
    }
}

struct Plan: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the care tasks a species brings over the next days, in a time zone.",
        discussion: "Example: canopy-care plan --species \"Monstera deliciosa\" --days 30 --tz Europe/Berlin --time 09:00")

    @Option(help: "Scientific or common name (catalog lookup).") var species: String
    @Option(help: "Days ahead.") var days = 30
    @Option(help: "IANA time zone, e.g. Europe/Berlin.") var tz = TimeZone.current.identifier
    @Option(help: "Preferred local time, HH:MM.") var time = "09:00"
    @Flag(help: "The person lives south of the equator.") var southern = false

    func validate() throws {
        guard (1...366).contains(days) else { throw ValidationError("--days is 1 to 366") }
        guard minute != nil else { throw ValidationError("--time is HH:MM, e.g. 09:00") }
    }

    var minute: Int? {
        let parts = time.split(separator: ":").compactMap { Int($0) }
        guard parts.count == 2, (0..<24).contains(parts[0]), (0..<60).contains(parts[1]) else { return nil }
        return parts[0] * 60 + parts[1]
    }

    func run() async throws {
        do {
            let plan = try CareTools.plan(species: species, days: days, timeZone: tz, preferredMinute: minute!, southernHemisphere: southern)
            let zone = TimeZone(identifier: tz)!
            let format = Date.FormatStyle(date: .abbreviated, time: .shortened, timeZone: zone)
            var table = Table("DUE", "TASK", "OFFSET")
            for task in plan.tasks {
                table.append([task.due.formatted(format), task.kind.rawValue, zone.abbreviation(for: task.due) ?? ""])
            }
            print("\(plan.species.scientificName) (\(plan.species.commonNames.first ?? "")), \(days) days from now, \(tz):")
            print(table.render())
        } catch let error as CanopyError {
            throw CommandFailure(error.message)
        }
    }
}

struct Upcoming: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print a person's overdue and upcoming tasks (asks the running service).",
        discussion: "Example: canopy-care upcoming --user user-42 --days 7")

    @OptionGroup var common: CommonOptions
    @Option(help: "The person's user id.") var user: String
    @Option(help: "Days ahead.") var days = 7

    func run() async throws {
        let bus = try BusClient(
            configuration: try common.clientConfiguration(), context: ZMQContext(), logger: LogSetup.logger(label: "canopy-care", level: .error))
        defer { bus.close() }
        do {
            let reply = try await bus.call(Care.UpcomingTasks.self, .init(days: days), principal: user, timeout: .seconds(5))
            var table = Table("DUE (UTC)", "TASK", "STATE")
            for task in reply.overdue + reply.upcoming {
                table.append([
                    (task.snoozedUntil ?? task.due).formatted(.iso8601), task.title,
                    reply.overdue.contains(task) ? "overdue" : (task.snoozedUntil != nil ? "snoozed" : ""),
                ])
            }
            print(table.render())
        } catch let error as CanopyError {
            throw CommandFailure("\(error.message). Is canopy-care serving at \(common.endpoint)?")
        }
    }
}
