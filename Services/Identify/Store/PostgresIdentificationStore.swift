import CanopyImaging
import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation
import Logging
import PostgresNIO

/// canopy-identify's store in PostgreSQL (``IdentificationStoring``), which any number of
/// canopy-identify replicas share: the same tables and queries as ``SQLiteIdentificationStore``.
/// Writes are serializable, so a person's identification limit and the reference generation
/// hold across replicas; a submission is identified once however many replicas get it at
/// once (``claimSubmission(owner:key:plantID:now:until:)``), so the provider's quota counts it once;
/// a replica killed mid-submission leaves nothing behind (``takeAbandonedSubmissions(now:until:limit:)``).
final class PostgresIdentificationStore: IdentificationStoring {
    let database: PostgresStore
    private let codec = MessageCodec()

    func eraseResidue() {
        database.vacuumSoon(identifyStoreImport.tables.map(\.name))
    }

    private init(database: PostgresStore) {
        self.database = database
    }

    /// Connects to `url` and migrates canopy-identify's tables.
    static func open(url: DatabaseURL, poolSize: Int = PostgresSettings.defaultPoolSize, waitingUpTo wait: Duration = .zero, logger: Logger) async throws
        -> PostgresIdentificationStore
    {
        PostgresIdentificationStore(database: try await PostgresStore.open(url: url, migrator: migrator, size: poolSize, waitingUpTo: wait, logger: logger))
    }

