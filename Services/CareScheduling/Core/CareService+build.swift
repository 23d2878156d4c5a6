import CanopyBus
import CanopyMessages
import Foundation
import Logging
import ServiceLifecycle

/// Builds what `canopy-care serve` runs: the bus worker and the outbox.
public func buildCareService(dataDirectory: URL, runner: ServiceRunner.Configuration, context: ZMQContext, logger: Logger) throws -> [any Service] {
    try FileManager.default.createDirectory(at: dataDirectory, withIntermediateDirectories: true)
    let library = CareLibrary(store: try CareStore(path: dataDirectory.appendingPathComponent("care.sqlite").path))
    let worker = ServiceRunner(service: CareService(library: library), configuration: runner, context: context, logger: logger)
    var client = BusClient.Configuration(endpoint: runner.endpoint)
    client.curve = runner.curve // the outbox calls other services with the worker's key
    let bus = try BusClient(configuration: client, context: context, logger: logger)
    // The client is a service of its own, listed before the outbox: closed after it stops.
    return [worker, bus, Outbox(library: library, bus: bus, interval: .seconds(1), logger: logger)]
}

/// One-shot scheduling for the CLI.
public enum CareTools {
    /// The species catalog.
    public static var catalog: Catalog { .shipped }

    /// How many tasks `profiles` (one person's plants) bring over `days` from `start`: the
    /// scheduler's day table is built once for all of them.
    public static func plan(profiles: [Care.Profile], preferences: Care.Preferences, from start: Date, days: Int) throws -> Int {
        let scheduler = try Scheduler(preferences: preferences)
        let table = DayTable(scheduler, from: start, days: days)
        return profiles.reduce(0) { $0 + scheduler.plan(profile: $1, table: table).count }
    }

    /// Every task a species brings over `days` from `start`, for a person in `timeZone`.
    public static func plan(species: String, days: Int, timeZone: String, preferredMinute: Int = 540, southernHemisphere: Bool = false,
                            from start: Date = Date()) throws -> (species: Care.Species, tasks: [(kind: Care.TaskKind, due: Date)]) {
        guard let found = Catalog.shipped.lookup(species) ?? Catalog.shipped.search(species, limit: 1).first else {
            throw CanopyError(.notFound, "no species matches '\(species)'; try canopy-care catalog search \(species)")
        }
        let scheduler = try Scheduler(preferences: Care.Preferences(timeZone: timeZone, preferredMinute: preferredMinute, southernHemisphere: southernHemisphere))
        return (found, scheduler.plan(profile: found.profile, from: start, days: days))
    }
}
