import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation
import Logging
import PostgresNIO

/// canopy-care's store in PostgreSQL (``CareStoring``), which any number of canopy-care
/// replicas share: the same tables and derived columns as ``SQLiteCareStore``, the same queries.
///
/// What replicas add:
/// - Writes are serializable transactions (``PostgresStore``): two replicas changing one
///   person's collection at once behave as if one came after the other (a plant count never
///   passes the limit, a reminder sync is never enqueued twice).
/// - The outbox hands each follow-up to one replica: a pass claims its due follow-ups with a
///   lease (``FollowUp/lease``), one replica at a time (an advisory lock, then `FOR UPDATE SKIP
///   LOCKED`), and a lane whose earlier follow-up is leased to another replica waits behind
///   it, so one person's follow-ups to one service still go in order.
/// - A commit that adds a follow-up sends `NOTIFY canopy_care_outbox`: every replica's outbox
///   wakes, whichever replica wrote it.
final class PostgresCareStore: CareStoring {
    let database: PostgresStore
    let catalog: Catalog
    fileprivate let codec = MessageCodec()
    /// The channel commits that add follow-ups notify.
    static let outboxChannel = "canopy_care_outbox"

    func eraseResidue() {
        database.vacuumSoon(careStoreImport.tables.map(\.name))
    }

    private init(database: PostgresStore, catalog: Catalog) {
        self.database = database
        self.catalog = catalog
    }

    /// Connects to `url` and migrates canopy-care's tables.
    static func open(url: DatabaseURL, poolSize: Int = 8, catalog: Catalog = .shipped, waitingUpTo wait: Duration = .zero, logger: Logger) async throws
        -> PostgresCareStore
    {
        PostgresCareStore(
            database: try await PostgresStore.open(url: url, migrator: migrator, size: poolSize, waitingUpTo: wait, logger: logger), catalog: catalog)
    }

    static var migrator: PostgresMigrator {
        var migrator = PostgresMigrator(store: "care")
        migrator.register(
            "v1",
            """
            CREATE TABLE plants (
                id TEXT PRIMARY KEY,
                owner TEXT NOT NULL,
                scientificName TEXT NOT NULL,
                commonNames TEXT NOT NULL,
                family TEXT NOT NULL,
                genus TEXT NOT NULL,
                customName TEXT,
                location TEXT,
                notes TEXT,
                favourite BOOLEAN NOT NULL DEFAULT false,
                imageIDs TEXT NOT NULL,
                source TEXT NOT NULL,
                confidence DOUBLE PRECISION,
                dateIdentified DOUBLE PRECISION,
                dateAdded DOUBLE PRECISION NOT NULL,
                profileOverride BYTEA,
                -- derived once at save time, for filtering and sorting in SQL (sorted by
                -- code point, as SQLite does)
                searchText TEXT NOT NULL,
                sortName TEXT COLLATE "C" NOT NULL,
                light TEXT,
                wateringDays INTEGER,
                -- bumped by every save (the HTTP API's ETag)
                version INTEGER NOT NULL DEFAULT 1)
            """,
            "CREATE INDEX plantsByOwner ON plants(owner, id)",
            "CREATE INDEX plantsByAdded ON plants(owner, dateAdded)",
            "CREATE INDEX plantsByIdentified ON plants(owner, dateIdentified)",
            "CREATE INDEX plantsByName ON plants(owner, sortName)",
            "CREATE INDEX plantsByFamily ON plants(owner, lower(family))",
            "CREATE TABLE preferences (owner TEXT PRIMARY KEY, value BYTEA NOT NULL)",
            """
            CREATE TABLE tasks (
                id TEXT PRIMARY KEY,
                owner TEXT NOT NULL,
                plantID TEXT NOT NULL REFERENCES plants(id) ON DELETE CASCADE,
                kind TEXT NOT NULL,
                title TEXT NOT NULL,
                anchor DOUBLE PRECISION NOT NULL,
                due DOUBLE PRECISION NOT NULL,
                snoozedUntil DOUBLE PRECISION,
                showAt DOUBLE PRECISION NOT NULL,
                everyDays INTEGER)
            """,
            "CREATE INDEX tasksByPlant ON tasks(plantID, showAt)",
            "CREATE INDEX tasksByOwner ON tasks(owner, showAt)",
            """
            CREATE TABLE careLog (
                id BIGSERIAL PRIMARY KEY,
                owner TEXT NOT NULL,
                plantID TEXT NOT NULL REFERENCES plants(id) ON DELETE CASCADE,
                kind TEXT NOT NULL,
                at DOUBLE PRECISION NOT NULL)
            """,
            "CREATE INDEX careLogByPlant ON careLog(plantID, at)",
            """
            CREATE TABLE outbox (
                id BIGSERIAL PRIMARY KEY,
                owner TEXT NOT NULL,
                service TEXT NOT NULL,
                operation TEXT NOT NULL,
                body BYTEA NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0,
                nextAttempt DOUBLE PRECISION NOT NULL,
                lastError TEXT,
                createdAt DOUBLE PRECISION NOT NULL,
                generation BIGINT NOT NULL DEFAULT 0,
                -- until when the replica that read it holds it
                leasedUntil DOUBLE PRECISION)
            """,
            "CREATE INDEX outboxByNext ON outbox(nextAttempt)",
            "CREATE INDEX outboxByLane ON outbox(owner, service, id)")
        // Which replica holds a lease (``PostgresStore/holder``): one whose process is gone
        // holds nothing, whatever its lease says.
        migrator.register("v2-lease-holders", "ALTER TABLE outbox ADD COLUMN leasedBy BIGINT")
        // Callers' idempotency keys: a keyed task completion or skip is done once.
        migrator.register(
            "v3-request-keys", "CREATE TABLE requestKeys (owner TEXT NOT NULL, key TEXT NOT NULL, at DOUBLE PRECISION NOT NULL, PRIMARY KEY (owner, key))",
            "CREATE INDEX requestKeysByAge ON requestKeys(owner, at)")
        return migrator
    }

