import ArgumentParser
import CanopyBus
import CanopyIdentify
import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation
import Logging

@main
struct IdentifyCommand: MainCommand {
    static let configuration = CommandConfiguration(
        commandName: "canopy-identify",
        abstract: "Canopy's identification service: from photos of a plant to ranked species, and into the collection.",
        discussion: """
            Examples:
              canopy-identify serve --endpoint tcp://127.0.0.1:5555 --data-dir ./.canopy --provider reference
              canopy-identify reference add --species "Monstera deliciosa Liebm." --common-name "Swiss cheese plant" --family Araceae leaf1.jpg leaf2.jpg
              canopy-identify reference list
              canopy-identify submit photo.jpg --organ leaf
              canopy-identify quota
              canopy-identify health --metrics-bind 127.0.0.1:9403
            """,
        subcommands: [ServeIdentify.self, SubmitCommand.self, ReferenceCommand.self, QuotaCommand.self, HealthCommand<CanopyIdentify>.self])
}

/// What the shared subcommands (`health`, `serve`'s options) know of canopy-identify.
enum CanopyIdentify: ServiceExecutable {
    static let name = "canopy-identify"
    static let directoryName = "identify"
    static let defaultListener = OperatingOptions.Defaults.identify
}

/// The store option every local command shares: the data directory, or PostgreSQL.
struct DataDirectory: ParsableArguments {
    @Option(help: ArgumentHelp("Data directory; the store is <dir>/identify/identify.sqlite. Env: CANOPY_DATA_DIR.", valueName: "dir"))
    var dataDir: String = Environment.string("CANOPY_DATA_DIR") ?? "./.canopy"
    @OptionGroup var database: DatabaseOptions

    var directory: URL { URL(fileURLWithPath: dataDir).appendingPathComponent("identify", isDirectory: true) }

    func tools() async throws -> IdentificationTools {
        try await IdentificationTools(
            databasePath: directory.appendingPathComponent("identify.sqlite").path, postgres: try database.postgres(),
            logger: Logger(label: "canopy-identify"))
    }
}

