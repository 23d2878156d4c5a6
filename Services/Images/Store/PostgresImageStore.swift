import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation
import Logging
import PostgresNIO

/// canopy-images' store for replicas: the index (who holds which photo for which plant, the
/// originals' sizes, palettes) in PostgreSQL, and the originals in a directory every replica
/// mounts (``PhotoFiles``), content-addressed, so a photo is stored once whichever replica
/// took it, and its file removed when the last holder lets go.
///
/// A file and the row that counts it change together under a transaction-scoped advisory lock
/// for that photo (its SHA-256): a replica adding a photo writes the file (when no row counts
/// it) inside that lock, and a replica removing the last holder deletes the file afterwards
/// in the same lock, only if no row counts it by then. So an upload on one replica and a
/// purge on another never leave a row without its file or a file without its row. Every
/// original deleted is announced (`NOTIFY canopy_images_deleted`), and each replica drops
/// it from its own caches; serving checks the person still holds the photo first anyway, so
/// no replica serves a purged photo from its cache meanwhile.
final class PostgresImageStore: ImageStoring {
    let database: PostgresStore
    let files: PhotoFiles
    private let codec = MessageCodec()
    /// The channel deleted originals are announced on (their ids, comma-separated).
    static let deletedChannel = "canopy_images_deleted"
    /// How old a temporary file must be before a sweep removes it (one being written now is
    /// younger; the writer of an older one died).
    static let temporaryAge: TimeInterval = 600

    var isRemote: Bool { true }

    func eraseResidue() {
        database.vacuumSoon(imagesStoreImport.tables.map(\.name))
    }

    private init(database: PostgresStore, files: PhotoFiles) {
        self.database = database
        self.files = files
    }

    /// Connects to `url`, migrates canopy-images' tables, and keeps originals in `originals`.
    static func open(url: DatabaseURL, poolSize: Int = PostgresSettings.defaultPoolSize, originals: URL, waitingUpTo wait: Duration = .zero, logger: Logger)
        async throws -> PostgresImageStore
    {
        let store = PostgresImageStore(
            database: try await PostgresStore.open(url: url, migrator: migrator, size: poolSize, waitingUpTo: wait, logger: logger),
            files: try PhotoFiles(directory: originals))
        try await offThePool { try store.sweepOrphans(now: Date()) }
        return store
    }

    static var migrator: PostgresMigrator {
        var migrator = PostgresMigrator(store: "images")
        migrator.register(
            "v1",
            """
            CREATE TABLE originals (
                sha256 TEXT PRIMARY KEY,
                format TEXT NOT NULL,
                width INTEGER NOT NULL,
                height INTEGER NOT NULL,
                bytes BIGINT NOT NULL,
                createdAt DOUBLE PRECISION NOT NULL)
            """,
            """
            CREATE TABLE photos (
                owner TEXT NOT NULL,
                plantID TEXT NOT NULL,
                sha256 TEXT NOT NULL REFERENCES originals(sha256),
                addedAt DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (owner, plantID, sha256))
            """,
            "CREATE INDEX photosBySha ON photos(sha256, owner)",
            "CREATE TABLE palettes (sha256 TEXT PRIMARY KEY REFERENCES originals(sha256), swatches BYTEA NOT NULL, createdAt DOUBLE PRECISION NOT NULL)")
        return migrator
    }

    /// The advisory lock of each of `sha256s`, in one order (two transactions locking the
    /// same photos never wait for each other in a circle).
    private static func lock(_ session: PostgresSession, _ sha256s: [String]) throws {
        try session.execute("SELECT pg_advisory_xact_lock(hashtext('canopy_images:' || sha)) FROM unnest(\(sha256s.sorted())) AS sha ORDER BY sha")
    }

    // MARK: - Originals

    func hasOriginal(_ sha256: String) throws -> Bool {
        try database.statement { session in try session.value(Int.self, "SELECT 1 FROM originals WHERE sha256 = \(sha256)") != nil }
    }

    func originalSize(_ sha256: String) throws -> (format: Images.Format, width: Int, height: Int)? {
        try database.statement { session in
            try session.row("SELECT format, width, height FROM originals WHERE sha256 = \(sha256)").map { row in
                (
                    ImageProcessor.storedFormat(ImageKind(rawValue: try row.column("format").decode(String.self)) ?? .jpeg),
                    try row.column("width").decode(Int.self), try row.column("height").decode(Int.self)
                )
            }
        }
    }

    func original(_ sha256: String) throws -> [UInt8] {
        try files.read(sha256)
    }

