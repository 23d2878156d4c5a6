import CanopyStore
import CanopyTesting
import Foundation
import PostgresNIO
import Testing

/// `--database-url`: what is taken, what is refused with a sentence, and a real server
/// reached through it.
struct DatabaseURLTests {
    @Test func postgresURLsAreReadWithTheirDefaults() throws {
        let url = try DatabaseURL(parsing: "postgres://canopy:s3cret@db.internal/canopy")
        #expect(url == DatabaseURL(host: "db.internal", port: 5432, user: "canopy", password: "s3cret", database: "canopy"))
        #expect(url.description == "postgres://canopy@db.internal:5432/canopy", "the password never shows")
        let tls = try DatabaseURL(parsing: "postgresql://app@10.0.0.5:6432/care?sslmode=require")
        #expect(tls.port == 6432 && tls.requiresTLS && tls.password == nil)
    }

    @Test func aPasswordFileWinsOverThePasswordInTheURL() throws {
        let directory = try TemporaryDirectory("database-url")
        defer { directory.remove() }
        try Data("from-the-secret\n".utf8).write(to: URL(fileURLWithPath: directory.path("password")))
        let url = try DatabaseURL(parsing: "postgres://canopy:in-the-url@db/canopy", passwordFile: directory.path("password"))
        #expect(url.password == "from-the-secret")
        let missing = #expect(throws: DatabaseURL.Invalid.self) {
            try DatabaseURL(parsing: "postgres://canopy@db/canopy", passwordFile: directory.path("none"))
        }
        #expect(missing?.description.contains("cannot read the database password file") == true)
    }

    @Test(arguments: [
        ("mysql://canopy@db/canopy", "scheme"), ("postgres:///canopy", "no host"), ("postgres://db/canopy", "no user"),
        ("postgres://canopy@db", "no database"), ("postgres://canopy@db/canopy?application_name=x", "option"), ("not a url", "URL"),
    ])
    func urlsThatAreNotOneAreRefusedSayingWhy(text: String, why: String) {
        let error = #expect(throws: DatabaseURL.Invalid.self) { try DatabaseURL(parsing: text) }
        #expect(error?.description.contains(why) == true, "\(error?.description ?? "accepted")")
        #expect(error?.description.contains("postgres://USER@HOST:5432/DATABASE") == true, "it says what to give")
    }

    @Test func aThrowawayServerIsReachedThroughItsURLAndGoneAfterwards() async throws {
        guard PostgresServer.isAvailable else {
            Issue.record("PostgreSQL is not installed; scripts/setup installs Debian's postgresql package")
            return
        }
        var stopped: PostgresServer?
        try await withPostgres { server in
            stopped = server
            let url = try await server.database("canopy_probe")
            let client = PostgresClient(configuration: url.clientConfiguration())
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { await client.run() }
                let rows = try await client.query("SELECT current_database(), current_user")
                for try await (database, user) in rows.decode((String, String).self) {
                    #expect(database == "canopy_probe" && user == "canopy")
                }
                group.cancelAll()
            }
            // The password is checked (scram-sha-256): a wrong one is refused.
            var wrong = url
            wrong.password = "not-it"
            await #expect(throws: (any Error).self) { try await PostgresServer.query(wrong, "SELECT 1") }
        }
        // Stopped, its files gone, also had the body thrown.
        let server = try #require(stopped)
        #expect(!server.isRunning)
        #expect(!FileManager.default.fileExists(atPath: server.files.path))
    }
}