struct ServeIdentify: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve", abstract: "Serve identifications.* on the bus until SIGTERM or SIGINT.",
        discussion: """
            Example: canopy-identify serve --endpoint tcp://127.0.0.1:5555 --provider hybrid --plantnet-key KEY
            The reference provider needs no account; plantnet and hybrid need a Pl@ntNet API key (https://my.plantnet.org).
            """)

    @OptionGroup var serve: ServeOptions<CanopyIdentify>
    @OptionGroup var database: DatabaseOptions
    @Option(help: ArgumentHelp("Who identifies: reference, plantnet or hybrid. Env: CANOPY_IDENTIFY_PROVIDER.", valueName: "name"))
    var provider: String = Environment.string("CANOPY_IDENTIFY_PROVIDER") ?? "reference"
    @Option(help: ArgumentHelp("Pl@ntNet API key (never logged). Env: CANOPY_PLANTNET_KEY.", valueName: "key"))
    var plantnetKey: String?

    @Option(
        help: ArgumentHelp(
            "A file holding the Pl@ntNet API key (a container secret); an empty file means none. Env: CANOPY_PLANTNET_KEY_FILE.", valueName: "file"))
    var plantnetKeyFile: String? = Environment.string("CANOPY_PLANTNET_KEY_FILE")

    /// The key from the flag, the variable, or the file, in that order (nil or empty: none).
    func plantNetKey() throws -> String? {
        if let key = plantnetKey ?? Environment.string("CANOPY_PLANTNET_KEY"), !key.isEmpty { return key }
        guard let plantnetKeyFile else { return nil }
        guard let text = try? String(contentsOfFile: plantnetKeyFile, encoding: .utf8) else {
            throw CommandFailure("cannot read --plantnet-key-file \(plantnetKeyFile); check the path and its permissions")
        }
        let key = text.trimmingCharacters(in: .whitespacesAndNewlines)
        return key.isEmpty ? nil : key
    }
    @Option(help: ArgumentHelp("Pl@ntNet API base URL. Env: CANOPY_PLANTNET_URL.", valueName: "url"))
    var plantnetURL: String = Environment.string("CANOPY_PLANTNET_URL") ?? "https://my-api.plantnet.org"
    @Option(help: ArgumentHelp("Pl@ntNet project (flora): all, weurope, ... Env: CANOPY_PLANTNET_PROJECT.", valueName: "project"))
    var plantnetProject: String = Environment.string("CANOPY_PLANTNET_PROJECT") ?? "all"
    @Option(help: ArgumentHelp("Language of common names. Env: CANOPY_PLANTNET_LANG.", valueName: "code"))
    var plantnetLang: String = Environment.string("CANOPY_PLANTNET_LANG") ?? "en"
    @Option(help: ArgumentHelp("Pl@ntNet's daily allowance (500 on the free plan). Env: CANOPY_PLANTNET_DAILY_LIMIT.", valueName: "n"))
    var plantnetDailyLimit: Int = Environment.string("CANOPY_PLANTNET_DAILY_LIMIT").flatMap(Int.init) ?? 500
    @Option(help: ArgumentHelp("hybrid: a best reference score at or above this skips Pl@ntNet (0 to 1). Env: CANOPY_HYBRID_THRESHOLD.", valueName: "score"))
    var hybridThreshold: Double = Environment.string("CANOPY_HYBRID_THRESHOLD").flatMap(Double.init) ?? 0.8

    func validate() throws {
        guard Identification.Provider(rawValue: provider) != nil else {
            throw ValidationError("--provider is reference, plantnet or hybrid; got '\(provider)'")
        }
        guard (0...1).contains(hybridThreshold) else { throw ValidationError("--hybrid-threshold is from 0 to 1") }
        guard (1...1_000_000).contains(plantnetDailyLimit) else { throw ValidationError("--plantnet-daily-limit is from 1 to 1000000") }
        guard URL(string: plantnetURL)?.scheme.map({ ["http", "https"].contains($0) }) == true else {
            throw ValidationError("--plantnet-url is an http(s) URL")
        }
    }

    func run() async throws {
        let logger = serve.logger()
        var settings = IdentificationServiceSettings(
            directory: serve.directory, runner: try serve.runner(),
            metrics: try serve.metrics())
        settings.provider = Identification.Provider(rawValue: provider)!
        settings.hybridThreshold = hybridThreshold
        if let key = try plantNetKey() {
            var plantNet = PlantNetSettings(apiKey: key)
            plantNet.baseURL = plantnetURL
            plantNet.project = plantnetProject
            plantNet.language = plantnetLang
            plantNet.dailyLimit = plantnetDailyLimit
            settings.plantNet = plantNet
        }
        settings.postgres = try database.postgres(serving: true)
        do {
            settings.clock = serve.worker.serviceClock
            let context = serve.common.busContext()
            guard
                let services = try await buildUnlessStopped(
                    logger: logger,
                    { [settings] in
                        try await buildIdentificationService(settings: settings, context: context, logger: logger)
                    })
            else { return }
            try await runUntilShutdown(services, traces: serve.traces, logger: logger)
        } catch let error as CanopyError {
            throw CommandFailure(error.message)
        }
    }
}

/// Reads photo files, saying which one is missing.
func readPhotos(_ paths: [String]) throws -> [[UInt8]] {
    try paths.map { path in
        guard let data = FileManager.default.contents(atPath: path) else {
            throw CommandFailure("cannot read \(path); give the path of a JPEG, PNG, WebP or HEIF photo")
        }
        return [UInt8](data)
    }
}

