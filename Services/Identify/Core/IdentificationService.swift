import CanopyBus
import CanopyImaging
import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation
import Logging
import ServiceLifecycle

/// canopy-identify on the bus: one handler per operation of ``Identification``.
public struct IdentificationService: BusService {
    public let name = Identification.service
    let library: IdentificationLibrary
    /// For `identifications.quota`; `nil` when Pl@ntNet is not in use.
    let plantNet: PlantNetProvider?

    public func register(_ handlers: inout OperationHandlers) {
        let (library, plantNet) = (self.library, self.plantNet)
        handlers.on(Identification.Submit.self) { request, owner, _ in try await library.submit(request, owner: owner) }
        handlers.on(Identification.Accept.self) { request, owner, _ in try await library.accept(request, owner: owner) }
        handlers.on(Identification.Get.self) { request, owner, _ in try await library.get(request.id, owner: owner) }
        handlers.onBlocking(Identification.History.self) { request, owner, _ in try library.history(request, owner: owner) }
        handlers.onBlocking(Identification.ForgetPerson.self) { _, owner, _ in
            try library.forget(owner: owner)
            return Empty()
        }
        handlers.onBlocking(Identification.ForgetPlant.self) { request, owner, _ in
            try library.forget(plantID: request.plantID, owner: owner)
            return Empty()
        }
        handlers.on(Identification.AddReferences.self) { request, _ in
            let total = try await offThePool {
                try IdentificationTools(store: library.store).addReferences(
                    .init(scientificName: request.scientificName, commonNames: request.commonNames, family: request.family, gbifID: request.gbifID),
                    photos: request.data.map { [UInt8]($0) })
            }
            return .init(scientificName: request.scientificName, photos: total)
        }
        handlers.onBlocking(Identification.Quota.self) { _, _ in
            guard let plantNet else {
                return .init(provider: library.provider.kind, remaining: nil, dailyLimit: 0, resetsAt: nil, calls: 0)
            }
            let quota = try plantNet.quota()
            return .init(
                provider: library.provider.kind, remaining: quota.remaining, dailyLimit: plantNet.settings.dailyLimit,
                resetsAt: quota.resetsAt, calls: plantNet.calls.load(ordering: .relaxed))
        }
    }
}

/// Everything `canopy-identify serve` can be told.
public struct IdentificationServiceSettings: Sendable {
    /// Where the store lives (`<data-dir>/identify`; the database is `identify.sqlite` in it).
    public var directory: URL
    /// How the worker reaches its broker (endpoint, credit, heartbeats, CURVE keys).
    public var runner: ServiceRunner.Configuration
    /// Where `/metrics` and `/health` listen; `nil` for nowhere.
    public var metrics: ListenAddress?
    /// Which provider answers.
    public var provider: Identification.Provider = .reference
    /// Pl@ntNet's settings; required for `plantnet` and `hybrid`.
    public var plantNet: PlantNetSettings?
    /// With `hybrid`: a best reference score at or above this skips Pl@ntNet.
    public var hybridThreshold = 0.8
    /// The time the service goes by (`--clock`).
    public var clock: ServiceClock = .system
    /// The PostgreSQL every replica shares (`--database-url`), or nil for SQLite in ``directory``.
    public var postgres: PostgresSettings?
    /// How often it clears what replicas that went away mid-submission left (and at start).
    public var sweepInterval: Duration = .seconds(30)

    /// - Parameters:
    ///   - directory: the store's directory.
    ///   - runner: the worker's bus settings.
    ///   - metrics: where `/metrics` and `/health` listen, `nil` for nowhere.
    public init(directory: URL, runner: ServiceRunner.Configuration, metrics: ListenAddress? = nil) {
        self.directory = directory
        self.runner = runner
        self.metrics = metrics
    }

    /// The store's path.
    public var databasePath: String { directory.appendingPathComponent("identify.sqlite").path }
}

