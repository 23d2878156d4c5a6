import CanopyImaging
import CanopyMessages
import CanopyTesting
import CareScheduling
import Foundation
import Identification
import ImageCache
import Reminders
import Testing
@testable import RequestBatching

extension LiveBatchTests {
    /// The whole API against its own document: schemathesis (PyPI) generates requests from
    /// docs/openapi.yaml, valid and invalid, sends them to canopy-batch with every service
    /// behind it, and checks that nothing answers 5xx and every answer (status, content type,
    /// headers, body) is one the document allows.
    ///
    /// `scripts/test` installs schemathesis and names it in `CANOPY_SCHEMATHESIS`; a plain
    /// `swift test` without it leaves this one out.
    @Suite(.serialized)
    struct BatchSchemathesisTests {
        static let schemathesis = ProcessInfo.processInfo.environment["CANOPY_SCHEMATHESIS"]
        static let document = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Services/RequestBatching/Core/openapi.yaml")

        @Test(.enabled(if: schemathesis != nil, "scripts/test installs schemathesis and names it in CANOPY_SCHEMATHESIS"),
              .timeLimit(.minutes(10)))
        func everyAnswerOfTheWholeAPIIsOneItsDocumentAllows() async throws {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-batch-schemathesis-\(UUID().uuidString)")
            defer { try? FileManager.default.removeItem(at: directory) }
            try await withLiveBus { bus in
                bus.run(try buildCareService(settings: CareServiceSettings(directory: directory.appendingPathComponent("care"), runner: bus.runnerConfiguration()),
                                             context: bus.context, logger: bus.logger))
                bus.run(try buildImageService(settings: ImageServiceSettings(directory: directory.appendingPathComponent("images"), runner: bus.runnerConfiguration()),
                                              context: bus.context, logger: bus.logger))
                bus.run(try buildReminderService(settings: ReminderServiceSettings(directory: directory.appendingPathComponent("remind"), runner: bus.runnerConfiguration()),
                                                 context: bus.context, logger: bus.logger))
                let identify = IdentificationServiceSettings(directory: directory.appendingPathComponent("identify"), runner: bus.runnerConfiguration())
                _ = try IdentificationTools(databasePath: identify.databasePath).addReferences(
                    .init(scientificName: "Testus primus", commonNames: ["Test plant"], family: "Testaceae"),
                    photos: try (1...2).map { try SyntheticPlant.species(0).photo(seed: $0) })
                bus.run(try buildIdentificationService(settings: identify, context: bus.context, logger: bus.logger))
                var settings = BatchServiceSettings(http: .anyLoopbackPort, bus: .init(endpoint: bus.endpoint), tokenKey: BatchAPITests.key)
                settings.rateLimit = 100_000 // schemathesis is one person sending as fast as it can
                settings.rateBurst = 100_000
                let services = try buildBatchService(settings: settings, context: bus.context, logger: bus.logger)
                let http = try #require(services.first { $0 is BatchHTTPServer } as? BatchHTTPServer)
                bus.run(services)
                for service in [Care.service, Images.service, Reminders.service, Identification.service] { try await bus.waitForWorkers(1, service: service) }
                let base = "http://127.0.0.1:\(try await http.boundPort())"
                let token = try await TokenAuthority(key: BatchAPITests.key).issue(user: "schemathesis", lifetime: .seconds(3_600))

                let report = directory.appendingPathComponent("report")
                let run = try await runProgram(at: Self.schemathesis!, [
                    "run", Self.document.path, "--url", base, "--header", "Authorization: Bearer \(token)",
                    "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance",
                    "--phases", "examples,coverage,fuzzing", "--max-examples", "25", "--workers", "1", "--seed", "20261124",
                    "--generation-database", "none", "--no-color", "--suppress-health-check", "all",
                    "--report-dir", report.path, "--request-timeout", "30",
                ], limit: 480)
                print(run.output.suffix(1_500)) // its summary, for the CI log
                #expect(run.status == 0, "schemathesis found answers the document does not allow:\n\(run.output.suffix(20_000))\n\(run.errors.suffix(4_000))")
                #expect(run.output.contains("passed"), "\(run.output.suffix(4_000))")
            }
        }
    }
}
