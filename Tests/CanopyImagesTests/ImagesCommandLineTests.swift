import CanopyBus
import CanopyMessages
import CanopyTesting
import Foundation
import Testing

@testable import CanopyImages

/// `canopy-images` as an operator runs it.
@Suite(.serialized)
struct ImagesCommandLineTests {
    func run(_ arguments: [String], environment: [String: String] = [:]) async throws -> ProcessResult {
        try await runExecutable("canopy-images", arguments, environment: environment)
    }

    @Test func thumbnailWritesAStrippedSquareOfTheAskedSize() async throws {
        let directory = Fixture.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let input = directory.appendingPathComponent("monstera.jpg")
        try Data(Fixture.image { $0.gps = true }).write(to: input)
        let output = directory.appendingPathComponent("thumb.webp")
        let result = try await run(["thumbnail", input.path, "-o", output.path, "--size", "96", "--format", "webp"])
        #expect(result.status == 0, "\(result.errors)")
        #expect(result.output.contains("96x96"))
        let bytes = [UInt8](try Data(contentsOf: output))
        #expect(ImageKind(sniffing: bytes) == .webp)
        #expect(!Fixture.header(bytes).hasGPS)
    }

    @Test func paletteprintsSwatchesAsATable() async throws {
        let directory = Fixture.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let input = directory.appendingPathComponent("photo.png")
        try Data(Fixture.png).write(to: input)
        let result = try await run(["palette", input.path])
        #expect(result.status == 0, "\(result.errors)")
        let lines = result.output.split(separator: "\n")
        #expect(lines.first?.hasPrefix("ROLE") == true)
        #expect(lines.dropFirst().allSatisfy { $0.contains("#") && $0.contains("%") })
    }

    @Test func badInputSaysWhatIsWrongWithoutUsageText() async throws {
        let directory = Fixture.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let svg = directory.appendingPathComponent("x.svg")
        try Data(#"<svg xmlns="http://www.w3.org/2000/svg"/>"#.utf8).write(to: svg)
        let result = try await run(["thumbnail", svg.path, "-o", directory.appendingPathComponent("t.jpg").path])
        #expect(result.status != 0)
        #expect(result.errors.contains("not a JPEG, PNG, WebP or HEIF image"))
        #expect(!result.errors.contains("Usage"))
        let missing = try await run(["palette", directory.appendingPathComponent("nothing.jpg").path])
        #expect(missing.status != 0 && missing.errors.contains("cannot read"))
    }

    @Test func statsPrintsTheTiersOfTheRunningService() async throws {
        let directory = Fixture.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        try await withLiveBus { bus in
            bus.startRunner(ImageService(library: try ImageLibrary(directory: directory)))
            try await bus.waitForWorkers(1, service: Images.service)
            let client = try bus.client()
            let photo = try await client.call(Images.Put.self, .init(plantID: "p1", data: Data(Fixture.jpeg)), principal: "alice")
            _ = try await client.call(Images.GetVariant.self, .init(sha256: photo.sha256, variant: .thumbnail), principal: "alice")
            let result = try await run(["stats", "--endpoint", bus.endpoint])
            try #require(result.status == 0, "\(result.errors)")
            let lines = result.output.split(separator: "\n").map(String.init)
            try #require(lines.count >= 4, "\(result.output)")
            #expect(lines[0].hasPrefix("TIER    ENTRIES"))
            #expect(lines[1].hasPrefix("memory") && lines[2].hasPrefix("disk"))
            #expect(result.output.contains("originals: 1"))
        }
    }

    @Test func everySubcommandShowsAnExampleAndEveryServeOptionItsVariable() async throws {
        #expect(try await helpProblems("canopy-images", subcommands: [[], ["serve"], ["thumbnail"], ["palette"], ["stats"], ["health"]]) == [])
    }

    @Test func serveRefusesBadOptionsWithASentence() async throws {
        let result = try await run(["serve", "--budget-mb", "1"])
        #expect(result.status != 0)
        #expect(result.errors.contains("--budget-mb must be at least 64"))
        let help = try await run(["--help"])
        #expect(help.output.contains("Examples:"))
    }
}