    func read<T>(_ body: (any CareReads) throws -> T) throws -> T {
        try database.read { session in try body(PostgresCareTransaction(session: session, store: self)) }
    }

    /// The person's lock first, then `READ COMMITTED`: each statement sees what the person's
    /// writes before it committed, as if they ran one after the other (under `SERIALIZABLE`
    /// sixteen snoozes of one task at once conflicted until their retries ran out). What a
    /// care write reads and writes is the person's own; a plant id someone else has is
    /// refused by ``PostgresCareTransaction/save(_:owner:override:)`` in its one statement.
    func write<T>(owner: String, _ body: (any CareWrites) throws -> T) throws -> T {
        try database.write(isolation: .readCommitted) { session in
            try session.execute("SELECT pg_advisory_xact_lock(hashtext('canopy_care:' || \(owner)))")
            return try body(PostgresCareTransaction(session: session, store: self))
        }
    }

    // MARK: - Rows

    /// The columns a plant is read from (``plant(_:profile:)``, by name).
    static let plantColumns = ColumnPositions<PlantColumn>.list

    /// The plants `rows` hold (``plantColumns``), with their profiles or not.
    fileprivate func plants(_ rows: [PostgresRandomAccessRow], profile: Bool) throws -> [Care.Plant] {
        guard let first = rows.first else { return [] }
        let columns = try ColumnPositions<PlantColumn>(first)
        return try rows.map { row in
            let overrideData = try row[columns[.profileOverride]].decode(Data?.self)
            let override = profile ? overrideData.flatMap { try? codec.decode(Care.Profile.self, from: [UInt8]($0)) } : nil
            let scientificName = try row[columns[.scientificName]].decode(String.self)
            return Care.Plant(
                id: try row[columns[.id]].decode(String.self), scientificName: scientificName,
                commonNames: SQLiteCareStore.split(try row[columns[.commonNames]].decode(String.self)),
                family: try row[columns[.family]].decode(String.self), genus: try row[columns[.genus]].decode(String.self),
                customName: try row[columns[.customName]].decode(String?.self),
                location: try row[columns[.location]].decode(String?.self), notes: try row[columns[.notes]].decode(String?.self),
                favourite: try row[columns[.favourite]].decode(Bool.self),
                imageIDs: SQLiteCareStore.split(try row[columns[.imageIDs]].decode(String.self)),
                identificationSource: Care.Source(rawValue: try row[columns[.source]].decode(String.self)) ?? .other,
                identificationConfidence: try row[columns[.confidence]].decode(Double?.self),
                dateIdentified: try row[columns[.dateIdentified]].decode(Double?.self).map(Date.init(timeIntervalSince1970:)),
                dateAdded: Date(timeIntervalSince1970: try row[columns[.dateAdded]].decode(Double.self)),
                profile: profile ? override ?? catalog.lookup(scientificName)?.profile : nil, profileOverridden: overrideData != nil,
                version: try row[columns[.version]].decode(Int.self))
        }
    }

