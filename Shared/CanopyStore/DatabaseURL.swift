import Foundation
import PostgresNIO

/// Where a service's store is: `--database-url postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`
/// (`CANOPY_DATABASE_URL`), for stores several replicas share, or nothing for the embedded
/// default, a SQLite file in the data directory. The password may instead come from a file
/// (`--database-password-file`, `CANOPY_DATABASE_PASSWORD_FILE`: what compose secrets
/// mount), so it appears in no process list or environment.
public struct DatabaseURL: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: Int
    public var user: String
    public var password: String?
    public var database: String
    /// `sslmode=require` (or `verify-full`): TLS to the server; the default, `disable`, is
    /// for a server on loopback or a private network.
    public var requiresTLS: Bool

    /// A URL that is not one, with a sentence saying what is wrong and what to give.
    public struct Invalid: Error, CustomStringConvertible {
        public let description: String
    }

    /// Parses `postgres://` (or `postgresql://`) URLs; `passwordFile` replaces a password in
    /// the URL (its contents, trailing newline dropped).
    public init(parsing text: String, passwordFile: String? = nil) throws(Invalid) {
        func invalid(_ why: String) -> Invalid {
            Invalid(
                description:
                    "--database-url (CANOPY_DATABASE_URL) \(why); give postgres://USER@HOST:5432/DATABASE, with the password in --database-password-file")
        }
        guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased() else { throw invalid("is not a URL") }
        guard scheme == "postgres" || scheme == "postgresql" else { throw invalid("has the scheme '\(scheme.prefix(20))', not postgres") }
        guard let host = components.host, !host.isEmpty else { throw invalid("names no host") }
        guard let user = components.user, !user.isEmpty else { throw invalid("names no user") }
        let database = String(components.path.drop { $0 == "/" })
        guard !database.isEmpty, !database.contains("/") else { throw invalid("names no database (the path after the host)") }
        let port = components.port ?? 5432
        guard (1...65_535).contains(port) else { throw invalid("has the port \(port)") }
        var requiresTLS = false
        for item in components.queryItems ?? [] {
            switch (item.name, item.value ?? "") {
            case ("sslmode", "disable"), ("sslmode", "prefer"), ("sslmode", "allow"): requiresTLS = false
            case ("sslmode", "require"), ("sslmode", "verify-ca"), ("sslmode", "verify-full"): requiresTLS = true
            default: throw invalid("has the option '\(item.name.prefix(40))=\((item.value ?? "").prefix(40))', which Canopy does not take (sslmode is)")
            }
        }
        var password = components.password
        if let passwordFile {
            guard let contents = try? String(contentsOfFile: passwordFile, encoding: .utf8) else {
                throw Invalid(description: "cannot read the database password file \(passwordFile); check the path and its permissions")
            }
            password = String(contents.trimmingCharacters(in: .newlines))
        }
        self.init(host: host, port: port, user: user, password: password, database: database, requiresTLS: requiresTLS)
    }

    public init(host: String, port: Int = 5432, user: String, password: String? = nil, database: String, requiresTLS: Bool = false) {
        self.host = host
        self.port = port
        self.user = user
        self.password = password
        self.database = database
        self.requiresTLS = requiresTLS
    }

    /// The URL without its password: what logs and errors may show.
    public var description: String { "postgres://\(user)@\(host):\(port)/\(database)\(requiresTLS ? "?sslmode=require" : "")" }

    /// A postgres-nio connection configuration for this server (``PostgresStore``'s
    /// connections).
    /// Connections are bounded by ``connectTimeout``: a server that is gone (a stopped
    /// container whose address no longer answers) costs a caller that long, not postgres-nio's
    /// default 10 s, which alone outlasted a container engine's 10 s stop grace.
    public func connectionConfiguration() throws -> PostgresConnection.Configuration {
        var configuration = PostgresConnection.Configuration(
            host: host, port: port, username: user, password: password, database: database,
            tls: requiresTLS ? .require(try NIOSSLContext(configuration: .makeClientConfiguration())) : .disable)
        configuration.options.connectTimeout = .seconds(Self.connectTimeout.components.seconds)
        return configuration
    }

    /// How long one attempt to connect may take (TCP and the start of the handshake).
    public static let connectTimeout: Duration = .seconds(3)

    /// A postgres-nio client configuration for this server.
    public func clientConfiguration() -> PostgresClient.Configuration {
        PostgresClient.Configuration(
            host: host, port: port, username: user, password: password, database: database,
            tls: requiresTLS ? .require(.makeClientConfiguration()) : .disable)
    }
}