    func originalTotals() throws -> (count: Int, bytes: Int) {
        try database.statement { session in
            let row = try session.row("SELECT COUNT(*) AS count, COALESCE(SUM(bytes), 0)::BIGINT AS bytes FROM originals")
            return (try row?.column("count").decode(Int.self) ?? 0, try row?.column("bytes").decode(Int.self) ?? 0)
        }
    }

    func checkOriginalsWritable() throws {
        try files.checkWritable()
    }

    // MARK: - Photos

    func add(
        sha256: String, owner: String, plantID: String, format: String,
        normalized: () throws -> (bytes: [UInt8], width: Int, height: Int), now: Date
    ) throws -> Images.Photo {
        let at = now.timeIntervalSince1970
        return try database.write(isolation: .readCommitted) { session in
            try Self.lock(session, [sha256])
            // Under the lock, each statement sees what committed before it: a purge that
            // removed the last holder either finished (no row: write the file again) or waits.
            if try session.value(Int.self, "SELECT 1 FROM originals WHERE sha256 = \(sha256)") == nil {
                let made = try normalized()
                let size = try files.write(made.bytes, as: sha256)
                try session.execute(
                    """
                    INSERT INTO originals (sha256, format, width, height, bytes, createdAt) VALUES (\(sha256), \(format), \(made.width), \(made.height), \(size), \(at))
                    """)
            }
            try session.execute(
                """
                INSERT INTO photos (owner, plantID, sha256, addedAt) VALUES (\(owner), \(plantID), \(sha256), \(at)) ON CONFLICT DO NOTHING
                """)
            return try photos(session, owner: owner, plantID: plantID, sha256: sha256).first!
        }
    }

    private static let photoColumns = "p.plantID, p.sha256, p.addedAt, o.format, o.width, o.height, o.bytes"

    private func photos(_ session: PostgresSession, owner: String, plantID: String, sha256: String? = nil) throws -> [Images.Photo] {
        try session.rows(
            """
            SELECT \(unescaped: Self.photoColumns) FROM photos p JOIN originals o ON o.sha256 = p.sha256
            WHERE p.owner = \(owner) AND p.plantID = \(plantID) AND (\(sha256)::TEXT IS NULL OR p.sha256 = \(sha256))
            ORDER BY p.addedAt DESC, p.sha256
            """
        ).map { row in
            Images.Photo(
                sha256: try row.column("sha256").decode(String.self), plantID: try row.column("plantID").decode(String.self),
                width: try row.column("width").decode(Int.self),
                height: try row.column("height").decode(Int.self), format: try row.column("format").decode(String.self),
                bytes: try row.column("bytes").decode(Int.self),
                addedAt: Date(timeIntervalSince1970: try row.column("addedAt").decode(Double.self)))
        }
    }

    func owns(_ owner: String, _ sha256: String) throws -> Bool {
        try database.statement { session in try session.value(Int.self, "SELECT 1 FROM photos WHERE sha256 = \(sha256) AND owner = \(owner) LIMIT 1") != nil }
    }

    func plantIDs(owner: String) throws -> [String] {
        try database.statement { session in
            try session.rows("SELECT DISTINCT plantID FROM photos WHERE owner = \(owner)").map { try $0.column("plantID").decode(String.self) }
        }
    }

    func usage(owner: String) throws -> (photos: Int, bytes: Int) {
        try database.statement { session in
            let row = try session.row(
                """
                SELECT COUNT(*) AS count, COALESCE(SUM(o.bytes), 0)::BIGINT AS bytes FROM photos p JOIN originals o ON o.sha256 = p.sha256 WHERE p.owner = \(owner)
                """)
            return (try row?.column("count").decode(Int.self) ?? 0, try row?.column("bytes").decode(Int.self) ?? 0)
        }
    }

    func photos(owner: String, plantID: String) throws -> [Images.Photo] {
        try database.statement { session in try photos(session, owner: owner, plantID: plantID) }
    }

    func purge(owner: String, plantID: String, sha256: String?) throws -> (photos: Int, deleted: [String]) {
        let (count, orphaned) = try database.write(isolation: .readCommitted) { session -> (Int, [String]) in
            let shas = try session.rows(
                """
                SELECT sha256 FROM photos WHERE owner = \(owner) AND plantID = \(plantID) AND (\(sha256)::TEXT IS NULL OR sha256 = \(sha256))
                """
            ).map { try $0.column("sha256").decode(String.self) }
            guard !shas.isEmpty else { return (0, []) }
            try Self.lock(session, shas)
            let removed = try session.execute(
                """
                DELETE FROM photos WHERE owner = \(owner) AND plantID = \(plantID) AND sha256 = ANY(\(shas))
                """)
            // Originals nobody holds any more lose their rows (and palettes) here; their files
            // go once this commits, in the lock again (below).
            let orphaned = try session.rows(
                """
                SELECT sha FROM unnest(\(shas)) AS sha WHERE NOT EXISTS (SELECT 1 FROM photos WHERE photos.sha256 = sha)
                """
            ).map { try $0.column("sha").decode(String.self) }
            if !orphaned.isEmpty {
                try session.execute("DELETE FROM palettes WHERE sha256 = ANY(\(orphaned))")
                try session.execute("DELETE FROM originals WHERE sha256 = ANY(\(orphaned))")
            }
            return (removed, orphaned)
        }
        guard !orphaned.isEmpty else { return (count, []) }
        let deleted = try removeFiles(orphaned)
        return (count, deleted)
    }

