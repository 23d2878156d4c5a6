import ArgumentParser
import Foundation

/// Where a stateful service keeps its data: `--database-url` (PostgreSQL, which replicas
/// share) or, without it, a SQLite file in its data directory (the embedded default).
public struct DatabaseOptions: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "PostgreSQL for this service's store, shared by its replicas: postgres://USER@HOST:5432/DATABASE (without it: SQLite in the data directory). Env: CANOPY_DATABASE_URL.",
            valueName: "url"))
    public var databaseURL: String? = Self.environment("CANOPY_DATABASE_URL")

    @Option(
        help: ArgumentHelp(
            "A file holding the database password (a compose secret), instead of one in the URL. Env: CANOPY_DATABASE_PASSWORD_FILE.", valueName: "path"))
    public var databasePasswordFile: String? = Self.environment("CANOPY_DATABASE_PASSWORD_FILE")

    @Option(
        help: ArgumentHelp(
            "Connections this process opens to PostgreSQL at most; the server must allow this times the replicas. Env: CANOPY_DATABASE_POOL.",
            valueName: "count"))
    public var databasePool: Int = Int(Self.environment("CANOPY_DATABASE_POOL") ?? "") ?? PostgresSettings.defaultPoolSize

    @Option(
        help: ArgumentHelp(
            "Seconds a service that starts before its PostgreSQL waits for it (a line logged at each try) before it stops with a sentence; 60 for serve, 0 for other commands. Env: CANOPY_DATABASE_WAIT.",
            valueName: "seconds"))
    public var databaseWait: Int? = Int(Self.environment("CANOPY_DATABASE_WAIT") ?? "")

    public init() {}

    private static func environment(_ name: String) -> String? {
        guard let value = ProcessInfo.processInfo.environment[name], !value.isEmpty else { return nil }
        return value
    }

    public func validate() throws {
        if let pool = Self.environment("CANOPY_DATABASE_POOL"), Int(pool) == nil {
            throw ValidationError("CANOPY_DATABASE_POOL=\(pool.prefix(40)) is not a whole number; unset it or give a number")
        }
        guard (1...1_000).contains(databasePool) else { throw ValidationError("--database-pool must be from 1 to 1000; 8 is the usual value") }
        if let wait = Self.environment("CANOPY_DATABASE_WAIT"), Int(wait) == nil {
            throw ValidationError("CANOPY_DATABASE_WAIT=\(wait.prefix(40)) is not a whole number of seconds; unset it or give one")
        }
        if let databaseWait, !(0...3_600).contains(databaseWait) {
            throw ValidationError("--database-wait must be from 0 to 3600 seconds; 60 is the usual value")
        }
        _ = try postgres()
    }

    /// The PostgreSQL these options name, or nil for SQLite. `serving`: a service's `serve`,
    /// which waits for a database that is not up yet (`--database-wait`, 60 s unless told);
    /// any other command fails at once unless told to wait.
    public func postgres(serving: Bool = false) throws -> PostgresSettings? {
        guard let databaseURL else {
            guard databasePasswordFile == nil else { throw ValidationError("--database-password-file needs --database-url") }
            return nil
        }
        do {
            return PostgresSettings(
                url: try DatabaseURL(parsing: databaseURL, passwordFile: databasePasswordFile), poolSize: databasePool,
                wait: .seconds(databaseWait ?? (serving ? PostgresSettings.defaultWaitSeconds : 0)))
        } catch {
            throw ValidationError(error.description)
        }
    }
}

/// A service's PostgreSQL: where it is, and how many connections one process opens.
public struct PostgresSettings: Sendable, Equatable {
    public static let defaultPoolSize = 8
    /// `--database-wait`'s default: how long a service waits at start for its database.
    public static let defaultWaitSeconds = 60
    public var url: DatabaseURL
    public var poolSize: Int
    /// How long a service that starts before its database waits for it (``PostgresStore/open(url:migrator:size:waitingUpTo:logger:)``).
    public var wait: Duration

    public init(url: DatabaseURL, poolSize: Int = Self.defaultPoolSize, wait: Duration = .seconds(Self.defaultWaitSeconds)) {
        self.url = url
        self.poolSize = poolSize
        self.wait = wait
    }
}
