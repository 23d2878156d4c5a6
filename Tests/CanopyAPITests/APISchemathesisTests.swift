import CanopyTesting
import Foundation
import Logging
import Testing

@testable import CanopyAPI

extension LiveAPITests {
    /// The whole API against its own document: schemathesis (PyPI) generates requests from
    /// docs/openapi.yaml, valid and invalid, sends them to canopy-api with every service
    /// behind it, and checks that nothing answers 5xx and every answer (status, content type,
    /// headers, body) is one the document allows.
    ///
    /// `scripts/test` installs schemathesis and names it in `CANOPY_SCHEMATHESIS`; a plain
    /// `swift test` without it leaves this one out.
    @Suite(.serialized)
    struct APISchemathesisTests {
        static let schemathesis = ProcessInfo.processInfo.environment["CANOPY_SCHEMATHESIS"]
        static let document = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Services/API/Core/openapi.yaml")

        @Test(
            .enabled(if: schemathesis != nil, "scripts/test installs schemathesis and names it in CANOPY_SCHEMATHESIS"),
            .timeLimit(.minutes(10)))
        func everyAnswerOfTheWholeAPIIsOneItsDocumentAllows() async throws {
            // A store, so that POSTs with an Idempotency-Key (the document's header) are kept and replayed.
            let storeDirectory = try TemporaryDirectory("schemathesis-store")
            defer { storeDirectory.remove() }
            let store = try await openAPIStore(directory: storeDirectory.url, postgres: nil, logger: Logger(label: "test"))
            try await APIIdentificationTests.withIdentifyStack(
                reminders: true,
                configure: { settings in
                    settings.rateLimit = 100_000 // schemathesis is one person sending as fast as it can
                    settings.rateBurst = 100_000
                    settings.store = store
                }
            ) { stack in
                let base = stack.base
                let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-api-schemathesis-\(UUID().uuidString)")
                defer { try? FileManager.default.removeItem(at: directory) }
                let token = try await stack.token("schemathesis")

                let report = directory.appendingPathComponent("report")
                let run = try await runProgram(
                    at: Self.schemathesis!,
                    [
                        "run", Self.document.path, "--url", base, "--header", "Authorization: Bearer \(token)",
                        "--checks",
                        "not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance",
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