    /// Removes the files of originals no row counts, each in its lock (an upload that counted
    /// one again meanwhile keeps it), and announces them to every replica; returns those removed.
    private func removeFiles(_ sha256s: [String]) throws -> [String] {
        try database.write(isolation: .readCommitted) { session in
            try Self.lock(session, sha256s)
            let counted = Set(
                try session.rows("SELECT sha256 FROM originals WHERE sha256 = ANY(\(sha256s))").map { try $0.column("sha256").decode(String.self) })
            let gone = sha256s.filter { !counted.contains($0) }
            for sha in gone { files.remove(sha) }
            // A notification carries at most 8000 bytes: 100 ids at a time.
            for start in stride(from: 0, to: gone.count, by: 100) {
                let payload = gone[start..<min(start + 100, gone.count)].joined(separator: ",")
                try session.execute("SELECT pg_notify(\(Self.deletedChannel), \(payload))")
            }
            return gone
        }
    }

    /// Removes the files no row counts: left by a replica that died between writing a file
    /// and committing its row, or between a purge's commit and its file's removal (at open,
    /// so a replica that was killed clears what it left when it comes back). Each is checked
    /// in its lock (``removeFiles(_:)``), as uploads write files in theirs: a file whose row is
    /// about to commit is kept. Temporary files go once ``temporaryAge`` old.
    func sweepOrphans(now: Date) throws {
        let entries = try files.entries()
        for entry in entries where entry.name.hasPrefix(PhotoFiles.temporaryPrefix) && now.timeIntervalSince(entry.modified) > Self.temporaryAge {
            files.remove(entry.name)
        }
        let names = entries.map(\.name).filter { !$0.hasPrefix(PhotoFiles.temporaryPrefix) }
        for start in stride(from: 0, to: names.count, by: 1_000) {
            _ = try removeFiles(Array(names[start..<min(start + 1_000, names.count)]))
        }
    }

    /// Calls `onDeleted` with the originals any replica deletes (this one's too), until the
    /// listening is stopped.
    func observeDeletedOriginals(_ onDeleted: @escaping @Sendable ([String]) -> Void) async -> PostgresListening {
        await database.listen(Self.deletedChannel) { payload in
            let ids = payload.split(separator: ",").map(String.init).filter { $0.count == 64 }
            if !ids.isEmpty { onDeleted(ids) }
        }
    }

    // MARK: - Palettes

    func palette(_ sha256: String, maximumAge: TimeInterval, now: Date) throws -> [Images.Swatch]? {
        let row = try database.statement { session in try session.row("SELECT swatches, createdAt FROM palettes WHERE sha256 = \(sha256)") }
        guard let row, now.timeIntervalSince1970 - (try row.column("createdAt").decode(Double.self)) < maximumAge else { return nil }
        return try? codec.decode([Images.Swatch].self, from: [UInt8](try row.column("swatches").decode(Data.self)))
    }

    func savePalette(_ swatches: [Images.Swatch], for sha256: String, now: Date) throws {
        let blob = Data(try codec.encode(swatches))
        try database.write { session in
            try session.execute(
                """
                INSERT INTO palettes (sha256, swatches, createdAt) SELECT \(sha256), \(blob), \(now.timeIntervalSince1970)
                WHERE EXISTS (SELECT 1 FROM originals WHERE sha256 = \(sha256))
                ON CONFLICT (sha256) DO UPDATE SET swatches = excluded.swatches, createdAt = excluded.createdAt
                """)
        }
    }

    func paletteCount() throws -> Int {
        try database.statement { session in try session.value(Int.self, "SELECT COUNT(*) FROM palettes") ?? 0 }
    }
}

/// How canopy-images' SQLite index moves into PostgreSQL (`canopy migrate`; the originals are
/// copied by ``ImageTools/copyOriginals(_:from:to:progress:)``).
public let imagesStoreImport = StoreImport(
    store: "images", migrator: PostgresImageStore.migrator,
    tables: [
        .init("originals", key: ["sha256"]), .init("photos", key: ["owner", "plantID", "sha256"]), .init("palettes", key: ["sha256"]),
    ])