/// Builds what `canopy-identify serve` runs, in start order: the bus client it asks
/// canopy-images and canopy-care with, the bus worker, and the `/metrics` and `/health`
/// listener when `settings` name one.
public func buildIdentificationService(settings: IdentificationServiceSettings, context: ZMQContext, logger: Logger) async throws -> [any Service] {
    try OperatingEndpoint.ensureFree(settings.metrics) // a taken port stops it before anything opens
    let bus = try BusClient(configuration: settings.runner.client, context: context, logger: logger)
    return try await makeIdentificationService(settings: settings, bus: bus, logger: logger)
        .assembled(runner: settings.runner, bus: bus, metrics: settings.metrics, context: context, logger: logger)
}

/// canopy-identify's parts: its handlers on its store (PostgreSQL when `settings` name one,
/// else SQLite in `settings.directory`), with the provider `settings` name, calling
/// canopy-images and canopy-care through `bus`.
public func makeIdentificationService(settings: IdentificationServiceSettings, bus: any BusCalling, logger: Logger) async throws -> ServiceParts {
    let store = try await IdentificationTools.openStore(databasePath: settings.databasePath, postgres: settings.postgres, logger: logger)
    let reference = ReferenceProvider(store: store)
    let metrics = IdentificationMetrics()
    var plantNet: PlantNetProvider?
    if settings.provider != .reference {
        guard let plantNetSettings = settings.plantNet, !plantNetSettings.apiKey.isEmpty else {
            throw CanopyError(
                .badRequest,
                "the \(settings.provider.rawValue) provider needs a Pl@ntNet API key: set --plantnet-key or CANOPY_PLANTNET_KEY, or --plantnet-key-file (CANOPY_PLANTNET_KEY_FILE) (or use --provider reference)"
            )
        }
        plantNet = PlantNetProvider(settings: plantNetSettings, store: store, metrics: metrics, logger: logger)
    }
    let provider: any IdentificationProvider =
        switch settings.provider {
        case .reference: reference
        case .plantnet: plantNet!
        case .hybrid: HybridProvider(reference: reference, plantNet: plantNet!, threshold: settings.hybridThreshold)
        }
    let library = IdentificationLibrary(store: store, provider: provider, bus: BusPeers(client: bus), metrics: metrics, clock: settings.clock)
    return ServiceParts(
        handlers: IdentificationService(library: library, plantNet: plantNet),
        background: [SubmissionSweep(library: library, interval: settings.sweepInterval, logger: logger)],
        onShutdown: (store as? PostgresIdentificationStore).map { [$0.database.beginShutdown] } ?? [])
}

/// Clears, at start and every `interval`, what submissions left when the process
/// identifying them went away (``IdentificationLibrary/sweepAbandoned(now:logger:)``): with
/// SQLite, a crash of this service; with replicas, any replica killed mid-submission.
struct SubmissionSweep: Service {
    let library: IdentificationLibrary
    let interval: Duration
    let logger: Logger

    func run() async throws {
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                do {
                    let cleared = try await library.sweepAbandoned(logger: logger)
                    if cleared > 0 { logger.notice("identify.submissions.cleared", metadata: ["identify.submissions": "\(cleared)"]) }
                } catch {
                    logger.warning("identify.submission.sweep.failed", metadata: ["error": "\(error)"])
                }
                try? await Task.sleep(for: interval)
            }
        }
    }
}

/// The operator's tools on the store, for the CLI: reference photos and one-shot matching.
public struct IdentificationTools: Sendable {
    let store: any IdentificationStoring
    /// The matcher, its index kept between matches until the references change.
    private let matcher: ReferenceProvider

    /// The tools on a store already open (the service's own, for `references.add`).
    init(store: any IdentificationStoring) {
        self.store = store
        matcher = ReferenceProvider(store: store)
    }

    /// Opens (or creates) the store at `path`.
    public init(databasePath path: String) throws {
        try FileManager.default.createDirectory(at: URL(fileURLWithPath: path).deletingLastPathComponent(), withIntermediateDirectories: true)
        self.init(store: try SQLiteIdentificationStore(path: path))
    }

    /// Opens the store `postgres` names, or else the SQLite file at `databasePath`.
    public init(databasePath: String, postgres: PostgresSettings?, logger: Logger) async throws {
        self.init(store: try await Self.openStore(databasePath: databasePath, postgres: postgres, logger: logger))
    }

