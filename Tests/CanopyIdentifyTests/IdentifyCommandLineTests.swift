import CanopyBus
import CanopyCare
import CanopyImages
import CanopyImaging
import CanopyMessages
import CanopySamples
import CanopyTesting
import Foundation
import Testing

/// `canopy-identify` as an operator runs it: reference photos in, one-shot matching offline.
@Suite(.serialized)
struct IdentifyCommandLineTests {
    func run(_ arguments: [String], environment: [String: String] = [:]) async throws -> ProcessResult {
        try await runExecutable("canopy-identify", arguments, environment: environment, limit: 60)
    }

    @Test func everySubcommandShowsAnExampleAndEveryServeOptionItsVariable() async throws {
        let subcommands = [
            [], ["serve"], ["submit"], ["reference"], ["reference", "add"], ["reference", "list"], ["reference", "remove"], ["quota"], ["health"],
        ]
        #expect(try await helpProblems("canopy-identify", subcommands: subcommands) == [])
    }

    @Test func referencesGoInAndAPhotoIsIdentifiedOfflineAsATable() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-identify-cli-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        func file(_ species: Int, _ seed: Int) throws -> String {
            let path = directory.appendingPathComponent("s\(species)-\(seed).jpg").path
            try Data(try SyntheticPlant.species(species).photo(seed: seed)).write(to: URL(fileURLWithPath: path))
            return path
        }
        let dataDir = ["--data-dir", directory.appendingPathComponent("data").path]

        let empty = try await run(["submit", try file(0, 50)] + dataDir)
        #expect(empty.status != 0 && empty.errors.contains("reference add"), "\(empty.errors)")

        for species in 0..<4 {
            let added = try await run(
                [
                    "reference", "add", "--species", "Testus species\(species) Author", "--common-name", "Tester \(species)",
                    "--family", "Testaceae", "--gbif", "\(500 + species)", try file(species, 1), try file(species, 2),
                ] + dataDir)
            #expect(added.status == 0, "\(added.errors)")
            #expect(added.output.contains("2 reference photo(s)") && added.errors.contains("computing features: 2/2"))
        }
        let list = try await run(["reference", "list"] + dataDir)
        let rows = list.output.split(separator: "\n")
        #expect(rows.first?.hasPrefix("SCIENTIFIC NAME") == true && rows.count == 5)
        #expect(rows.dropFirst().first?.contains("Testus species0 Author  Tester 0") == true, "\(list.output)")

        let submitted = try await run(["submit", try file(2, 60), "--organ", "leaf"] + dataDir)
        #expect(submitted.status == 0, "\(submitted.errors)")
        let lines = submitted.output.split(separator: "\n")
        #expect(lines.first?.hasPrefix("RANK  SCORE") == true)
        #expect(lines.dropFirst().first?.contains("Testus species2 Author") == true, "\(submitted.output)")

        let removed = try await run(["reference", "remove", "--species", "Testus species2"] + dataDir)
        #expect(removed.status == 0)
        #expect(!(try await run(["reference", "list"] + dataDir)).output.contains("species2"))
        let unknown = try await run(["reference", "remove", "--species", "Nothing here"] + dataDir)
        #expect(unknown.status != 0 && unknown.errors.contains("reference list"))

        let broken = try await run(["reference", "add", "--species", "Broken one", directory.appendingPathComponent("missing.jpg").path] + dataDir)
        #expect(broken.status != 0 && broken.errors.contains("cannot read"))
        let notPhoto = directory.appendingPathComponent("text.jpg")
        try Data("hello".utf8).write(to: notPhoto)
        let refused = try await run(["reference", "add", "--species", "Broken one", notPhoto.path] + dataDir)
        #expect(refused.status != 0 && refused.errors.contains("nothing was added"))

        // The one photo limit, offline too: a PNG claiming 30000x30000 pixels is refused by its
        // header, before any decoding, by reference add and by submit.
        let bomb = directory.appendingPathComponent("bomb.png")
        try Data(PNGClaim.bytes(width: 30_000, height: 30_000)).write(to: bomb)
        let huge = try await run(["reference", "add", "--species", "Huge one", bomb.path] + dataDir)
        #expect(huge.status != 0 && huge.errors.contains("megapixels"), "\(huge.errors)")
        let hugeSubmit = try await run(["submit", bomb.path] + dataDir)
        #expect(hugeSubmit.status != 0 && hugeSubmit.errors.contains("megapixels"), "\(hugeSubmit.errors)")
        #expect(!(try await run(["reference", "list"] + dataDir)).output.contains("Huge one"))

