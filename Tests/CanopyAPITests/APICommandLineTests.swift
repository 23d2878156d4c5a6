import CanopyTesting
import Foundation
import Testing

@testable import CanopyAPI

/// `canopy-api` as an operator runs it.
struct APICommandLineTests {
    @Test func everySubcommandShowsAnExampleAndEveryServeOptionItsVariable() async throws {
        #expect(try await helpProblems("canopy-api", subcommands: [[], ["serve"], ["token"], ["token", "issue"], ["health"]]) == [])
    }

    @Test func tokenIssuePrintsATokenTheServiceTakesAndRefusesWhatItCannotSign() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-api-cli-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let keyFile = directory.appendingPathComponent("token.key")
        let key = "a key of at least thirty-two bytes for the CLI test"
        try Data((key + "\n").utf8).write(to: keyFile)

        let issued = try await runExecutable("canopy-api", ["token", "issue", "--user", "user-42", "--days", "2", "--token-key-file", keyFile.path])
        #expect(issued.status == 0, "\(issued.errors)")
        let token = issued.output.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(await (try TokenAuthority(key: Array(key.utf8))).user(of: token) == "user-42", "the trailing newline of the file is not part of the key")
        #expect(await (try TokenAuthority(key: Array("another key of at least thirty-two bytes".utf8))).user(of: token) == nil)

        let spaces = try await runExecutable("canopy-api", ["token", "issue", "--user", "user 42", "--token-key-file", keyFile.path])
        #expect(spaces.status != 0 && spaces.errors.contains("printable ASCII"))
        let noKey = try await runExecutable("canopy-api", ["token", "issue", "--user", "user-42"], environment: ["CANOPY_TOKEN_KEY": ""])
        #expect(noKey.status != 0 && noKey.errors.contains("--token-key-file"))
        try Data("short".utf8).write(to: keyFile)
        let short = try await runExecutable("canopy-api", ["token", "issue", "--user", "user-42", "--token-key-file", keyFile.path])
        #expect(short.status != 0 && short.errors.contains("at least 32"), "\(short.errors)")
        let days = try await runExecutable("canopy-api", ["token", "issue", "--user", "user-42", "--days", "9999", "--token-key-file", keyFile.path])
        #expect(days.status != 0 && days.errors.contains("--days"))
    }
}