    /// The columns a task is read from (``tasks(_:)``).
    static let taskColumns = ColumnPositions<TaskColumn>.list

    /// The tasks `rows` hold (``taskColumns``).
    fileprivate static func tasks(_ rows: [PostgresRandomAccessRow]) throws -> [StoredTask] {
        guard let first = rows.first else { return [] }
        let columns = try ColumnPositions<TaskColumn>(first)
        return try rows.map { row in
            StoredTask(
                task: Care.Task(
                    id: try row[columns[.id]].decode(String.self), plantID: try row[columns[.plantID]].decode(String.self),
                    kind: Care.TaskKind(rawValue: try row[columns[.kind]].decode(String.self)) ?? .custom,
                    title: try row[columns[.title]].decode(String.self), due: Date(timeIntervalSince1970: try row[columns[.due]].decode(Double.self)),
                    snoozedUntil: try row[columns[.snoozedUntil]].decode(Double?.self).map(Date.init(timeIntervalSince1970:))),
                owner: try row[columns[.owner]].decode(String.self),
                anchor: Date(timeIntervalSince1970: try row[columns[.anchor]].decode(Double.self)),
                everyDays: try row[columns[.everyDays]].decode(Int?.self))
        }
    }

    // MARK: - The outbox

    func dueFollowUps(now: Date, limit: Int) async throws -> [FollowUp] {
        let (database, at, until) = (self.database, now.timeIntervalSince1970, now.timeIntervalSince1970 + FollowUp.lease)
        return try await offThePool {
            try database.write(isolation: .readCommitted) { session in
                // One replica claims at a time: each claim then sees the leases of the one
                // before, so no lane is split between two replicas. A lease whose replica is
                // gone (killed mid-pass) is over at once.
                try session.execute("SELECT pg_advisory_xact_lock(hashtext('canopy_care_outbox'))")
                return try session.rows(
                    """
                    UPDATE outbox SET leasedUntil = \(until), leasedBy = \(database.holder) WHERE id IN (
                        SELECT id FROM outbox
                        WHERE nextAttempt <= \(at) AND (leasedUntil IS NULL OR leasedUntil <= \(at) OR \(unescaped: PostgresStore.holderIsGone("leasedBy")))
                          AND NOT EXISTS (SELECT 1 FROM outbox earlier
                                          WHERE earlier.owner = outbox.owner AND earlier.service = outbox.service AND earlier.id < outbox.id
                                            AND (earlier.nextAttempt > \(at)
                                                 OR (earlier.leasedUntil > \(at) AND NOT \(unescaped: PostgresStore.holderIsGone("earlier.leasedBy")))))
                        ORDER BY id LIMIT \(limit) FOR UPDATE SKIP LOCKED)
                    RETURNING id, owner, service, operation, body, attempts, generation
                    """
                ).map { row in
                    FollowUp(
                        id: try row.column("id").decode(Int64.self), owner: try row.column("owner").decode(String.self),
                        service: try row.column("service").decode(String.self),
                        operation: try row.column("operation").decode(String.self), body: [UInt8](try row.column("body").decode(Data.self)),
                        attempts: try row.column("attempts").decode(Int.self), generation: try row.column("generation").decode(Int64.self))
                }.sorted { $0.id < $1.id }
            }
        }
    }

