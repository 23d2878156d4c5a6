import CanopyImaging
import CanopyMessages
import CanopyStore
import Foundation
import GRDB

/// canopy-identify's store: one SQLite file (GRDB, WAL) with the identifications, the
/// features of every photo seen (computed once, by content hash), the operator's labelled
/// reference photos, the photos of each person's accepted plants, and Pl@ntNet's quota.
/// Every query about a person's data names the owner. Thread-safe; the operator CLI may
/// write references while the service runs (``referenceGeneration`` tells it to reload).
final class SQLiteIdentificationStore: IdentificationStoring {
    let database: DatabasePool
    private let codec = MessageCodec()
    /// This store's id in the submissions it claims: a claim of another id is a process that
    /// ended (one process serves a SQLite store), so it is free.
    let holder = Int64.random(in: 1...Int64(Int32.max))

    func eraseResidue() {
        SQLiteStore.eraseResidue(database)
    }

    init(path: String) throws {
        database = try SQLiteStore.open(path: path, migrator: Self.migrator)
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(
                sql: """
                    CREATE TABLE identifications (
                        id TEXT PRIMARY KEY,
                        owner TEXT NOT NULL,
                        -- SHA-256 of the sorted (photo, organ) pairs: the same submission again finds it
                        submissionKey TEXT NOT NULL,
                        createdAt DOUBLE NOT NULL,
                        plantID TEXT NOT NULL,
                        -- the plant it was accepted as: plantID, or one of the person's plants
                        acceptedPlantID TEXT,
                        record BLOB NOT NULL,
                        UNIQUE (owner, submissionKey));
                    CREATE INDEX identificationsByOwner ON identifications(owner, createdAt, id);
                    CREATE INDEX identificationsByPlant ON identifications(owner, plantID);
                    CREATE INDEX identificationsByAcceptedPlant ON identifications(owner, acceptedPlantID);
                    CREATE TABLE photoFeatures (
                        sha256 TEXT PRIMARY KEY,
                        features BLOB NOT NULL);
                    CREATE TABLE species (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        scientificName TEXT NOT NULL UNIQUE,
                        withoutAuthor TEXT NOT NULL,
                        authorship TEXT NOT NULL,
                        genus TEXT NOT NULL,
                        family TEXT NOT NULL,
                        commonNames BLOB NOT NULL,
                        gbifID INTEGER);
                    CREATE TABLE referencePhotos (
                        speciesID INTEGER NOT NULL REFERENCES species(id) ON DELETE CASCADE,
                        sha256 TEXT NOT NULL,
                        addedAt DOUBLE NOT NULL,
                        PRIMARY KEY (speciesID, sha256));
                    CREATE TABLE plantPhotos (
                        owner TEXT NOT NULL,
                        plantID TEXT NOT NULL,
                        sha256 TEXT NOT NULL,
                        candidate BLOB NOT NULL,
                        PRIMARY KEY (owner, plantID, sha256));
                    CREATE TABLE quota (
                        provider TEXT PRIMARY KEY,
                        remaining INTEGER,
                        resetsAt DOUBLE,
                        updatedAt DOUBLE NOT NULL);
                    CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
                    INSERT INTO meta VALUES ('referenceGeneration', 0);
                    """)
        }
        migrator.registerMigration("v2-submissions") { db in
            // A submission being identified, and until when: the same photos at once are
            // identified once.
            try db.execute(
                sql: """
                    CREATE TABLE submissions (owner TEXT NOT NULL, submissionKey TEXT NOT NULL, claimedUntil DOUBLE NOT NULL,
                                              PRIMARY KEY (owner, submissionKey))
                    """)
        }
        migrator.registerMigration("v3-submission-holders") { db in
            // Who holds a claim, and the plant id its photos go under: a claim left by a
            // process that ended is taken over with its photos, or cleared.
            try db.execute(sql: "ALTER TABLE submissions ADD COLUMN plantID TEXT")
            try db.execute(sql: "ALTER TABLE submissions ADD COLUMN claimedBy INTEGER")
        }
        migrator.registerMigration("v4-plant-features") { db in
            // Features of the first format (192 bytes) describe the whole frame; the matcher
            // now describes the plant. They go, and are computed again where the photo is at hand.
            try db.execute(sql: "DELETE FROM photoFeatures WHERE length(features) = 192")
        }
        return migrator
    }

    // MARK: - Identifications

    func identification(owner: String, id: String) async throws -> Identification.Record? {
        try await database.tracedRead { [self] db in try identification(db, owner: owner, id: id) }
    }

    func identification(owner: String, submissionKey: String) async throws -> Identification.Record? {
        try await database.tracedRead { [self] db in try identification(db, owner: owner, submissionKey: submissionKey) }
    }

    private func identification(_ db: Database, owner: String, id: String) throws -> Identification.Record? {
        try Data.fetchOne(db, sql: "SELECT record FROM identifications WHERE owner = ? AND id = ?", arguments: [owner, id])
            .map { try codec.decode(Identification.Record.self, from: [UInt8]($0)) }
    }

    private func identification(_ db: Database, owner: String, submissionKey: String) throws -> Identification.Record? {
        try Data.fetchOne(db, sql: "SELECT record FROM identifications WHERE owner = ? AND submissionKey = ?", arguments: [owner, submissionKey])
            .map { try codec.decode(Identification.Record.self, from: [UInt8]($0)) }
    }

    func claimSubmission(owner: String, key: String, plantID: String, now: Date, until: Date) throws -> String? {
        try database.tracedWrite { [holder] db in
            try String.fetchOne(
                db,
                sql: """
                    INSERT INTO submissions (owner, submissionKey, claimedUntil, plantID, claimedBy) VALUES (?, ?, ?, ?, ?)
                    ON CONFLICT (owner, submissionKey) DO UPDATE
                    SET claimedUntil = excluded.claimedUntil, claimedBy = excluded.claimedBy, plantID = COALESCE(submissions.plantID, excluded.plantID)
                    WHERE submissions.claimedUntil <= ? OR submissions.claimedBy IS NOT ?
                    RETURNING plantID
                    """, arguments: [owner, key, until.timeIntervalSince1970, plantID, holder, now.timeIntervalSince1970, holder])
        }
    }

    func plantIDs(owner: String) throws -> [String] {
        try database.tracedRead { db in
            try String.fetchAll(
                db,
                sql: """
                    SELECT plantID FROM identifications WHERE owner = ? UNION SELECT acceptedPlantID FROM identifications WHERE owner = ? AND acceptedPlantID IS NOT NULL
                    UNION SELECT plantID FROM plantPhotos WHERE owner = ?
                    """, arguments: [owner, owner, owner])
        }
    }

    func forgetSubmissions(owner: String) throws {
        try database.tracedWrite { db in try db.execute(sql: "DELETE FROM submissions WHERE owner = ?", arguments: [owner]) }
    }

    func releaseSubmission(owner: String, key: String) throws {
        try database.tracedWrite { [holder] db in
            try db.execute(
                sql: "DELETE FROM submissions WHERE owner = ? AND submissionKey = ? AND (claimedBy IS NULL OR claimedBy = ?)",
                arguments: [owner, key, holder])
        }
    }

    func takeAbandonedSubmissions(now: Date, until: Date, limit: Int) throws -> [AbandonedSubmission] {
        try database.tracedWrite { [holder] db in
            try Row.fetchAll(
                db,
                sql: """
                    UPDATE submissions SET claimedUntil = ?, claimedBy = ?
                    WHERE rowid IN (SELECT rowid FROM submissions WHERE claimedUntil <= ? OR claimedBy IS NOT ? LIMIT ?)
                    RETURNING owner, submissionKey, plantID
                    """, arguments: [until.timeIntervalSince1970, holder, now.timeIntervalSince1970, holder, limit]
            )
            .map { AbandonedSubmission(owner: $0["owner"], key: $0["submissionKey"], plantID: $0["plantID"]) }
        }
    }

    /// Records a new identification; when the same submission was recorded meanwhile (two at
    /// once), that one stands and is returned. A person keeps at most
    /// ``Identification/Limits/identificationsPerPerson``: past that, their oldest
    /// identifications that were never accepted make room, and their plant ids come back in
    /// `dropped` (their photos are then purged from canopy-images).
    func insert(_ record: Identification.Record, submissionKey: String) throws -> (record: Identification.Record, dropped: [String]) {
        try database.tracedWrite { db in
            if let existing = try identification(db, owner: record.owner, submissionKey: submissionKey) { return (existing, []) }
            let count = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM identifications WHERE owner = ?", arguments: [record.owner]) ?? 0
            var dropped: [String] = []
            let excess = count - Identification.Limits.identificationsPerPerson + 1
            if excess > 0 {
                let oldest = try Row.fetchAll(
                    db,
                    sql: """
                        SELECT id, plantID FROM identifications WHERE owner = ? AND acceptedPlantID IS NULL ORDER BY createdAt, id LIMIT ?
                        """, arguments: [record.owner, excess])
                for row in oldest {
                    try db.execute(sql: "DELETE FROM identifications WHERE owner = ? AND id = ?", arguments: [record.owner, row["id"] as String])
                    dropped.append(row["plantID"])
                }
            }
            let encoded = try codec.encode(record)
            try db.execute(
                sql: """
                    INSERT INTO identifications (id, owner, submissionKey, createdAt, plantID, record) VALUES (?, ?, ?, ?, ?, ?)
                    """, arguments: [record.id, record.owner, submissionKey, record.createdAt.timeIntervalSince1970, record.plantID, Data(encoded)])
            // As it will read back (times to the millisecond), so the first answer and later ones are equal.
            return (try codec.decode(Identification.Record.self, from: encoded), dropped)
        }
    }

    /// Marks an identification accepted as `plantID` and files its photos under that plant,
    /// for matching the person's later photos against their own plants.
    func accept(_ record: Identification.Record, plantID: String, candidate: Identification.Candidate) async throws {
        try await database.tracedWrite { [self] db in try accept(db, record, plantID: plantID, candidate: candidate) }
    }

    private func accept(_ db: Database, _ record: Identification.Record, plantID: String, candidate: Identification.Candidate) throws {
        try db.execute(
            sql: "UPDATE identifications SET record = ?, acceptedPlantID = ? WHERE owner = ? AND id = ?",
            arguments: [Data(try codec.encode(record)), plantID, record.owner, record.id])
        var own = candidate
        own.plantID = plantID
        for sha256 in record.photoIDs {
            try db.execute(
                sql: "INSERT OR REPLACE INTO plantPhotos (owner, plantID, sha256, candidate) VALUES (?, ?, ?, ?)",
                arguments: [record.owner, plantID, sha256, Data(try codec.encode(own))])
        }
    }

    /// A page of `owner`'s identifications (or one plant's), newest first, after `cursor`.
    func history(owner: String, plantID: String?, limit: Int, after cursor: (createdAt: Double, id: String)?) throws -> [Identification.Record] {
        try database.tracedRead { db in
            var sql = "SELECT record FROM identifications WHERE owner = ?"
            var arguments: StatementArguments = [owner]
            if let plantID {
                sql += " AND (plantID = ? OR acceptedPlantID = ?)"
                _ = arguments.append(contentsOf: [plantID, plantID])
            }
            if let cursor {
                sql += " AND (createdAt < ? OR (createdAt = ? AND id < ?))"
                _ = arguments.append(contentsOf: [cursor.createdAt, cursor.createdAt, cursor.id])
            }
            sql += " ORDER BY createdAt DESC, id DESC LIMIT ?"
            _ = arguments.append(contentsOf: [limit])
            return try Data.fetchAll(db, sql: sql, arguments: arguments).map { try codec.decode(Identification.Record.self, from: [UInt8]($0)) }
        }
    }

    /// Forgets a deleted plant's identifications and its photos' filing. Returns how many
    /// identifications went.
    @discardableResult
    func forget(owner: String, plantID: String) throws -> Int {
        try database.tracedWrite { db in
            // The photos involved: those of the identifications and of the plant's own photos.
            var photos = Set(try String.fetchAll(db, sql: "SELECT sha256 FROM plantPhotos WHERE owner = ? AND plantID = ?", arguments: [owner, plantID]))
            for data in try Data.fetchAll(
                db, sql: "SELECT record FROM identifications WHERE owner = ? AND (plantID = ? OR acceptedPlantID = ?)",
                arguments: [owner, plantID, plantID])
            {
                if let record = try? codec.decode(Identification.Record.self, from: [UInt8](data)) { photos.formUnion(record.photoIDs) }
            }
            try db.execute(sql: "DELETE FROM identifications WHERE owner = ? AND (plantID = ? OR acceptedPlantID = ?)", arguments: [owner, plantID, plantID])
            let forgotten = db.changesCount
            try db.execute(sql: "DELETE FROM plantPhotos WHERE owner = ? AND plantID = ?", arguments: [owner, plantID])
            // Their features go too, unless another plant, identification or reference still has the photo.
            for sha256 in photos {
                try db.execute(
                    sql: """
                        DELETE FROM photoFeatures WHERE sha256 = ?1
                          AND NOT EXISTS (SELECT 1 FROM plantPhotos WHERE sha256 = ?1)
                          AND NOT EXISTS (SELECT 1 FROM referencePhotos WHERE sha256 = ?1)
                          AND NOT EXISTS (SELECT 1 FROM identifications WHERE instr(CAST(record AS TEXT), ?1) > 0)
                        """, arguments: [sha256])
            }
            return forgotten
        }
    }

    // MARK: - Features

    /// Stored features of the photos among `sha256s` that have them.
    func features(_ sha256s: [String]) throws -> [String: PhotoFeatures] {
        guard !sha256s.isEmpty else { return [:] }
        return try database.tracedRead { db in
            let rows = try Row.fetchAll(
                db, sql: "SELECT sha256, features FROM photoFeatures WHERE sha256 IN (\(sha256s.map { _ in "?" }.joined(separator: ",")))",
                arguments: StatementArguments(sha256s))
            var found: [String: PhotoFeatures] = [:]
            for row in rows {
                if let features = PhotoFeatures(packed: row["features"]) { found[row["sha256"]] = features }
            }
            return found
        }
    }

    /// Forgets the features of these photos (a failed submission's).
    func deleteFeatures(_ sha256s: [String]) throws {
        guard !sha256s.isEmpty else { return }
        try database.tracedWrite { db in
            try db.execute(
                sql: "DELETE FROM photoFeatures WHERE sha256 IN (\(sha256s.map { _ in "?" }.joined(separator: ",")))", arguments: StatementArguments(sha256s))
        }
    }

    func saveFeatures(_ features: PhotoFeatures, sha256: String) throws {
        try database.tracedWrite { db in
            try db.execute(
                sql: "INSERT INTO photoFeatures (sha256, features) VALUES (?, ?) ON CONFLICT (sha256) DO UPDATE SET features = excluded.features",
                arguments: [sha256, features.packed])
        }
    }

    /// The person's accepted plants' photos with their features: what "which of my plants is
    /// this?" compares against.
    func plantPhotos(owner: String) throws -> [(candidate: Identification.Candidate, features: PhotoFeatures)] {
        try database.tracedRead { db in
            try Row.fetchAll(
                db,
                sql: """
                    SELECT plantPhotos.candidate, photoFeatures.features FROM plantPhotos
                    JOIN photoFeatures ON photoFeatures.sha256 = plantPhotos.sha256
                    WHERE plantPhotos.owner = ?
                    """, arguments: [owner]
            ).compactMap { row in
                guard let features = PhotoFeatures(packed: row["features"]) else { return nil }
                return (try codec.decode(Identification.Candidate.self, from: [UInt8](row["candidate"] as Data)), features)
            }
        }
    }

    func plantPhotosWithoutFeatures(owner: String, limit: Int) throws -> [String] {
        try database.tracedRead { db in
            try String.fetchAll(
                db,
                sql: """
                    SELECT DISTINCT sha256 FROM plantPhotos WHERE owner = ? AND sha256 NOT IN (SELECT sha256 FROM photoFeatures) ORDER BY sha256 LIMIT ?
                    """, arguments: [owner, limit])
        }
    }

    // MARK: - References

    /// Bumped by every change to the references: a running service reloads its index when
    /// the number it built from is no longer current.
    func referenceGeneration() throws -> Int {
        try database.tracedRead { db in try Int.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'referenceGeneration'") ?? 0 }
    }

    /// Adds reference photos of a species (created, or updated with the names given).
    func addReferences(_ species: ReferenceSpecies, photos: [(sha256: String, features: PhotoFeatures)], now: Date) throws {
        try database.tracedWrite { db in
            try db.execute(
                sql: """
                    INSERT INTO species (scientificName, withoutAuthor, authorship, genus, family, commonNames, gbifID) VALUES (?, ?, ?, ?, ?, ?, ?)
                    ON CONFLICT (scientificName) DO UPDATE SET withoutAuthor = excluded.withoutAuthor, authorship = excluded.authorship,
                        genus = excluded.genus, family = excluded.family, commonNames = excluded.commonNames, gbifID = excluded.gbifID
                    """,
                arguments: [
                    species.scientificName, species.withoutAuthor, species.authorship, species.genus, species.family,
                    Data(try codec.encode(species.commonNames)), species.gbifID,
                ])
            let id = try Int.fetchOne(db, sql: "SELECT id FROM species WHERE scientificName = ?", arguments: [species.scientificName])!
            for photo in photos {
                try db.execute(
                    sql: "INSERT INTO photoFeatures (sha256, features) VALUES (?, ?) ON CONFLICT (sha256) DO UPDATE SET features = excluded.features",
                    arguments: [photo.sha256, photo.features.packed])
                try db.execute(
                    sql: "INSERT OR IGNORE INTO referencePhotos (speciesID, sha256, addedAt) VALUES (?, ?, ?)",
                    arguments: [id, photo.sha256, now.timeIntervalSince1970])
            }
            try db.execute(sql: "UPDATE meta SET value = value + 1 WHERE key = 'referenceGeneration'")
        }
    }

    /// Removes a species and its reference photos; `false` when there was none by that name.
    func removeReferences(scientificName: String) throws -> Bool {
        try database.tracedWrite { db in
            try db.execute(sql: "DELETE FROM species WHERE scientificName = ? OR withoutAuthor = ?", arguments: [scientificName, scientificName])
            guard db.changesCount > 0 else { return false }
            try db.execute(sql: "UPDATE meta SET value = value + 1 WHERE key = 'referenceGeneration'")
            return true
        }
    }

    /// Every species with its number of reference photos, by name.
    func referenceSpecies() throws -> [(species: ReferenceSpecies, photos: Int)] {
        try database.tracedRead { db in
            try Row.fetchAll(
                db,
                sql: """
                    SELECT species.*, COUNT(photoFeatures.sha256) AS photos FROM species
                    LEFT JOIN referencePhotos ON referencePhotos.speciesID = species.id
                    LEFT JOIN photoFeatures ON photoFeatures.sha256 = referencePhotos.sha256
                    GROUP BY species.id ORDER BY species.scientificName
                    """
            ).map { row in (try species(row), row["photos"]) }
        }
    }

    /// Every reference photo's species and features, and the generation they are of.
    func referenceSet() throws -> (generation: Int, entries: [(species: ReferenceSpecies, features: PhotoFeatures)]) {
        try database.tracedRead { db in
            let generation = try Int.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'referenceGeneration'") ?? 0
            var speciesByID: [Int64: ReferenceSpecies] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT * FROM species") { speciesByID[row["id"]] = try species(row) }
            let entries = try Row.fetchAll(
                db,
                sql: """
                    SELECT referencePhotos.speciesID, photoFeatures.features FROM referencePhotos
                    JOIN photoFeatures ON photoFeatures.sha256 = referencePhotos.sha256
                    """
            ).compactMap { row -> (ReferenceSpecies, PhotoFeatures)? in
                guard let species = speciesByID[row["speciesID"]], let features = PhotoFeatures(packed: row["features"]) else { return nil }
                return (species, features)
            }
            return (generation, entries)
        }
    }

    private func species(_ row: Row) throws -> ReferenceSpecies {
        ReferenceSpecies(
            scientificName: row["scientificName"], withoutAuthor: row["withoutAuthor"], authorship: row["authorship"], genus: row["genus"],
            family: row["family"], commonNames: try codec.decode([String].self, from: [UInt8](row["commonNames"] as Data)), gbifID: row["gbifID"])
    }

    // MARK: - Quota

    func quota(provider: String) throws -> ProviderQuota {
        try database.tracedRead { db in
            guard let row = try Row.fetchOne(db, sql: "SELECT remaining, resetsAt FROM quota WHERE provider = ?", arguments: [provider]) else {
                return ProviderQuota()
            }
            return ProviderQuota(remaining: row["remaining"], resetsAt: (row["resetsAt"] as Double?).map { Date(timeIntervalSince1970: $0) })
        }
    }

    func saveQuota(_ state: ProviderQuota, provider: String, now: Date) throws {
        try database.tracedWrite { db in
            try db.execute(
                sql: "INSERT OR REPLACE INTO quota (provider, remaining, resetsAt, updatedAt) VALUES (?, ?, ?, ?)",
                arguments: [provider, state.remaining, state.resetsAt?.timeIntervalSince1970, now.timeIntervalSince1970])
        }
    }
}

extension PhotoFeatures {
    /// The format's version: the first byte of ``packed``. Version 1 (before the plant was
    /// found first, 192 bytes, no version byte) is not read: such rows are features nobody has
    /// (migration `v4-plant-features` deletes them; they are computed again when needed).
    static let packedVersion: UInt8 = 2

    /// The version byte, then ``count`` little-endian 32-bit floats.
    var packed: Data {
        var data = Data(capacity: 1 + Self.count * 4)
        data.append(Self.packedVersion)
        for value in values { withUnsafeBytes(of: value.bitPattern.littleEndian) { data.append(contentsOf: $0) } }
        return data
    }

    init?(packed: Data) {
        guard packed.count == 1 + Self.count * 4, packed.first == Self.packedVersion else { return nil }
        let values = packed.withUnsafeBytes { buffer in
            (0..<Self.count).map { Float(bitPattern: UInt32(littleEndian: buffer.loadUnaligned(fromByteOffset: 1 + $0 * 4, as: UInt32.self))) }
        }
        // Stored bytes are not trusted to be numbers: a NaN or an infinity would poison every distance.
        guard values.allSatisfy(\.isFinite) else { return nil }
        self.init(values: values)
    }
}