struct SubmitCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "submit",
        abstract: "Identify photos of one plant against the reference photos in the local store, offline, and print the candidates.",
        discussion: "Example: canopy-identify submit leaf.jpg flower.jpg --organ leaf --organ flower")

    @OptionGroup var data: DataDirectory
    @Argument(help: "1 to 5 photos of the same plant.") var photos: [String]
    @Option(help: "What each photo shows (leaf, flower, fruit, bark, auto), once per photo or once for all.") var organ: [String] = ["auto"]
    @Flag(help: "List the nearest species even when none is near enough to name (no good match).") var all = false

    func validate() throws {
        guard (1...Identification.Limits.photos).contains(photos.count) else { throw ValidationError("give 1 to \(Identification.Limits.photos) photos") }
        guard organ.count == 1 || organ.count == photos.count else { throw ValidationError("give --organ once, or once per photo") }
        for name in organ where Identification.Organ(rawValue: name) == nil {
            throw ValidationError("--organ is leaf, flower, fruit, bark or auto; got '\(name)'")
        }
    }

    func run() async throws {
        let tools = try await data.tools()
        guard try !tools.references().isEmpty else {
            throw CommandFailure(
                "the store at \(data.directory.path) has no reference photos; add some with canopy-identify reference add --species NAME PHOTO...")
        }
        let candidates: [Identification.Candidate]
        do {
            candidates = try tools.match(photos: try readPhotos(photos), refusingFar: !all)
        } catch let error as CanopyError {
            throw CommandFailure(error.message)
        }
        guard !candidates.isEmpty else {
            print("no good match: no reference species looks near enough to name (--all lists the nearest anyway)")
            return
        }
        var table = Table("RANK", "SCORE", "SCIENTIFIC NAME", "COMMON NAME", "FAMILY")
        for candidate in candidates {
            table.append([
                "\(candidate.rank)", String(format: "%.3f", candidate.score), candidate.scientificName, candidate.commonNames.first ?? "", candidate.family,
            ])
        }
        print(table.render())
        print("Scores are confidences: of first candidates scored about 0.8, about 8 in 10 are right (docs/IDENTIFICATION.md).")
    }
}

struct ReferenceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "reference", abstract: "Manage the labelled reference photos the reference provider matches against.",
        discussion: "Example: canopy-identify reference add --species \"Monstera deliciosa Liebm.\" leaf1.jpg leaf2.jpg",
        subcommands: [Add.self, List.self, Remove.self])

    struct Add: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Add photos of a species (features are computed and stored; the photos themselves are not kept).",
            discussion:
                "Example: canopy-identify reference add --species \"Monstera deliciosa Liebm.\" --common-name \"Swiss cheese plant\" --family Araceae --gbif 2868241 a.jpg b.jpg"
        )

        @OptionGroup var data: DataDirectory
        @Option(help: "Scientific name, with authorship if known.") var species: String
        @Option(help: "A common name (repeatable).") var commonName: [String] = []
        @Option(help: "The family.") var family = ""
        @Option(help: "The GBIF species id.") var gbif: Int?
        @Argument(help: "Photos of the species.") var photos: [String]

        func run() async throws {
            let tools = try await data.tools()
            let bytes = try readPhotos(photos)
            do {
                let total = try tools.addReferences(.init(scientificName: species, commonNames: commonName, family: family, gbifID: gbif), photos: bytes) {
                    done in
                    FileHandle.standardError.write(Data("\rcomputing features: \(done)/\(bytes.count)".utf8))
                }
                FileHandle.standardError.write(Data("\n".utf8))
                print("\(species): \(total) reference photo(s)")
            } catch let error as CanopyError {
                throw CommandFailure("\(error.message); nothing was added")
            }
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the reference species.", discussion: "Example: canopy-identify reference list")
        @OptionGroup var data: DataDirectory

        func run() async throws {
            let species = try await data.tools().references()
            guard !species.isEmpty else {
                print("no reference photos yet; add some with canopy-identify reference add --species NAME PHOTO...")
                return
            }
            var table = Table("SCIENTIFIC NAME", "COMMON NAME", "FAMILY", "GBIF", "PHOTOS")
            for entry in species {
                table.append([entry.scientificName, entry.commonName, entry.family, entry.gbifID.map(String.init) ?? "", "\(entry.photos)"])
            }
            print(table.render())
        }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove a species and its reference photos.",
            discussion: "Example: canopy-identify reference remove --species \"Monstera deliciosa\"")
        @OptionGroup var data: DataDirectory
        @Option(help: "Scientific name, with or without authorship.") var species: String

        func run() async throws {
            guard try await data.tools().removeReferences(species) else {
                throw CommandFailure("no reference species '\(species)'; canopy-identify reference list shows them")
            }
            print("removed \(species)")
        }
    }
}

struct QuotaCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "quota", abstract: "Print what is left of Pl@ntNet's daily quota, as Pl@ntNet last reported it.",
        discussion: "Example: canopy-identify quota --data-dir ./.canopy")

    @OptionGroup var data: DataDirectory

    func run() async throws {
        let quota = try await data.tools().quota()
        var table = Table("PROVIDER", "REMAINING TODAY", "RESETS AT")
        table.append(["plantnet", quota.remaining.map(String.init) ?? "not called yet today", quota.resetsAt?.formatted(.iso8601) ?? ""])
        print(table.render())
    }
}