    func settle(_ outcomes: [FollowUp.Outcome], now: Date) async throws {
        var confirmed: (ids: [Int64], generations: [Int64]) = ([], [])
        var failed: (ids: [Int64], next: [Double], errors: [String]) = ([], [], [])
        var released: [Int64] = []
        for outcome in outcomes {
            switch outcome {
            case .confirmed(let id, let generation):
                confirmed.ids.append(id)
                confirmed.generations.append(generation)
                released.append(id) // when asked again meanwhile, it stays, free to go
            case .failed(let id, let attempts, let error):
                failed.ids.append(id)
                failed.next.append(now.timeIntervalSince1970 + FollowUp.backoff(afterAttempts: attempts))
                failed.errors.append(String(error.prefix(2_000)))
            case .returned(let id):
                released.append(id)
            }
        }
        guard !outcomes.isEmpty else { return }
        let (database, settled, putOff, freed) = (self.database, confirmed, failed, released)
        try await offThePool {
            try database.write(isolation: .readCommitted) { session in
                try session.execute(
                    """
                    DELETE FROM outbox USING unnest(\(settled.ids), \(settled.generations)) AS sent(id, generation)
                    WHERE outbox.id = sent.id AND outbox.generation = sent.generation
                    """)
                try session.execute(
                    """
                    UPDATE outbox SET attempts = attempts + 1, nextAttempt = failed.next, lastError = failed.error, leasedUntil = NULL
                    FROM unnest(\(putOff.ids), \(putOff.next), \(putOff.errors)) AS failed(id, next, error) WHERE outbox.id = failed.id
                    """)
                try session.execute("UPDATE outbox SET leasedUntil = NULL WHERE id = ANY(\(freed))")
            }
        }
    }

    func nextFollowUpDue(after now: Date) async throws -> Date? {
        let (database, at) = (self.database, now.timeIntervalSince1970)
        return try await offThePool {
            // A follow-up leased to another replica comes due for this one when its lease ends.
            try database.read { session in
                try session.value(
                    Double.self,
                    """
                    SELECT MIN(GREATEST(nextAttempt, COALESCE(leasedUntil, 0))) FROM outbox
                    WHERE GREATEST(nextAttempt, COALESCE(leasedUntil, 0)) > \(at)
                    """)
            }
        }.map(Date.init(timeIntervalSince1970:))
    }

    func pendingFollowUps() async throws -> (count: Int, oldest: Date?) {
        let database = self.database
        let row = try await offThePool {
            try database.read { session in
                let row = try session.row("SELECT COUNT(*) AS count, MIN(createdAt) AS oldest FROM outbox")
                return (try row?.column("count").decode(Int.self) ?? 0, try row?.column("oldest").decode(Double?.self))
            }
        }
        return (row.0, row.1.map(Date.init(timeIntervalSince1970:)))
    }

    func observeFollowUps(_ wake: @escaping @Sendable () -> Void) async -> any FollowUpObservation {
        await database.listen(Self.outboxChannel) { _ in wake() }
    }
}

extension PostgresListening: FollowUpObservation {}

/// One transaction of a ``PostgresCareStore``: every statement canopy-care runs on a
/// person's data, as ``SQLiteCareStore``'s, in PostgreSQL's dialect.
private struct PostgresCareTransaction: CareWrites {
    let session: PostgresSession
    let store: PostgresCareStore

    // MARK: Plants

    func plant(owner: String, id: String) throws -> Care.Plant? {
        try store.plants(session.rows("SELECT \(unescaped: PostgresCareStore.plantColumns) FROM plants WHERE owner = \(owner) AND id = \(id)"), profile: true)
            .first
    }

    func hasPlant(owner: String, id: String) throws -> Bool {
        try session.value(Int.self, "SELECT 1 FROM plants WHERE id = \(id) AND owner = \(owner)") != nil
    }

    func plantIDTaken(_ id: String) throws -> Bool {
        try session.value(Int.self, "SELECT 1 FROM plants WHERE id = \(id)") != nil
    }

    func plantCount(owner: String) throws -> Int {
        try session.value(Int.self, "SELECT COUNT(*) FROM plants WHERE owner = \(owner)") ?? 0
    }

