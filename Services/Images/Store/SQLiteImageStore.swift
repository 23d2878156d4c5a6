import CanopyMessages
import CanopyStore
import Foundation
import GRDB

/// The durable part of canopy-images: originals on disk, content-addressed by the SHA-256
/// of the uploaded bytes, and an SQLite index (GRDB, WAL) of who holds which photo for
/// which plant, and of computed palettes.
///
/// Files are written before the rows that name them and deleted after the rows are gone;
/// files no row names are swept away at start, so a crash leaves no half-written store.
/// Thread-safe.
final class SQLiteImageStore: ImageStoring {
    let database: DatabasePool
    private let files: PhotoFiles
    private let codec = MessageCodec()

    var isRemote: Bool { false }

    /// Opens (and migrates) the store in `directory`.
    func eraseResidue() {
        SQLiteStore.eraseResidue(database)
    }

    init(directory: URL) throws {
        files = try PhotoFiles(directory: directory.appendingPathComponent("originals", isDirectory: true))
        database = try SQLiteStore.open(path: directory.appendingPathComponent("images.sqlite").path, migrator: Self.migrator)
        try sweepOrphans()
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(
                sql: """
                    CREATE TABLE originals (
                        sha256 TEXT PRIMARY KEY,
                        format TEXT NOT NULL,
                        width INTEGER NOT NULL,
                        height INTEGER NOT NULL,
                        bytes INTEGER NOT NULL,
                        createdAt DOUBLE NOT NULL);
                    CREATE TABLE photos (
                        owner TEXT NOT NULL,
                        plantID TEXT NOT NULL,
                        sha256 TEXT NOT NULL REFERENCES originals(sha256),
                        addedAt DOUBLE NOT NULL,
                        PRIMARY KEY (owner, plantID, sha256));
                    CREATE INDEX photosBySha ON photos(sha256, owner);
                    CREATE TABLE palettes (
                        sha256 TEXT PRIMARY KEY REFERENCES originals(sha256),
                        swatches BLOB NOT NULL,
                        createdAt DOUBLE NOT NULL);
                    """)
        }
        return migrator
    }

    // MARK: - Originals

    func originalURL(_ sha256: String) -> URL {
        files.url(sha256)
    }

    /// Whether the original is stored (for anyone).
    func hasOriginal(_ sha256: String) throws -> Bool {
        try database.tracedRead { db in
            try Bool.fetchOne(db.cachedStatement(sql: "SELECT EXISTS(SELECT 1 FROM originals WHERE sha256 = ?)"), arguments: [sha256]) ?? false
        }
    }

    /// The format the original is stored in and its size, or nil when it is not stored.
    func originalSize(_ sha256: String) throws -> (format: Images.Format, width: Int, height: Int)? {
        try database.tracedRead { db in
            try Row.fetchOne(db.cachedStatement(sql: "SELECT format, width, height FROM originals WHERE sha256 = ?"), arguments: [sha256]).map { row in
                (ImageProcessor.storedFormat(ImageKind(rawValue: row["format"]) ?? .jpeg), row["width"], row["height"])
            }
        }
    }

    /// The stored (normalized) original's bytes.
    func original(_ sha256: String) throws -> [UInt8] {
        try files.read(sha256)
    }

    /// Records `sha256` as `owner`'s photo of `plantID`, writing the original first when it
    /// is new. Returns the photo as its owner sees it.
    /// `normalized` makes the bytes to store (and their size after auto-rotation); it runs
    /// only when the original is new.
    func add(
        sha256: String, owner: String, plantID: String, format: String,
        normalized: () throws -> (bytes: [UInt8], width: Int, height: Int), now: Date
    ) throws -> Images.Photo {
        var wroteFile = false
        var width = 0, height = 0, size = 0
        if try !hasOriginal(sha256) {
            let made = try normalized()
            size = try files.write(made.bytes, as: sha256)
            (width, height) = (made.width, made.height)
            wroteFile = true
        }
        do {
            return try database.tracedWrite { db in
                try db.execute(
                    sql: """
                        INSERT OR IGNORE INTO originals (sha256, format, width, height, bytes, createdAt) VALUES (?, ?, ?, ?, ?, ?)
                        """, arguments: [sha256, format, width, height, size, now.timeIntervalSince1970])
                try db.execute(
                    sql: """
                        INSERT OR IGNORE INTO photos (owner, plantID, sha256, addedAt) VALUES (?, ?, ?, ?)
                        """, arguments: [owner, plantID, sha256, now.timeIntervalSince1970])
                return try photo(db, owner: owner, plantID: plantID, sha256: sha256)!
            }
        } catch {
            if wroteFile { files.remove(sha256) }
            throw error
        }
    }

    private func photo(_ db: Database, owner: String, plantID: String, sha256: String) throws -> Images.Photo? {
        try Row.fetchOne(
            db,
            sql: """
                SELECT p.plantID, p.sha256, p.addedAt, o.format, o.width, o.height, o.bytes
                FROM photos p JOIN originals o ON o.sha256 = p.sha256
                WHERE p.owner = ? AND p.plantID = ? AND p.sha256 = ?
                """, arguments: [owner, plantID, sha256]
        ).map(Self.photo)
    }

    private static func photo(_ row: Row) -> Images.Photo {
        Images.Photo(
            sha256: row["sha256"], plantID: row["plantID"], width: row["width"], height: row["height"],
            format: row["format"], bytes: row["bytes"], addedAt: Date(timeIntervalSince1970: row["addedAt"]))
    }

    /// Whether `owner` holds the photo (for any plant): the check before anything is served
    /// (every variant request runs it: the statement is prepared once per connection).
    func owns(_ owner: String, _ sha256: String) throws -> Bool {
        try database.tracedRead { db in
            try Bool.fetchOne(db.cachedStatement(sql: "SELECT EXISTS(SELECT 1 FROM photos WHERE sha256 = ? AND owner = ?)"), arguments: [sha256, owner])
                ?? false
        }
    }

    /// `owner`'s photos of `plantID`, newest first.
    func plantIDs(owner: String) throws -> [String] {
        try database.tracedRead { db in try String.fetchAll(db, sql: "SELECT DISTINCT plantID FROM photos WHERE owner = ?", arguments: [owner]) }
    }

    /// How many photos a person keeps, and the bytes of their originals.
    func usage(owner: String) throws -> (photos: Int, bytes: Int) {
        try database.tracedRead { db in
            let row = try Row.fetchOne(
                db,
                sql: """
                    SELECT COUNT(*) AS photos, COALESCE(SUM(o.bytes), 0) AS bytes FROM photos p JOIN originals o ON o.sha256 = p.sha256 WHERE p.owner = ?
                    """, arguments: [owner])
            return (row?["photos"] ?? 0, row?["bytes"] ?? 0)
        }
    }

    func photos(owner: String, plantID: String) throws -> [Images.Photo] {
        try database.tracedRead { db in
            try Row.fetchAll(
                db,
                sql: """
                    SELECT p.plantID, p.sha256, p.addedAt, o.format, o.width, o.height, o.bytes
                    FROM photos p JOIN originals o ON o.sha256 = p.sha256
                    WHERE p.owner = ? AND p.plantID = ?
                    ORDER BY p.addedAt DESC, p.sha256
                    """, arguments: [owner, plantID]
            ).map(Self.photo)
        }
    }

    /// Forgets `owner`'s photos of `plantID` (only `sha256` when given). Originals nobody
    /// else holds lose their rows (and palettes) in the same transaction; their files go after
    /// the commit. Returns how many photos were forgotten and which originals are gone.
    func purge(owner: String, plantID: String, sha256: String?) throws -> (photos: Int, deleted: [String]) {
        let (count, deleted) = try database.tracedWrite { db -> (Int, [String]) in
            let matching = "owner = ? AND plantID = ? AND (? IS NULL OR sha256 = ?)"
            let arguments: StatementArguments = [owner, plantID, sha256, sha256]
            let shas = try String.fetchAll(db, sql: "SELECT sha256 FROM photos WHERE \(matching)", arguments: arguments)
            try db.execute(sql: "DELETE FROM photos WHERE \(matching)", arguments: arguments)
            var deleted: [String] = []
            for sha in shas where try !(Bool.fetchOne(db, sql: "SELECT EXISTS(SELECT 1 FROM photos WHERE sha256 = ?)", arguments: [sha]) ?? false) {
                try db.execute(sql: "DELETE FROM palettes WHERE sha256 = ?", arguments: [sha])
                try db.execute(sql: "DELETE FROM originals WHERE sha256 = ?", arguments: [sha])
                deleted.append(sha)
            }
            return (shas.count, deleted)
        }
        for sha in deleted { files.remove(sha) }
        return (count, deleted)
    }

    /// Originals stored, and their bytes.
    func originalTotals() throws -> (count: Int, bytes: Int) {
        try database.tracedRead { db in
            let row = try Row.fetchOne(db, sql: "SELECT COUNT(*) AS count, COALESCE(SUM(bytes), 0) AS bytes FROM originals")!
            return (row["count"], row["bytes"])
        }
    }

    func checkOriginalsWritable() throws {
        try files.checkWritable()
    }

    /// Deletes original files no row names (left by a crash between file and row).
    private func sweepOrphans() throws {
        let known = Set(try database.tracedRead { db in try String.fetchAll(db, sql: "SELECT sha256 FROM originals") })
        for entry in try files.entries() where !known.contains(entry.name) {
            files.remove(entry.name)
        }
    }

    // MARK: - Palettes

    /// A cached palette younger than `maximumAge`.
    func palette(_ sha256: String, maximumAge: TimeInterval, now: Date) throws -> [Images.Swatch]? {
        let row = try database.tracedRead { db in
            try Row.fetchOne(db, sql: "SELECT swatches, createdAt FROM palettes WHERE sha256 = ?", arguments: [sha256])
        }
        guard let row, now.timeIntervalSince1970 - (row["createdAt"] as Double) < maximumAge else { return nil }
        return try? codec.decode([Images.Swatch].self, from: [UInt8](row["swatches"] as Data))
    }

    func savePalette(_ swatches: [Images.Swatch], for sha256: String, now: Date) throws {
        let blob = Data(try codec.encode(swatches))
        try database.tracedWrite { db in
            guard try Bool.fetchOne(db, sql: "SELECT EXISTS(SELECT 1 FROM originals WHERE sha256 = ?)", arguments: [sha256]) ?? false else { return }
            try db.execute(
                sql: "INSERT OR REPLACE INTO palettes (sha256, swatches, createdAt) VALUES (?, ?, ?)",
                arguments: [sha256, blob, now.timeIntervalSince1970])
        }
    }

    func paletteCount() throws -> Int {
        try database.tracedRead { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM palettes") ?? 0 }
    }
}