    static func openStore(databasePath: String, postgres: PostgresSettings?, logger: Logger) async throws -> any IdentificationStoring {
        if let postgres {
            return try await PostgresIdentificationStore.open(url: postgres.url, poolSize: postgres.poolSize, waitingUpTo: postgres.wait, logger: logger)
        }
        try FileManager.default.createDirectory(at: URL(fileURLWithPath: databasePath).deletingLastPathComponent(), withIntermediateDirectories: true)
        return try SQLiteIdentificationStore(path: databasePath)
    }

    /// A species as the operator names it: "Monstera deliciosa Liebm." (authorship optional).
    public struct SpeciesName: Sendable {
        public var scientificName: String
        public var commonNames: [String]
        public var genus: String?
        public var family: String
        public var gbifID: Int?

        public init(scientificName: String, commonNames: [String] = [], genus: String? = nil, family: String = "", gbifID: Int? = nil) {
            self.scientificName = scientificName
            self.commonNames = commonNames
            self.genus = genus
            self.family = family
            self.gbifID = gbifID
        }

        /// Genus and epithet (the first two words, or one for a genus), then the authorship.
        var parts: (withoutAuthor: String, authorship: String) {
            let words = scientificName.split(separator: " ").map(String.init)
            let nameWords = words.count >= 2 && words[1].first?.isLowercase == true ? 2 : 1
            return (words.prefix(nameWords).joined(separator: " "), words.dropFirst(nameWords).joined(separator: " "))
        }
    }

    /// Adds reference photos (encoded images) of a species; their features are computed here.
    /// Returns how many photos the species now has.
    @discardableResult
    public func addReferences(_ species: SpeciesName, photos: [[UInt8]], progress: (Int) -> Void = { _ in }) throws -> Int {
        try Field.text(species.scientificName, "species", maximumBytes: Care.Limits.scientificNameBytes, required: true)
        let (withoutAuthor, authorship) = species.parts
        var computed: [(sha256: String, features: PhotoFeatures)] = []
        for (index, bytes) in photos.enumerated() {
            computed.append((IdentificationLibrary.sha256(bytes), try PhotoFeatures.compute(from: bytes)))
            progress(index + 1)
        }
        let entry = ReferenceSpecies(
            scientificName: species.scientificName, withoutAuthor: withoutAuthor, authorship: authorship,
            genus: species.genus ?? String(withoutAuthor.split(separator: " ").first ?? ""), family: species.family,
            commonNames: species.commonNames, gbifID: species.gbifID)
        try store.addReferences(entry, photos: computed)
        return try store.referenceSpecies().first { $0.species.scientificName == species.scientificName }?.photos ?? 0
    }

    /// Removes a species (by its name with or without authorship); `false` when unknown.
    public func removeReferences(_ scientificName: String) throws -> Bool {
        try store.removeReferences(scientificName: scientificName)
    }

    /// Every reference species: name, common name, family, GBIF id and photo count.
    public func references() throws -> [(scientificName: String, commonName: String, family: String, gbifID: Int?, photos: Int)] {
        try store.referenceSpecies().map { ($0.species.scientificName, $0.species.commonNames.first ?? "", $0.species.family, $0.species.gbifID, $0.photos) }
    }

    /// Matches photo files against the reference photos, as the `reference` provider does
    /// (without anyone's own plants): ranked candidates, none when no species is near enough
    /// (no good match) unless `refusingFar` is false.
    public func match(photos: [[UInt8]], refusingFar: Bool = true) throws -> [Identification.Candidate] {
        let features = try photos.map { try PhotoFeatures.compute(from: $0) }
        return try matcher.references().candidates(for: features, neighbours: matcher.neighbours, refusingFar: refusingFar).ranked()
    }

    /// Pl@ntNet's quota as last reported.
    public func quota() throws -> (remaining: Int?, resetsAt: Date?) {
        var state = try store.quota(provider: PlantNetProvider.quotaKey)
        if let resetsAt = state.resetsAt, resetsAt <= Date() { state = .init() }
        return (state.remaining, state.resetsAt)
    }
}