    func plants(owner: String) throws -> [Care.Plant] {
        try store.plants(session.rows("SELECT \(unescaped: PostgresCareStore.plantColumns) FROM plants WHERE owner = \(owner)"), profile: true)
    }

    func plants(owner: String, matching request: Care.ListPlants.Request) throws -> Care.ListPlants.Reply {
        var bindings = PostgresBindings()
        func bind<Value: PostgresNonThrowingEncodable>(_ value: Value) -> String {
            bindings.append(value)
            return "$\(bindings.count)"
        }
        var conditions = ["owner = \(bind(owner))"]
        if let search = request.search?.trimmingCharacters(in: .whitespaces).lowercased(), !search.isEmpty {
            let escaped = search.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "%", with: "\\%").replacingOccurrences(
                of: "_", with: "\\_")
            conditions.append("searchText LIKE \(bind("%\(escaped)%")) ESCAPE '\\'")
        }
        if let favourite = request.favourite { conditions.append("favourite = \(bind(favourite))") }
        if let family = request.family { conditions.append("lower(family) = lower(\(bind(family)))") }
        if let light = request.light { conditions.append("light = \(bind(light.rawValue))") }
        if let watering = request.watering {
            switch watering {
            case .often: conditions.append("wateringDays <= 4")
            case .weekly: conditions.append("wateringDays BETWEEN 5 AND 10")
            case .rarely: conditions.append("wateringDays >= 11")
            }
        }
        if let source = request.source { conditions.append("source = \(bind(source.rawValue))") }
        if let from = request.addedFrom { conditions.append("dateAdded >= \(bind(from.timeIntervalSince1970))") }
        if let to = request.addedTo { conditions.append("dateAdded < \(bind(to.timeIntervalSince1970))") }
        let direction = request.descending ? "DESC" : "ASC"
        let order =
            switch request.sort {
            case .dateAdded: "dateAdded \(direction), id"
            case .dateIdentified: "dateIdentified IS NULL, dateIdentified \(direction), id"
            case .name: "sortName \(direction), id"
            case .family: "lower(family) COLLATE \"C\" \(direction), sortName, id"
            }
        let filter = conditions.joined(separator: " AND ")
        let total = try session.value(Int.self, PostgresQuery(unsafeSQL: "SELECT COUNT(*) FROM plants WHERE \(filter)", binds: bindings)) ?? 0
        let page = "LIMIT \(bind(request.limit)) OFFSET \(bind(request.offset))"
        let rows = try session.rows(
            PostgresQuery(
                unsafeSQL: "SELECT \(PostgresCareStore.plantColumns) FROM plants WHERE \(filter) ORDER BY \(order) \(page)", binds: bindings))
        return Care.ListPlants.Reply(plants: try store.plants(rows, profile: false), total: total)
    }

    func statistics(owner: String, monthStart: Date, now: Date, weekEnd: Date) throws -> Care.Statistics.Reply {
        let (monthStart, now, weekEnd) = (monthStart.timeIntervalSince1970, now.timeIntervalSince1970, weekEnd.timeIntervalSince1970)
        let counts = try session.row(
            """
            SELECT COUNT(*) AS total, COUNT(*) FILTER (WHERE favourite) AS favourites, COUNT(*) FILTER (WHERE dateAdded >= \(monthStart)) AS addedThisMonth,
                   (SELECT COUNT(*) FROM tasks WHERE owner = \(owner) AND showAt >= \(now) AND showAt < \(weekEnd)) AS upcomingTasks,
                   (SELECT COUNT(*) FROM tasks WHERE owner = \(owner) AND showAt < \(now)) AS overdueTasks
            FROM plants WHERE owner = \(owner)
            """)
        func count(_ column: String) throws -> Int { try counts?.column(column).decode(Int.self) ?? 0 }
        func groups(_ column: String) throws -> [String: Int] {
            Dictionary(
                uniqueKeysWithValues: try session.rows(
                    "SELECT \(unescaped: column) AS name, COUNT(*) AS count FROM plants WHERE owner = \(owner) GROUP BY \(unescaped: column)"
                ).map { (try $0.column("name").decode(String.self), try $0.column("count").decode(Int.self)) })
        }
        return Care.Statistics.Reply(
            total: try count("total"), favourites: try count("favourites"), families: try groups("family"), sources: try groups("source"),
            addedThisMonth: try count("addedThisMonth"), upcomingTasks: try count("upcomingTasks"), overdueTasks: try count("overdueTasks"))
    }

    func save(_ plant: Care.Plant, owner: String, override: Care.Profile?) throws -> Care.Plant {
        let profile = override ?? store.catalog.lookup(plant.scientificName)?.profile
        let searchText = ([plant.scientificName, plant.family, plant.customName ?? ""] + plant.commonNames).joined(separator: "\u{1F}").lowercased()
        let sortName = (plant.customName ?? plant.commonNames.first ?? plant.scientificName).lowercased()
        let overrideData = try override.map { Data(try store.codec.encode($0)) }
        let query: PostgresQuery = try """
        INSERT INTO plants (id, owner, scientificName, commonNames, family, genus, customName, location, notes, favourite,
            imageIDs, source, confidence, dateIdentified, dateAdded, profileOverride, searchText, sortName, light, wateringDays)
        VALUES (\(plant.id), \(owner), \(plant.scientificName), \(SQLiteCareStore.joined(plant.commonNames)), \(plant.family), \(plant.genus),
            \(plant.customName), \(plant.location), \(plant.notes), \(plant.favourite), \(SQLiteCareStore.joined(plant.imageIDs)),
            \(plant.identificationSource.rawValue), \(plant.identificationConfidence), \(plant.dateIdentified?.timeIntervalSince1970),
            \(plant.dateAdded.timeIntervalSince1970), \(overrideData), \(searchText), \(sortName), \(profile?.light.rawValue),
            \(profile?.wateringIntervalDays))
        ON CONFLICT (id) DO UPDATE SET scientificName = excluded.scientificName, commonNames = excluded.commonNames,
            family = excluded.family, genus = excluded.genus, customName = excluded.customName, location = excluded.location,
            notes = excluded.notes, favourite = excluded.favourite, imageIDs = excluded.imageIDs, source = excluded.source,
            confidence = excluded.confidence, dateIdentified = excluded.dateIdentified, profileOverride = excluded.profileOverride,
            searchText = excluded.searchText, sortName = excluded.sortName, light = excluded.light, wateringDays = excluded.wateringDays,
            version = plants.version + 1
        WHERE plants.owner = excluded.owner
        RETURNING \(unescaped: PostgresCareStore.plantColumns)
        """
        // As stored, in the same round trip (an update of someone else's id changes nothing and answers nothing).
        guard let stored = try store.plants(session.rows(query), profile: true).first else {
            throw CanopyError(.conflict, "the plant id '\(plant.id)' is taken; leave id empty and one is chosen")
        }
        return stored
    }

    func deletePlant(owner: String, id: String) throws {
        try session.execute("DELETE FROM plants WHERE owner = \(owner) AND id = \(id)")
    }

    // MARK: Preferences

    func preferences(owner: String) throws -> Care.Preferences {
        guard let data = try session.value(Data.self, "SELECT value FROM preferences WHERE owner = \(owner)") else { return Care.Preferences() }
        return (try? store.codec.decode(Care.Preferences.self, from: [UInt8](data))) ?? Care.Preferences()
    }

    func plantCountAndPreferences(owner: String) throws -> (plants: Int, preferences: Care.Preferences) {
        let row = try session.row(
            "SELECT (SELECT COUNT(*) FROM plants WHERE owner = \(owner)) AS plants, (SELECT value FROM preferences WHERE owner = \(owner)) AS preferences")
        let preferences = try row?.column("preferences").decode(Data?.self).flatMap { try? store.codec.decode(Care.Preferences.self, from: [UInt8]($0)) }
        return (try row?.column("plants").decode(Int.self) ?? 0, preferences ?? Care.Preferences())
    }

    func deletePreferences(owner: String) throws {
        try session.execute("DELETE FROM preferences WHERE owner = \(owner)")
    }

    func savePreferences(_ preferences: Care.Preferences, owner: String) throws {
        let value = Data(try store.codec.encode(preferences))
        try session.execute("INSERT INTO preferences (owner, value) VALUES (\(owner), \(value)) ON CONFLICT (owner) DO UPDATE SET value = excluded.value")
    }

    // MARK: Tasks and the care log

    func task(owner: String, id: String) throws -> StoredTask? {
        try PostgresCareStore.tasks(session.rows("SELECT \(unescaped: PostgresCareStore.taskColumns) FROM tasks WHERE owner = \(owner) AND id = \(id)")).first
    }

    func tasks(owner: String, plantID: String) throws -> [StoredTask] {
        try PostgresCareStore.tasks(
            session.rows("SELECT \(unescaped: PostgresCareStore.taskColumns) FROM tasks WHERE plantID = \(plantID) AND owner = \(owner)"))
    }

    func tasks(owner: String, showingBefore before: Date?, limit: Int) throws -> [StoredTask] {
        let rows =
            if let before {
                try session.rows(
                    """
                    SELECT \(unescaped: PostgresCareStore.taskColumns) FROM tasks
                    WHERE owner = \(owner) AND showAt < \(before.timeIntervalSince1970) ORDER BY showAt, id LIMIT \(limit)
                    """)
            } else {
                try session.rows("SELECT \(unescaped: PostgresCareStore.taskColumns) FROM tasks WHERE owner = \(owner) ORDER BY showAt, id LIMIT \(limit)")
            }
        return try PostgresCareStore.tasks(rows)
    }

    func nextTask(owner: String, plantID: String) throws -> StoredTask? {
        try PostgresCareStore.tasks(
            session.rows(
                """
                SELECT \(unescaped: PostgresCareStore.taskColumns) FROM tasks WHERE plantID = \(plantID) AND owner = \(owner) ORDER BY showAt, id LIMIT 1
                """)
        ).first
    }

    func customTaskCount(owner: String, plantID: String) throws -> Int {
        try session.value(Int.self, "SELECT COUNT(*) FROM tasks WHERE plantID = \(plantID) AND owner = \(owner) AND kind = 'custom'") ?? 0
    }

    func saveTask(_ stored: StoredTask) throws {
        let task = stored.task
        try session.execute(
            """
            INSERT INTO tasks (id, owner, plantID, kind, title, anchor, due, snoozedUntil, showAt, everyDays)
            VALUES (\(task.id), \(stored.owner), \(task.plantID), \(task.kind.rawValue), \(task.title), \(stored.anchor.timeIntervalSince1970),
                    \(task.due.timeIntervalSince1970), NULL, \(task.due.timeIntervalSince1970), \(stored.everyDays))
            ON CONFLICT (id) DO UPDATE SET title = excluded.title, anchor = excluded.anchor, due = excluded.due,
                snoozedUntil = NULL, showAt = excluded.showAt, everyDays = excluded.everyDays
            """)
    }

    func deleteTask(owner: String, id: String) throws {
        try session.execute("DELETE FROM tasks WHERE owner = \(owner) AND id = \(id)")
    }

    func saveTasks(_ tasks: [StoredTask]) throws {
        guard !tasks.isEmpty else { return }
        let (ids, owners, plants) = (tasks.map(\.task.id), tasks.map(\.owner), tasks.map(\.task.plantID))
        let (kinds, titles, anchors) = (tasks.map(\.task.kind.rawValue), tasks.map(\.task.title), tasks.map(\.anchor.timeIntervalSince1970))
        let (dues, everyDays) = (tasks.map(\.task.due.timeIntervalSince1970), tasks.map { $0.everyDays.map(Int64.init) ?? -1 })
        try session.execute(
            """
            INSERT INTO tasks (id, owner, plantID, kind, title, anchor, due, snoozedUntil, showAt, everyDays)
            SELECT id, owner, plantID, kind, title, anchor, due, NULL, due, NULLIF(everyDays, -1)
            FROM unnest(\(ids), \(owners), \(plants), \(kinds), \(titles), \(anchors), \(dues), \(everyDays))
                AS new(id, owner, plantID, kind, title, anchor, due, everyDays)
            ON CONFLICT (id) DO UPDATE SET title = excluded.title, anchor = excluded.anchor, due = excluded.due,
                snoozedUntil = NULL, showAt = excluded.showAt, everyDays = excluded.everyDays
            """)
    }

    func deleteTasks(owner: String, ids: [String]) throws {
        guard !ids.isEmpty else { return }
        try session.execute("DELETE FROM tasks WHERE owner = \(owner) AND id = ANY(\(ids))")
    }

    func snoozeTask(owner: String, id: String, until: Date) throws {
        let at = until.timeIntervalSince1970
        try session.execute("UPDATE tasks SET snoozedUntil = \(at), showAt = \(at) WHERE owner = \(owner) AND id = \(id)")
    }

    func logCare(owner: String, plantID: String, kind: Care.TaskKind, at: Date) throws {
        try session.execute("INSERT INTO careLog (owner, plantID, kind, at) VALUES (\(owner), \(plantID), \(kind.rawValue), \(at.timeIntervalSince1970))")
    }

    func useRequestKey(owner: String, key: String, now: Date) throws -> Bool {
        let (at, expired, kept) = (now.timeIntervalSince1970, now.timeIntervalSince1970 - RequestKeys.lifetime, RequestKeys.maximumPerOwner - 1)
        try session.execute(
            """
            DELETE FROM requestKeys WHERE owner = \(owner) AND (at < \(expired) OR key IN
                (SELECT key FROM requestKeys WHERE owner = \(owner) ORDER BY at DESC OFFSET \(kept)))
            """)
        return try session.execute("INSERT INTO requestKeys (owner, key, at) VALUES (\(owner), \(key), \(at)) ON CONFLICT DO NOTHING") > 0
    }

    func deleteRequestKeys(owner: String) throws {
        try session.execute("DELETE FROM requestKeys WHERE owner = \(owner)")
    }

    func careLog(owner: String, plantID: String, limit: Int) throws -> [Care.LogEntry] {
        try session.rows("SELECT plantID, kind, at FROM careLog WHERE owner = \(owner) AND plantID = \(plantID) ORDER BY at DESC, id DESC LIMIT \(limit)")
            .map { row in
                Care.LogEntry(
                    plantID: try row.column("plantID").decode(String.self),
                    kind: Care.TaskKind(rawValue: try row.column("kind").decode(String.self)) ?? .custom,
                    at: Date(timeIntervalSince1970: try row.column("at").decode(Double.self)))
            }
    }

    // MARK: Follow-ups

    func enqueue(owner: String, service: String, operation: String, body: [UInt8], now: Date) throws {
        let (data, at) = (Data(body), now.timeIntervalSince1970)
        // Written and announced in one round trip (every replica's outbox wakes on commit).
        try session.execute(
            """
            WITH written AS (
                INSERT INTO outbox (owner, service, operation, body, nextAttempt, createdAt) VALUES (\(owner), \(service), \(operation), \(data), \(at), \(at))
                RETURNING id)
            SELECT pg_notify(\(PostgresCareStore.outboxChannel), '') FROM written
            """)
    }

    func enqueueReminderSync(owner: String, now: Date) throws {
        // A pending one asked again, else a new one, and the announcement: one round trip.
        let at = now.timeIntervalSince1970
        try session.execute(
            """
            WITH asked AS (
                UPDATE outbox SET generation = generation + 1 WHERE owner = \(owner) AND operation = \(Reminders.Sync.name) AND attempts = 0 RETURNING id),
            written AS (
                INSERT INTO outbox (owner, service, operation, body, nextAttempt, createdAt)
                SELECT \(owner), \(Reminders.service), \(Reminders.Sync.name), ''::BYTEA, \(at), \(at) WHERE NOT EXISTS (SELECT 1 FROM asked)
                RETURNING id)
            SELECT pg_notify(\(PostgresCareStore.outboxChannel), '')
            """)
    }
}

/// How canopy-care's SQLite store moves into PostgreSQL (`canopy migrate`).
public let careStoreImport = StoreImport(
    store: "care", migrator: PostgresCareStore.migrator,
    tables: [
        .init("plants", key: ["id"]), .init("preferences", key: ["owner"]), .init("tasks", key: ["id"]), .init("careLog"), .init("outbox", key: ["id"]),
        .init("requestKeys", key: ["owner", "key"]),
    ])