        let quota = try await run(["quota"] + dataDir)
        #expect(quota.status == 0 && quota.output.contains("not called yet today"))
    }

    @Test func servingPlantNetWithoutAKeySaysWhatToSet() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-identify-nokey-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let result = try await run([
            "serve", "--provider", "plantnet", "--endpoint", "tcp://127.0.0.1:1", "--metrics-bind", "off", "--data-dir", directory.path,
        ])
        #expect(result.status != 0 && result.errors.contains("CANOPY_PLANTNET_KEY"), "\(result.errors)")
        let bad = try await run(["serve", "--provider", "oracle"])
        #expect(bad.status != 0 && bad.errors.contains("reference, plantnet or hybrid"))
    }

    /// The key as a container gets it: a file (`--plantnet-key-file`, a compose secret). A
    /// missing file is named, an empty one means no key, and a key read from the file is the
    /// one Pl@ntNet (a local server that checks it as the real API does) receives.
    @Test func serveReadsThePlantNetKeyFromAFile() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-identify-keyfile-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let serve = ["serve", "--provider", "plantnet", "--metrics-bind", "off", "--data-dir", directory.appendingPathComponent("identify").path]
        let nowhere = ["--endpoint", "tcp://127.0.0.1:1"]

        let missing = try await run(serve + nowhere + ["--plantnet-key-file", directory.appendingPathComponent("missing.key").path])
        #expect(missing.status != 0 && missing.errors.contains("cannot read --plantnet-key-file"), "\(missing.errors)")
        let empty = directory.appendingPathComponent("empty.key")
        try Data().write(to: empty)
        let none = try await run(serve + nowhere + ["--plantnet-key-file", empty.path])
        #expect(none.status != 0 && none.errors.contains("CANOPY_PLANTNET_KEY_FILE"), "\(none.errors)")

        let keyFile = directory.appendingPathComponent("plantnet.key")
        try Data("\(FakePlantNet.key)\n".utf8).write(to: keyFile)
        try await withLiveBus { bus in
            let images = ImageServiceSettings(directory: directory.appendingPathComponent("images"), runner: bus.runnerConfiguration(credit: 8))
            bus.run(try await buildImageService(settings: images, context: bus.context, logger: bus.logger))
            let care = CareServiceSettings(directory: directory.appendingPathComponent("care"), runner: bus.runnerConfiguration())
            bus.run(try await buildCareService(settings: care, context: bus.context, logger: bus.logger))
            let plantNet = FakePlantNet()
            bus.run([plantNet.application])

            let process = Process()
            process.executableURL = try LiveBus.executable("canopy-identify")
            process.arguments =
                serve + [
                    "--endpoint", bus.endpoint, "--plantnet-key-file", keyFile.path, "--plantnet-url", try await plantNet.baseURL(),
                    "--heartbeat-ms", "100", "--liveness", "\(bus.configuration.liveness)", "--log-level", "critical",
                ]
            var environment = ProcessInfo.processInfo.environment
            environment["CANOPY_PLANTNET_KEY"] = nil
            process.environment = environment
            try process.run()
            defer {
                process.terminate()
                process.waitUntilExit()
            }
            for service in [Images.service, Care.service, Identification.service] {
                try await bus.waitForWorkers(1, service: service)
            }
            let client = try bus.client(timeout: .seconds(60))
            let photo = try SyntheticPlant.species(1).photo(seed: 7)
            let record = try await client.call(
                Identification.Submit.self, .init(photos: [.init(organ: .leaf)], data: [Data(photo)]),
                principal: "alice", timeout: .seconds(60))
            #expect(record.provider == .plantnet && !record.results.isEmpty)
            #expect(plantNet.calls.map { $0.query["api-key"] } == [FakePlantNet.key], "the key from the file, trimmed")
        }
    }
}
