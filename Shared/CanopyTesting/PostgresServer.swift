import CanopyServiceKit
import CanopyStore
import Foundation
import Logging
import PostgresNIO
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A throwaway PostgreSQL server for tests, from Debian's `postgresql` package (scripts/setup
/// installs it): `initdb` into a temporary directory, the server on a free port of 127.0.0.1
/// with a password (scram-sha-256, as a deployment has), owned by an unprivileged user when
/// the tests run as root (PostgreSQL refuses to run as root). ``stop()`` ends it and removes its
/// directory; ``withPostgres(_:)`` stops it also when the test fails.
///
/// Durability is off (`fsync`, `synchronous_commit`, `full_page_writes`): the tests check
/// behaviour, not crash safety, and a cluster that syncs every commit makes them slow.
public final class PostgresServer: @unchecked Sendable { // its Process is touched only by init and stop
    /// The cluster's superuser and its database.
    public let url: DatabaseURL
    private let directory: TemporaryDirectory
    private let process: Process
    /// The file the server writes its log to (shown when it does not start).
    private let log: URL

    /// Where Debian's PostgreSQL programs are (`initdb`, `postgres`): `CANOPY_PG_BIN`, else
    /// the newest /usr/lib/postgresql/N/bin; nil when PostgreSQL is not installed.
    public static var binaries: URL? {
        if let configured = ProcessInfo.processInfo.environment["CANOPY_PG_BIN"] { return URL(fileURLWithPath: configured) }
        let root = URL(fileURLWithPath: "/usr/lib/postgresql")
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: root.path)) ?? []).compactMap(Int.init).sorted()
        guard let newest = versions.last else { return nil }
        let bin = root.appendingPathComponent("\(newest)/bin")
        return FileManager.default.isExecutableFile(atPath: bin.appendingPathComponent("postgres").path) ? bin : nil
    }

    /// Whether a server can be started here (the tests that need one say so when not).
    public static var isAvailable: Bool { binaries != nil }

    /// Starts a fresh cluster and waits until it takes connections.
    ///
    /// - Parameters:
    ///   - port: where it listens (a free port when nil): a test that started a client first
    ///     names the port that client waits on.
    ///   - password: user `canopy`'s password (a random one when nil).
    ///   - limit: how long it may take to start.
    public init(port chosenPort: Int? = nil, password chosenPassword: String? = nil, within limit: Duration = .seconds(60)) async throws {
        guard let bin = Self.binaries else {
            throw PostgresServerError("PostgreSQL is not installed; scripts/setup installs Debian's postgresql package")
        }
        directory = try TemporaryDirectory("postgres")
        let data = directory.url.appendingPathComponent("data")
        log = directory.url.appendingPathComponent("server.log")
        let password = chosenPassword ?? UUID().uuidString
        let passwordFile = directory.url.appendingPathComponent("password")
        try Data(password.utf8).write(to: passwordFile)
        // PostgreSQL will not run as root: as root, everything belongs to `nobody`.
        let asRoot = getuid() == 0
        if asRoot {
            for path in [directory.url, passwordFile] {
                try FileManager.default.setAttributes([.ownerAccountID: 65_534, .groupOwnerAccountID: 65_534], ofItemAtPath: path.path)
            }
        }
        func command(_ program: String, _ arguments: [String]) -> (URL, [String]) {
            let executable = bin.appendingPathComponent(program)
            guard asRoot else { return (executable, arguments) }
            // setpriv executes the program itself: the process the test holds is the server.
            return (URL(fileURLWithPath: "/usr/bin/setpriv"), ["--reuid=65534", "--regid=65534", "--clear-groups", executable.path] + arguments)
        }
        let (initdb, initArguments) = command(
            "initdb",
            [
                "-D", data.path, "-U", "canopy", "--pwfile=\(passwordFile.path)", "-A", "scram-sha-256",
                "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync",
            ])
        let initialized = try await runProgram(at: initdb.path, initArguments, limit: 120)
        guard initialized.status == 0 else {
            throw PostgresServerError("initdb failed: \(initialized.errors.suffix(1_000))\(initialized.output.suffix(500))")
        }
        let port = chosenPort ?? FreePorts.any()
        let (postgres, serverArguments) = command(
            "postgres",
            [
                "-D", data.path, "-p", "\(port)", "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
                "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=200",
            ])
        process = Process()
        process.executableURL = postgres
        process.arguments = serverArguments
        FileManager.default.createFile(atPath: log.path, contents: nil)
        let output = try FileHandle(forWritingTo: log)
        process.standardOutput = output
        process.standardError = output
        try process.run()
        url = DatabaseURL(host: "127.0.0.1", port: port, user: "canopy", password: password, database: "postgres")
        let ready = try await eventually(within: limit, every: .milliseconds(50)) { [url, process] in
            guard process.isRunning else { return true }
            return (try? await Self.query(url, "SELECT 1")) != nil
        }
        guard ready, process.isRunning else {
            let text = (try? String(contentsOf: log, encoding: .utf8)) ?? ""
            stop()
            throw PostgresServerError("PostgreSQL did not start on port \(port): \(text.suffix(1_500))")
        }
    }

    /// A new, empty database on this server, for one test: what `--database-url` names.
    public func database(_ name: String = "canopy_\(UUID().uuidString.prefix(8).lowercased())") async throws -> DatabaseURL {
        guard name.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" }) else { throw PostgresServerError("a database name is letters, digits and _") }
        try await Self.query(url, "CREATE DATABASE \(name)")
        var database = url
        database.database = name
        return database
    }

    /// Runs one statement on a connection of its own (no pool, no retries); returns how
    /// many rows it answered.
    @discardableResult
    public static func query(_ url: DatabaseURL, _ sql: String) async throws -> Int {
        let logger = Logger(label: "canopy-test-postgres")
        let connection = try await PostgresConnection.connect(configuration: try url.connectionConfiguration(), id: 1, logger: logger)
        do {
            var rows = 0
            for try await _ in try await connection.query(PostgresQuery(unsafeSQL: sql), logger: logger) { rows += 1 }
            try await connection.close()
            return rows
        } catch {
            try? await connection.close()
            throw error
        }
    }

    /// The server's process id (its connections are processes it starts).
    public var pid: Int32 { process.processIdentifier }

    /// Whether the server process runs.
    public var isRunning: Bool { process.isRunning }

    /// Where its files are (removed by ``stop()``).
    public var files: URL { directory.url }

    /// Ends the server (a fast shutdown: SIGINT, then SIGKILL after 10 s) and removes its files.
    public func stop() {
        if process.isRunning {
            kill(process.processIdentifier, SIGINT)
            let deadline = Date().addingTimeInterval(10)
            while process.isRunning, Date() < deadline { usleep(20_000) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
        }
        directory.remove()
    }
}

extension PostgresServer {
    /// One server for every test of this process that only needs a database of its own
    /// (``database(_:)``): started by the first that asks, stopped when the process exits.
    public static func shared() async throws -> PostgresServer {
        try await sharedServer.value
    }

    private static let sharedServer = Task<PostgresServer, any Error> {
        let server = try await PostgresServer()
        sharedForExit.withLock { $0 = server }
        atexit { PostgresServer.sharedForExit.withLock { $0 }?.stop() }
        return server
    }

    private static let sharedForExit = Mutex<PostgresServer?>(nil)
}

/// Runs `body` with a fresh PostgreSQL server and stops it afterwards, also when `body` throws.
public func withPostgres<T>(_ body: (PostgresServer) async throws -> T) async throws -> T {
    let server = try await PostgresServer()
    return try await ending(with: { _ = try? await offThePool { server.stop() } }) { try await body(server) }
}

/// Why a test's PostgreSQL server could not be had.
public struct PostgresServerError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
