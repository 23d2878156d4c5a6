import CanopyMessages
import CanopyServiceKit
import CanopyStore
import CanopyTesting
import Foundation
import Glibc
import Logging
import Testing

/// A service that starts before its PostgreSQL waits for it, and nothing waits on a server
/// that does not answer for longer than its bounds: in a container stack the services may start
/// first (an engine that ignores `depends_on` conditions), and PostgreSQL may be gone before
/// them when the stack stops (their stop grace is 10 s).
@Suite(.serialized)
struct PostgresWaitTests {
    let logger = Logger(label: "canopy-test-postgres-wait")

    static var migrator: PostgresMigrator { PostgresMigratorTests.plants }

    /// A TCP port that takes connections and never says a word (a hung server): libc's
    /// listen backlog completes the handshake, nobody reads.
    final class SilentListener: Sendable {
        let port: Int
        private let socket: Int32

        init() throws {
            let descriptor = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = 0
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard bound == 0, listen(descriptor, 64) == 0 else {
                close(descriptor)
                throw PostgresServerError("cannot listen on 127.0.0.1")
            }
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) } }
            socket = descriptor
            port = Int(UInt16(bigEndian: address.sin_port))
        }

        deinit { close(socket) }
    }

    @Test func aStoreWaitsForAServerThatComesUpLater() async throws {
        guard PostgresServer.isAvailable else {
            Issue.record("PostgreSQL is not installed; scripts/setup installs Debian's postgresql package")
            return
        }
        let port = FreePorts.any()
        let password = UUID().uuidString
        let url = DatabaseURL(host: "127.0.0.1", port: port, user: "canopy", password: password, database: "postgres")
        let opening = Task { [logger] in try await PostgresStore.open(url: url, migrator: Self.migrator, size: 1, waitingUpTo: .seconds(300), logger: logger) }
        // Nothing listens yet: it keeps trying (a refused connection is not the end).
        try await Task.sleep(for: .seconds(2))
        let server = try await PostgresServer(port: port, password: password)
        defer { server.stop() }
        let store = try await opening.value
        defer { store.close() }
        #expect(try store.statement { try $0.value(Int.self, "SELECT COUNT(*)::BIGINT FROM plants") } == 0, "migrated once the server came")
    }

    @Test func aStoreThatMayNotWaitFailsAtOnceWithASentence() async throws {
        let url = DatabaseURL(host: "127.0.0.1", port: FreePorts.any(), user: "canopy", database: "canopy")
        await #expect {
            _ = try await PostgresStore.open(url: url, migrator: Self.migrator, size: 1, logger: logger)
        } throws: { error in
            "\(error)".contains("cannot reach PostgreSQL at postgres://canopy@127.0.0.1") && "\(error)".contains("is it running")
        }
    }

    @Test func aServerThatTakesTheConnectionAndNeverAnswersFailsTheAttempt() async throws {
        let silent = try SilentListener()
        let url = DatabaseURL(host: "127.0.0.1", port: silent.port, user: "canopy", database: "canopy")
        // The attempt ends (postgres-nio's connect timeout, or the store's bound on the whole
        // attempt, whichever comes first), with the sentence.
        await #expect {
            _ = try await PostgresStore.open(url: url, migrator: Self.migrator, size: 1, logger: logger)
        } throws: { error in
            "\(error)".contains("cannot reach PostgreSQL at postgres://canopy@127.0.0.1:\(silent.port)/canopy")
        }
    }

    @Test func cancellingAStoreThatWaitsEndsTheWaitAtOnce() async throws {
        let silent = try SilentListener()
        let url = DatabaseURL(host: "127.0.0.1", port: silent.port, user: "canopy", database: "canopy")
        let opening = Task { [logger] in try await PostgresStore.open(url: url, migrator: Self.migrator, size: 1, waitingUpTo: .seconds(600), logger: logger) }
        try await Task.sleep(for: .milliseconds(500)) // its first attempt hangs on the silent server
        let cancelledAt = ContinuousClock.now
        opening.cancel() // what SIGTERM does while a service waits for its database
        let outcome = await opening.result
        #expect(throws: (any Error).self) { try outcome.get() }
        // Ended by the cancellation, not by the attempt's own bound running out.
        #expect(ContinuousClock.now - cancelledAt < PostgresStore.attemptLimit)
    }

    /// A server that ends the connection a call is using (a restart, an operator's
    /// `pg_terminate_backend`) fails that call with a `busy` sentence (HTTP 503: try again),
    /// not `internal`; the next call connects again and works.
    @Test func aConnectionTheServerEndsMidCallFailsWithBusyAndTheNextCallConnectsAgain() async throws {
        let url = try await PostgresServer.shared().database()
        let store = try await PostgresStore.open(url: url, migrator: Self.migrator, size: 2, logger: logger)
        defer { store.close() }
        try await offThePool { try store.write { session in try session.execute("INSERT INTO plants (id, owner) VALUES ('p1', 'alice')") } }
        let slow = Task { try await offThePool { try store.read { session in try session.value(Int.self, "SELECT COUNT(*) FROM plants, pg_sleep(30)") } } }
        // The call's connection ends while it waits on the server.
        #expect(
            try await eventually(within: .seconds(10)) {
                try await PostgresServer.query(
                    url,
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE '%pg_sleep(30)%' AND pid <> pg_backend_pid()"
                ) == 1
            })
        let failure = await #expect(throws: PostgresStore.Failure.self) { try await slow.value }
        #expect(failure?.passes == true && failure?.canopyError.code == .busy, "\(String(describing: failure))")
        #expect(failure?.canopyError.message.contains("127.0.0.1") == false, "the database's address is the log's, not the caller's")
        #expect(try await offThePool { try store.read { session in try session.value(Int.self, "SELECT COUNT(*) FROM plants") } } == 1)
    }
}