    static var migrator: PostgresMigrator {
        var migrator = PostgresMigrator(store: "identify")
        migrator.register(
            "v1",
            """
            CREATE TABLE identifications (
                id TEXT PRIMARY KEY,
                owner TEXT NOT NULL,
                submissionKey TEXT NOT NULL,
                createdAt DOUBLE PRECISION NOT NULL,
                plantID TEXT NOT NULL,
                acceptedPlantID TEXT,
                record BYTEA NOT NULL,
                UNIQUE (owner, submissionKey))
            """,
            "CREATE INDEX identificationsByOwner ON identifications(owner, createdAt, id)",
            "CREATE INDEX identificationsByPlant ON identifications(owner, plantID)",
            "CREATE INDEX identificationsByAcceptedPlant ON identifications(owner, acceptedPlantID)",
            // A submission being identified, and until when (a replica that died lets go then).
            "CREATE TABLE submissions (owner TEXT NOT NULL, submissionKey TEXT NOT NULL, claimedUntil DOUBLE PRECISION NOT NULL, PRIMARY KEY (owner, submissionKey))",
            "CREATE TABLE photoFeatures (sha256 TEXT PRIMARY KEY, features BYTEA NOT NULL)",
            """
            CREATE TABLE species (
                id BIGSERIAL PRIMARY KEY,
                scientificName TEXT NOT NULL UNIQUE,
                withoutAuthor TEXT NOT NULL,
                authorship TEXT NOT NULL,
                genus TEXT NOT NULL,
                family TEXT NOT NULL,
                commonNames BYTEA NOT NULL,
                gbifID BIGINT)
            """,
            """
            CREATE TABLE referencePhotos (
                speciesID BIGINT NOT NULL REFERENCES species(id) ON DELETE CASCADE,
                sha256 TEXT NOT NULL,
                addedAt DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (speciesID, sha256))
            """,
            "CREATE INDEX referencePhotosBySHA ON referencePhotos(sha256)",
            """
            CREATE TABLE plantPhotos (
                owner TEXT NOT NULL,
                plantID TEXT NOT NULL,
                sha256 TEXT NOT NULL,
                candidate BYTEA NOT NULL,
                PRIMARY KEY (owner, plantID, sha256))
            """,
            "CREATE INDEX plantPhotosBySHA ON plantPhotos(sha256)",
            "CREATE TABLE quota (provider TEXT PRIMARY KEY, remaining BIGINT, resetsAt DOUBLE PRECISION, updatedAt DOUBLE PRECISION NOT NULL)",
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL)",
            "INSERT INTO meta VALUES ('referenceGeneration', 0)")
        // Who holds a claim (``PostgresStore/holder``), and the plant id its photos go under:
        // a claim left by a replica that is gone is taken over with its photos, or cleared.
        migrator.register(
            "v2-submission-holders",
            "ALTER TABLE submissions ADD COLUMN plantID TEXT",
            "ALTER TABLE submissions ADD COLUMN claimedBy BIGINT")
        // Features of the first format describe the whole frame (SQLiteIdentificationStore's v4).
        migrator.register("v3-plant-features", "DELETE FROM photoFeatures WHERE length(features) = 192")
        return migrator
    }

    private func record(_ data: Data) throws -> Identification.Record {
        try codec.decode(Identification.Record.self, from: [UInt8](data))
    }

    // MARK: - Identifications

    func identification(owner: String, id: String) async throws -> Identification.Record? {
        try await offThePool { [self] in
            try database.statement { session in
                try session.value(Data.self, "SELECT record FROM identifications WHERE owner = \(owner) AND id = \(id)").map(record)
            }
        }
    }

    func identification(owner: String, submissionKey: String) async throws -> Identification.Record? {
        try await offThePool { [self] in
            try database.statement { session in try identification(session, owner: owner, submissionKey: submissionKey) }
        }
    }

    private func identification(_ session: PostgresSession, owner: String, submissionKey: String) throws -> Identification.Record? {
        try session.value(Data.self, "SELECT record FROM identifications WHERE owner = \(owner) AND submissionKey = \(submissionKey)").map(record)
    }

    func claimSubmission(owner: String, key: String, plantID: String, now: Date, until: Date) throws -> String? {
        let (at, end, holder) = (now.timeIntervalSince1970, until.timeIntervalSince1970, database.holder)
        return try database.write(isolation: .readCommitted) { session in
            try session.value(
                String.self,
                """
                INSERT INTO submissions (owner, submissionKey, claimedUntil, plantID, claimedBy) VALUES (\(owner), \(key), \(end), \(plantID), \(holder))
                ON CONFLICT (owner, submissionKey) DO UPDATE
                SET claimedUntil = excluded.claimedUntil, claimedBy = excluded.claimedBy, plantID = COALESCE(submissions.plantID, excluded.plantID)
                WHERE submissions.claimedUntil <= \(at) OR \(unescaped: PostgresStore.holderIsGone("submissions.claimedBy"))
                RETURNING plantID
                """)
        }
    }

    func plantIDs(owner: String) throws -> [String] {
        try database.statement { session in
            try session.rows(
                """
                SELECT plantID FROM identifications WHERE owner = \(owner) UNION SELECT acceptedPlantID FROM identifications WHERE owner = \(owner) AND acceptedPlantID IS NOT NULL
                UNION SELECT plantID FROM plantPhotos WHERE owner = \(owner)
                """
            ).map { try $0.column("plantID").decode(String.self) }
        }
    }

    func forgetSubmissions(owner: String) throws {
        try database.write(isolation: .readCommitted) { session in try session.execute("DELETE FROM submissions WHERE owner = \(owner)") }
    }

    func releaseSubmission(owner: String, key: String) throws {
        let holder = database.holder
        try database.write(isolation: .readCommitted) { session in
            try session.execute("DELETE FROM submissions WHERE owner = \(owner) AND submissionKey = \(key) AND (claimedBy IS NULL OR claimedBy = \(holder))")
        }
    }

    func takeAbandonedSubmissions(now: Date, until: Date, limit: Int) throws -> [AbandonedSubmission] {
        let (at, end, holder) = (now.timeIntervalSince1970, until.timeIntervalSince1970, database.holder)
        return try database.write(isolation: .readCommitted) { session in
            try session.rows(
                """
                UPDATE submissions SET claimedUntil = \(end), claimedBy = \(holder) WHERE (owner, submissionKey) IN (
                    SELECT owner, submissionKey FROM submissions WHERE claimedUntil <= \(at) OR \(unescaped: PostgresStore.holderIsGone("claimedBy"))
                    LIMIT \(limit) FOR UPDATE SKIP LOCKED)
                RETURNING owner, submissionKey, plantID
                """
            ).map {
                AbandonedSubmission(
                    owner: try $0.column("owner").decode(String.self), key: try $0.column("submissionKey").decode(String.self),
                    plantID: try $0.column("plantID").decode(String?.self))
            }
        }
    }

    func insert(_ record: Identification.Record, submissionKey: String) throws -> (record: Identification.Record, dropped: [String]) {
        let encoded = Data(try codec.encode(record))
        let stored = try codec.decode(Identification.Record.self, from: [UInt8](encoded)) // as it will read back
        return try database.write { session in
            if let existing = try identification(session, owner: record.owner, submissionKey: submissionKey) { return (existing, []) }
            let count = try session.value(Int.self, "SELECT COUNT(*) FROM identifications WHERE owner = \(record.owner)") ?? 0
            var dropped: [String] = []
            let excess = count - Identification.Limits.identificationsPerPerson + 1
            if excess > 0 {
                dropped = try session.rows(
                    """
                    DELETE FROM identifications WHERE owner = \(record.owner) AND id IN (
                        SELECT id FROM identifications WHERE owner = \(record.owner) AND acceptedPlantID IS NULL ORDER BY createdAt, id LIMIT \(excess))
                    RETURNING plantID
                    """
                ).map { try $0.column("plantID").decode(String.self) }
            }
            try session.execute(
                """
                INSERT INTO identifications (id, owner, submissionKey, createdAt, plantID, record)
                VALUES (\(record.id), \(record.owner), \(submissionKey), \(record.createdAt.timeIntervalSince1970), \(record.plantID), \(encoded))
                """)
            return (stored, dropped)
        }
    }

    func accept(_ record: Identification.Record, plantID: String, candidate: Identification.Candidate) async throws {
        var own = candidate
        own.plantID = plantID
        let (encoded, filed) = (Data(try codec.encode(record)), Data(try codec.encode(own)))
        try await offThePool { [self] in
            try database.write { session in
                try session.execute(
                    """
                    UPDATE identifications SET record = \(encoded), acceptedPlantID = \(plantID) WHERE owner = \(record.owner) AND id = \(record.id)
                    """)
                try session.execute(
                    """
                    INSERT INTO plantPhotos (owner, plantID, sha256, candidate) SELECT \(record.owner), \(plantID), unnest(\(record.photoIDs)), \(filed)
                    ON CONFLICT (owner, plantID, sha256) DO UPDATE SET candidate = excluded.candidate
                    """)
            }
        }
    }

    func history(owner: String, plantID: String?, limit: Int, after cursor: (createdAt: Double, id: String)?) throws -> [Identification.Record] {
        try database.statement { session in
            var bindings = PostgresBindings()
            bindings.append(owner)
            var sql = "SELECT record FROM identifications WHERE owner = $1"
            if let plantID {
                bindings.append(plantID)
                sql += " AND (plantID = $\(bindings.count) OR acceptedPlantID = $\(bindings.count))"
            }
            if let cursor {
                bindings.append(cursor.createdAt)
                bindings.append(cursor.id)
                sql += " AND (createdAt < $\(bindings.count - 1) OR (createdAt = $\(bindings.count - 1) AND id < $\(bindings.count)))"
            }
            bindings.append(limit)
            sql += " ORDER BY createdAt DESC, id DESC LIMIT $\(bindings.count)"
            return try session.rows(PostgresQuery(unsafeSQL: sql, binds: bindings)).map { try record(try $0.column("record").decode(Data.self)) }
        }
    }

    @discardableResult
    func forget(owner: String, plantID: String) throws -> Int {
        try database.write { session in
            // The photos involved: those of the identifications and of the plant's own photos.
            var photos = Set(
                try session.rows("SELECT sha256 FROM plantPhotos WHERE owner = \(owner) AND plantID = \(plantID)").map {
                    try $0.column("sha256").decode(String.self)
                })
            let forgotten = try session.rows(
                """
                DELETE FROM identifications WHERE owner = \(owner) AND (plantID = \(plantID) OR acceptedPlantID = \(plantID)) RETURNING record
                """)
            for row in forgotten {
                if let record = try? record(try row.column("record").decode(Data.self)) { photos.formUnion(record.photoIDs) }
            }
            try session.execute("DELETE FROM plantPhotos WHERE owner = \(owner) AND plantID = \(plantID)")
            // Their features go too, unless another plant, identification or reference still has the photo.
            for sha256 in photos {
                try session.execute(
                    """
                    DELETE FROM photoFeatures WHERE sha256 = \(sha256)
                      AND NOT EXISTS (SELECT 1 FROM plantPhotos WHERE sha256 = \(sha256))
                      AND NOT EXISTS (SELECT 1 FROM referencePhotos WHERE sha256 = \(sha256))
                      AND NOT EXISTS (SELECT 1 FROM identifications WHERE position(\(sha256) in convert_from(record, 'UTF8')) > 0)
                    """)
            }
            return forgotten.count
        }
    }

    // MARK: - Features

    func features(_ sha256s: [String]) throws -> [String: PhotoFeatures] {
        guard !sha256s.isEmpty else { return [:] }
        return try database.statement { session in
            var found: [String: PhotoFeatures] = [:]
            for row in try session.rows("SELECT sha256, features FROM photoFeatures WHERE sha256 = ANY(\(sha256s))") {
                if let features = PhotoFeatures(packed: try row.column("features").decode(Data.self)) {
                    found[try row.column("sha256").decode(String.self)] = features
                }
            }
            return found
        }
    }

    func deleteFeatures(_ sha256s: [String]) throws {
        guard !sha256s.isEmpty else { return }
        try database.write { session in try session.execute("DELETE FROM photoFeatures WHERE sha256 = ANY(\(sha256s))") }
    }

    func saveFeatures(_ features: PhotoFeatures, sha256: String) throws {
        let packed = features.packed
        try database.write { session in
            try session.execute(
                "INSERT INTO photoFeatures (sha256, features) VALUES (\(sha256), \(packed)) ON CONFLICT (sha256) DO UPDATE SET features = excluded.features")
        }
    }

    func plantPhotos(owner: String) throws -> [(candidate: Identification.Candidate, features: PhotoFeatures)] {
        try database.statement { session in
            try session.rows(
                """
                SELECT plantPhotos.candidate, photoFeatures.features FROM plantPhotos
                JOIN photoFeatures ON photoFeatures.sha256 = plantPhotos.sha256 WHERE plantPhotos.owner = \(owner)
                """
            ).compactMap { row in
                guard let features = PhotoFeatures(packed: try row.column("features").decode(Data.self)) else { return nil }
                return (try codec.decode(Identification.Candidate.self, from: [UInt8](try row.column("candidate").decode(Data.self))), features)
            }
        }
    }

    func plantPhotosWithoutFeatures(owner: String, limit: Int) throws -> [String] {
        try database.statement { session in
            try session.rows(
                """
                SELECT DISTINCT sha256 FROM plantPhotos WHERE owner = \(owner)
                AND NOT EXISTS (SELECT 1 FROM photoFeatures WHERE photoFeatures.sha256 = plantPhotos.sha256) ORDER BY sha256 LIMIT \(limit)
                """
            ).map { try $0.column("sha256").decode(String.self) }
        }
    }

    // MARK: - References

    func referenceGeneration() throws -> Int {
        try database.statement { session in try session.value(Int.self, "SELECT value FROM meta WHERE key = 'referenceGeneration'") ?? 0 }
    }

    func addReferences(_ species: ReferenceSpecies, photos: [(sha256: String, features: PhotoFeatures)], now: Date) throws {
        let names = Data(try codec.encode(species.commonNames))
        let (sha256s, packed) = (photos.map(\.sha256), photos.map(\.features.packed))
        try database.write { session in
            let id = try session.value(
                Int64.self,
                """
                INSERT INTO species (scientificName, withoutAuthor, authorship, genus, family, commonNames, gbifID)
                VALUES (\(species.scientificName), \(species.withoutAuthor), \(species.authorship), \(species.genus), \(species.family), \(names), \(species.gbifID))
                ON CONFLICT (scientificName) DO UPDATE SET withoutAuthor = excluded.withoutAuthor, authorship = excluded.authorship,
                    genus = excluded.genus, family = excluded.family, commonNames = excluded.commonNames, gbifID = excluded.gbifID
                RETURNING id
                """)!
            for (sha256, features) in zip(sha256s, packed) {
                try session.execute(
                    "INSERT INTO photoFeatures (sha256, features) VALUES (\(sha256), \(features)) ON CONFLICT (sha256) DO UPDATE SET features = excluded.features"
                )
            }
            try session.execute(
                """
                INSERT INTO referencePhotos (speciesID, sha256, addedAt) SELECT \(id), unnest(\(sha256s)), \(now.timeIntervalSince1970)
                ON CONFLICT DO NOTHING
                """)
            try session.execute("UPDATE meta SET value = value + 1 WHERE key = 'referenceGeneration'")
        }
    }

    func removeReferences(scientificName: String) throws -> Bool {
        try database.write { session in
            guard try session.execute("DELETE FROM species WHERE scientificName = \(scientificName) OR withoutAuthor = \(scientificName)") > 0 else {
                return false
            }
            try session.execute("UPDATE meta SET value = value + 1 WHERE key = 'referenceGeneration'")
            return true
        }
    }

    private static let speciesColumns =
        "species.id, species.scientificName, species.withoutAuthor, species.authorship, species.genus, species.family, species.commonNames, species.gbifID"

    private func species(_ row: PostgresRandomAccessRow) throws -> ReferenceSpecies {
        ReferenceSpecies(
            scientificName: try row.column("scientificName").decode(String.self), withoutAuthor: try row.column("withoutAuthor").decode(String.self),
            authorship: try row.column("authorship").decode(String.self),
            genus: try row.column("genus").decode(String.self), family: try row.column("family").decode(String.self),
            commonNames: try codec.decode([String].self, from: [UInt8](try row.column("commonNames").decode(Data.self))),
            gbifID: try row.column("gbifID").decode(Int?.self))
    }

    func referenceSpecies() throws -> [(species: ReferenceSpecies, photos: Int)] {
        try database.statement { session in
            try session.rows(
                """
                SELECT \(unescaped: Self.speciesColumns), COUNT(photoFeatures.sha256) AS photos FROM species
                LEFT JOIN referencePhotos ON referencePhotos.speciesID = species.id
                LEFT JOIN photoFeatures ON photoFeatures.sha256 = referencePhotos.sha256
                GROUP BY species.id ORDER BY species.scientificName COLLATE "C"
                """
            ).map { row in (try species(row), try row.column("photos").decode(Int.self)) }
        }
    }

    func referenceSet() throws -> (generation: Int, entries: [(species: ReferenceSpecies, features: PhotoFeatures)]) {
        try database.read { session in
            let generation = try session.value(Int.self, "SELECT value FROM meta WHERE key = 'referenceGeneration'") ?? 0
            var speciesByID: [Int64: ReferenceSpecies] = [:]
            for row in try session.rows("SELECT \(unescaped: Self.speciesColumns) FROM species") {
                speciesByID[try row.column("id").decode(Int64.self)] = try species(row)
            }
            let entries = try session.rows(
                """
                SELECT referencePhotos.speciesID, photoFeatures.features FROM referencePhotos
                JOIN photoFeatures ON photoFeatures.sha256 = referencePhotos.sha256
                """
            ).compactMap { row -> (ReferenceSpecies, PhotoFeatures)? in
                guard let species = speciesByID[try row.column("speciesID").decode(Int64.self)],
                    let features = PhotoFeatures(packed: try row.column("features").decode(Data.self))
                else { return nil }
                return (species, features)
            }
            return (generation, entries)
        }
    }

    // MARK: - Quota

    func quota(provider: String) throws -> ProviderQuota {
        try database.statement { session in
            guard let row = try session.row("SELECT remaining, resetsAt FROM quota WHERE provider = \(provider)") else { return ProviderQuota() }
            return ProviderQuota(
                remaining: try row.column("remaining").decode(Int?.self),
                resetsAt: try row.column("resetsAt").decode(Double?.self).map(Date.init(timeIntervalSince1970:)))
        }
    }

    func saveQuota(_ state: ProviderQuota, provider: String, now: Date) throws {
        try database.write { session in
            try session.execute(
                """
                INSERT INTO quota (provider, remaining, resetsAt, updatedAt) VALUES (\(provider), \(state.remaining), \(state.resetsAt?.timeIntervalSince1970), \(now.timeIntervalSince1970))
                ON CONFLICT (provider) DO UPDATE SET remaining = excluded.remaining, resetsAt = excluded.resetsAt, updatedAt = excluded.updatedAt
                """)
        }
    }
}

/// How canopy-identify's SQLite store moves into PostgreSQL (`canopy migrate`). Submissions
/// come along: nothing is under way (the store is stopped or a backup), so each is one a
/// process left when it ended, and the first replica's sweep clears what it stored.
public let identifyStoreImport = StoreImport(
    store: "identify", migrator: PostgresIdentificationStore.migrator,
    tables: [
        .init("identifications", key: ["id"]), .init("photoFeatures", key: ["sha256"]), .init("species", key: ["id"]),
        .init("referencePhotos", key: ["speciesID", "sha256"]), .init("plantPhotos", key: ["owner", "plantID", "sha256"]),
        .init("quota", key: ["provider"]), .init("meta", key: ["key"], seeded: true), .init("submissions", key: ["owner", "submissionKey"]),
    ])
