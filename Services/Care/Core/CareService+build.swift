import CanopyBus
import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation
import Logging
import ServiceLifecycle

/// Everything `canopy-care serve` can be told.
public struct CareServiceSettings: Sendable {
    /// Where the store lives (`<data-dir>/care`; the database is `care.sqlite` in it) when
    /// ``postgres`` is nil.
    public var directory: URL
    /// The PostgreSQL every replica shares (`--database-url`), or nil for SQLite.
    public var postgres: PostgresSettings?
    /// How the worker reaches its broker (endpoint, credit, heartbeats, CURVE keys).
    public var runner: ServiceRunner.Configuration
    /// Where `/metrics` and `/health` listen; `nil` for nowhere.
    public var metrics: ListenAddress?
    /// How often the outbox looks for follow-ups to deliver.
    public var outboxInterval: Duration = .seconds(1)
    /// The time the service goes by (`--clock`).
    public var clock: ServiceClock = .system
    /// The species care catalog: the shipped one, or an operator's (`--catalog FILE`).
    public var catalog: Catalog = .shipped
    /// How long after an account's deletion its second pass runs (`--erasure-second-pass`).
    public var erasureSecondPass: Duration = .seconds(60)

    /// - Parameters:
    ///   - directory: the store's directory.
    ///   - runner: the worker's bus settings.
    ///   - metrics: where `/metrics` and `/health` listen, `nil` for nowhere.
    public init(directory: URL, runner: ServiceRunner.Configuration, metrics: ListenAddress? = nil) {
        self.directory = directory
        self.runner = runner
        self.metrics = metrics
    }
}

/// Builds what `canopy-care serve` runs, in start order: the outbox's bus client, the outbox,
/// the bus worker, and the `/metrics` and `/health` listener when `settings` name one.
public func buildCareService(settings: CareServiceSettings, context: ZMQContext, logger: Logger) async throws -> [any Service] {
    try OperatingEndpoint.ensureFree(settings.metrics) // a taken port stops it before anything opens
    let bus = try BusClient(configuration: settings.runner.client, context: context, logger: logger)
    return try await makeCareService(settings: settings, bus: bus, logger: logger)
        .assembled(runner: settings.runner, bus: bus, metrics: settings.metrics, context: context, logger: logger)
}

/// canopy-care's parts: its handlers on its store (PostgreSQL when `settings` name one, else
/// SQLite in `settings.directory`), and the outbox that hands follow-ups to other services
/// through `bus`.
public func makeCareService(settings: CareServiceSettings, bus: any BusCalling, logger: Logger) async throws -> ServiceParts {
    let store: any CareStoring
    if let postgres = settings.postgres {
        store = try await PostgresCareStore.open(
            url: postgres.url, poolSize: postgres.poolSize, catalog: settings.catalog, waitingUpTo: postgres.wait, logger: logger)
    } else {
        try FileManager.default.createDirectory(at: settings.directory, withIntermediateDirectories: true)
        store = try SQLiteCareStore(path: settings.directory.appendingPathComponent("care.sqlite").path, catalog: settings.catalog)
    }
    let library = CareLibrary(store: store, clock: settings.clock, erasureSecondPass: settings.erasureSecondPass)
    let outbox = Outbox(library: library, bus: bus, interval: settings.outboxInterval, logger: logger)
    return ServiceParts(
        handlers: CareService(library: library), background: [outbox],
        onShutdown: (store as? PostgresCareStore).map { [$0.database.beginShutdown] } ?? [])
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
    public static func plan(
        species: String, days: Int, timeZone: String, preferredMinute: Int = 540, southernHemisphere: Bool = false,
        from start: Date = Date()
    ) throws -> (species: Care.Species, tasks: [(kind: Care.TaskKind, due: Date)]) {
        guard let found = Catalog.shipped.lookup(species) ?? Catalog.shipped.search(species, limit: 1).first else {
            throw CanopyError(.notFound, "no species matches '\(species)'; try canopy-care catalog search \(species)")
        }
        let scheduler = try Scheduler(
            preferences: Care.Preferences(timeZone: timeZone, preferredMinute: preferredMinute, southernHemisphere: southernHemisphere))
        return (found, scheduler.plan(profile: found.profile, from: start, days: days))
    }
}
