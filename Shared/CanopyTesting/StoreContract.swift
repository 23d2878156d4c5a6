import CanopyStore
import Foundation

/// The backends every Canopy store runs on, and so every store contract test runs against:
/// the embedded SQLite default and PostgreSQL on the throwaway server the tests share.
public enum StoreBackend: String, CaseIterable, Sendable, CustomStringConvertible {
    case sqlite, postgres

    public var description: String { rawValue }
}

/// How one service's store contract tests open that store on each backend: the one harness
/// every `…StoreTests` suite runs through, so each contract runs the same way on both.
///
/// A store opens at a ``Place``: a directory of its own and, on PostgreSQL, a fresh database
/// on ``PostgresServer/shared()``. ``open(_:)`` makes a place and opens one store there;
/// a test that plays two processes of one store (a replica, a restart) opens twice at the
/// same place with ``open(at:)``.
public struct StoreContract<Store>: Sendable {
    /// Where a store lives during one test.
    public struct Place: Sendable {
        public let backend: StoreBackend
        public let directory: TemporaryDirectory
        /// The fresh database on PostgreSQL; nil on SQLite.
        public let url: DatabaseURL?
    }

    /// Names the test's directory (`canopy-<label>-<uuid>`).
    public let label: String
    private let sqlite: @Sendable (TemporaryDirectory) async throws -> Store
    private let postgres: @Sendable (DatabaseURL, TemporaryDirectory) async throws -> (Store, close: () -> Void)

    /// - Parameters:
    ///   - sqlite: opens the store in the directory, as the service does in its data directory.
    ///   - postgres: opens the store on the database (with the directory for any files it
    ///     keeps beside it) and says how to close its connections.
    public init(
        _ label: String, sqlite: @escaping @Sendable (TemporaryDirectory) async throws -> Store,
        postgres: @escaping @Sendable (DatabaseURL, TemporaryDirectory) async throws -> (Store, close: () -> Void)
    ) {
        self.label = label
        self.sqlite = sqlite
        self.postgres = postgres
    }

    /// A new place on `backend`: an empty directory and, on PostgreSQL, an empty database.
    public func place(_ backend: StoreBackend) async throws -> Place {
        let directory = try TemporaryDirectory(label)
        switch backend {
        case .sqlite: return Place(backend: backend, directory: directory, url: nil)
        case .postgres:
            do {
                return Place(backend: backend, directory: directory, url: try await PostgresServer.shared().database())
            } catch {
                directory.remove()
                throw error
            }
        }
    }

    /// Opens the store at `place`; `close` ends its connections and leaves its data there.
    public func open(at place: Place) async throws -> (store: Store, close: () -> Void) {
        if let url = place.url { return try await postgres(url, place.directory) }
        return (try await sqlite(place.directory), {})
    }

    /// Opens the store at a new place on `backend`; `cleanup` closes it and removes the place's
    /// files (call it in a `defer`, so a failing test cleans up too).
    public func open(_ backend: StoreBackend) async throws -> (store: Store, place: Place, cleanup: () -> Void) {
        let place = try await place(backend)
        do {
            let (store, close) = try await open(at: place)
            return (
                store, place,
                {
                    close()
                    place.directory.remove()
                }
            )
        } catch {
            place.directory.remove()
            throw error
        }
    }
}
