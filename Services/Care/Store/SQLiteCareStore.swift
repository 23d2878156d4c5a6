import CanopyMessages
import CanopyStore
import Foundation
import GRDB

/// canopy-care's store in SQLite (``CareStoring``): one file (GRDB, WAL) with the collection,
/// preferences, tasks, the care log and the outbox of follow-ups for other services. Every
/// query names the owner. Searching, filtering, sorting and paging happen in SQL; the columns
/// they use (search text, sort name, light, watering interval) are derived once, when a plant
/// is saved. Thread-safe.
final class SQLiteCareStore: CareStoring {
    let database: DatabasePool
    let catalog: Catalog
    fileprivate let codec = MessageCodec()

    func eraseResidue() {
        SQLiteStore.eraseResidue(database)
    }

    init(path: String, catalog: Catalog = .shipped) throws {
        database = try SQLiteStore.open(path: path, migrator: Self.migrator)
        self.catalog = catalog
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(
                sql: """
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
                        favourite INTEGER NOT NULL DEFAULT 0,
                        imageIDs TEXT NOT NULL,
                        source TEXT NOT NULL,
                        confidence DOUBLE,
                        dateIdentified DOUBLE,
                        dateAdded DOUBLE NOT NULL,
                        profileOverride BLOB,
                        -- derived once at save time, for filtering and sorting in SQL
                        searchText TEXT NOT NULL,
                        sortName TEXT NOT NULL,
                        light TEXT,
                        wateringDays INTEGER);
                    CREATE INDEX plantsByAdded ON plants(owner, dateAdded);
                    CREATE INDEX plantsByIdentified ON plants(owner, dateIdentified);
                    CREATE INDEX plantsByName ON plants(owner, sortName);
                    CREATE INDEX plantsByFamily ON plants(owner, family COLLATE NOCASE);
                    CREATE TABLE preferences (owner TEXT PRIMARY KEY, value BLOB NOT NULL);
                    CREATE TABLE tasks (
                        id TEXT PRIMARY KEY,
                        owner TEXT NOT NULL,
                        plantID TEXT NOT NULL REFERENCES plants(id) ON DELETE CASCADE,
                        kind TEXT NOT NULL,
                        title TEXT NOT NULL,
                        anchor DOUBLE NOT NULL,
                        due DOUBLE NOT NULL,
                        snoozedUntil DOUBLE,
                        showAt DOUBLE NOT NULL,
                        -- custom tasks: their interval in days
                        everyDays INTEGER);
                    CREATE INDEX tasksByPlant ON tasks(plantID);
                    CREATE INDEX tasksByOwner ON tasks(owner, showAt);
                    CREATE TABLE careLog (
                        owner TEXT NOT NULL,
                        plantID TEXT NOT NULL REFERENCES plants(id) ON DELETE CASCADE,
                        kind TEXT NOT NULL,
                        at DOUBLE NOT NULL);
                    CREATE INDEX careLogByPlant ON careLog(plantID, at);
                    CREATE TABLE outbox (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        owner TEXT NOT NULL,
                        service TEXT NOT NULL,
                        operation TEXT NOT NULL,
                        body BLOB NOT NULL,
                        attempts INTEGER NOT NULL DEFAULT 0,
                        nextAttempt DOUBLE NOT NULL,
                        lastError TEXT);
                    CREATE INDEX outboxByNext ON outbox(nextAttempt);
                    """)
        }
        migrator.registerMigration("v2-outbox-created") { db in
            // When a follow-up was written, for the age of the oldest pending one (older rows
            // count from their next attempt).
            try db.execute(sql: "ALTER TABLE outbox ADD COLUMN createdAt DOUBLE")
        }
        migrator.registerMigration("v3-outbox-generation") { db in
            // Bumped when a change asks again for a reminder sync that is already pending: the
            // outbox deletes a sent row only when no change asked since it read the window.
            try db.execute(sql: "ALTER TABLE outbox ADD COLUMN generation INTEGER NOT NULL DEFAULT 0")
        }
        migrator.registerMigration("v4-outbox-lanes") { db in
            // One person's follow-ups to one service go in order: a row waits behind an earlier
            // one of its lane that is waiting for a retry.
            try db.execute(sql: "CREATE INDEX outboxByLane ON outbox(owner, service, id)")
        }
        migrator.registerMigration("v5-plant-version") { db in
            // Bumped by every save: the HTTP API's ETag, checked by updates made against a version.
            try db.execute(sql: "ALTER TABLE plants ADD COLUMN version INTEGER NOT NULL DEFAULT 1")
        }
        migrator.registerMigration("v6-request-keys") { db in
            // Callers' idempotency keys: a keyed task completion or skip is done once.
            try db.execute(
                sql: """
                    CREATE TABLE requestKeys (owner TEXT NOT NULL, key TEXT NOT NULL, at DOUBLE NOT NULL, PRIMARY KEY (owner, key));
                    CREATE INDEX requestKeysByAge ON requestKeys(owner, at);
                    """)
        }
        return migrator
    }

    func read<T>(_ body: (any CareReads) throws -> T) throws -> T {
        try database.tracedRead { db in try body(Transaction(db: db, store: self)) }
    }

    /// SQLite has one writer: every write runs after the one before.
    func write<T>(owner: String, _ body: (any CareWrites) throws -> T) throws -> T {
        try database.tracedWrite { db in try body(Transaction(db: db, store: self)) }
    }

    // MARK: - Rows

    /// The separator of list columns (common names, image ids): a control character no name holds.
    static let separator: Character = "\u{1F}"

    static func joined(_ values: [String]) -> String {
        values.map { $0.replacingOccurrences(of: String(separator), with: " ") }.joined(separator: String(separator))
    }

    static func split(_ text: String) -> [String] {
        text.isEmpty ? [] : text.split(separator: separator, omittingEmptySubsequences: false).map(String.init)
    }

    /// The plants `statement` answers (`SELECT *` of plants), with their profiles or not.
    fileprivate func plants(_ statement: Statement, _ arguments: StatementArguments, profile: Bool) throws -> [Care.Plant] {
        let columns = try ColumnPositions<PlantColumn>(statement)
        return try Array(Row.fetchCursor(statement, arguments: arguments).map { self.plant($0, columns, profile: profile) })
    }

    /// A plant from its row; with `profile` false the care profile is left out (listings).
    private func plant(_ row: Row, _ columns: ColumnPositions<PlantColumn>, profile: Bool) -> Care.Plant {
        let overrideData = row[columns[.profileOverride]] as Data?
        let override = profile ? overrideData.flatMap { try? codec.decode(Care.Profile.self, from: [UInt8]($0)) } : nil
        let scientificName: String = row[columns[.scientificName]]
        return Care.Plant(
            id: row[columns[.id]], scientificName: scientificName, commonNames: Self.split(row[columns[.commonNames]]),
            family: row[columns[.family]], genus: row[columns[.genus]], customName: row[columns[.customName]], location: row[columns[.location]],
            notes: row[columns[.notes]], favourite: row[columns[.favourite]], imageIDs: Self.split(row[columns[.imageIDs]]),
            identificationSource: Care.Source(rawValue: row[columns[.source]]) ?? .other, identificationConfidence: row[columns[.confidence]],
            dateIdentified: (row[columns[.dateIdentified]] as Double?).map(Date.init(timeIntervalSince1970:)),
            dateAdded: Date(timeIntervalSince1970: row[columns[.dateAdded]]),
            profile: profile ? override ?? catalog.lookup(scientificName)?.profile : nil, profileOverridden: overrideData != nil,
            version: row[columns[.version]])
    }

    /// The tasks `statement` answers (`SELECT *` of tasks).
    fileprivate static func tasks(_ statement: Statement, _ arguments: StatementArguments) throws -> [StoredTask] {
        let columns = try ColumnPositions<TaskColumn>(statement)
        return try Array(
            Row.fetchCursor(statement, arguments: arguments).map { row in
                StoredTask(
                    task: Care.Task(
                        id: row[columns[.id]], plantID: row[columns[.plantID]], kind: Care.TaskKind(rawValue: row[columns[.kind]]) ?? .custom,
                        title: row[columns[.title]], due: Date(timeIntervalSince1970: row[columns[.due]]),
                        snoozedUntil: (row[columns[.snoozedUntil]] as Double?).map(Date.init(timeIntervalSince1970:))),
                    owner: row[columns[.owner]], anchor: Date(timeIntervalSince1970: row[columns[.anchor]]), everyDays: row[columns[.everyDays]])
            })
    }

    // MARK: - The outbox

    func dueFollowUps(now: Date, limit: Int) async throws -> [FollowUp] {
        try await database.tracedRead { db in
            // Due, and not behind an earlier follow-up of its lane that waits for a retry.
            try Row.fetchAll(
                db,
                sql: """
                    SELECT id, owner, service, operation, body, attempts, generation FROM outbox
                    WHERE nextAttempt <= ?1
                      AND NOT EXISTS (SELECT 1 FROM outbox earlier INDEXED BY outboxByLane
                                      WHERE earlier.owner = outbox.owner AND earlier.service = outbox.service
                                        AND earlier.id < outbox.id AND earlier.nextAttempt > ?1)
                    ORDER BY id LIMIT ?2
                    """, arguments: [now.timeIntervalSince1970, limit]
            ).map { row in
                FollowUp(
                    id: row["id"], owner: row["owner"], service: row["service"], operation: row["operation"],
                    body: [UInt8](row["body"] as Data? ?? Data()), attempts: row["attempts"], generation: row["generation"])
            }
        }
    }

    func settle(_ outcomes: [FollowUp.Outcome], now: Date) async throws {
        try await database.tracedWrite { db in
            let confirm = try db.cachedStatement(sql: "DELETE FROM outbox WHERE id = ? AND generation = ?")
            let putOff = try db.cachedStatement(sql: "UPDATE outbox SET attempts = attempts + 1, nextAttempt = ?, lastError = ? WHERE id = ?")
            for outcome in outcomes {
                switch outcome {
                case .confirmed(let id, let generation):
                    try confirm.execute(arguments: [id, generation])
                case .failed(let id, let attempts, let error):
                    try putOff.execute(arguments: [now.timeIntervalSince1970 + FollowUp.backoff(afterAttempts: attempts), String(error.prefix(2_000)), id])
                case .returned:
                    break // one process sends: nothing is held
                }
            }
        }
    }

    func nextFollowUpDue(after now: Date) async throws -> Date? {
        try await database.tracedRead { db in
            try Double.fetchOne(db, sql: "SELECT MIN(nextAttempt) FROM outbox WHERE nextAttempt > ?", arguments: [now.timeIntervalSince1970])
        }.map(Date.init(timeIntervalSince1970:))
    }

    func pendingFollowUps() async throws -> (count: Int, oldest: Date?) {
        let (count, first) = try await database.tracedRead { db -> (Int, Double?) in
            let row = try Row.fetchOne(db, sql: "SELECT COUNT(*) AS n, MIN(COALESCE(createdAt, nextAttempt)) AS first FROM outbox")
            return (row?["n"] as Int? ?? 0, row?["first"] as Double?)
        }
        return (count, first.map(Date.init(timeIntervalSince1970:)))
    }

    func observeFollowUps(_ wake: @escaping @Sendable () -> Void) async -> any FollowUpObservation {
        let observer = OutboxCommits(wake: wake, database: database)
        database.add(transactionObserver: observer, extent: .observerLifetime)
        return observer
    }
}

/// One transaction of a ``SQLiteCareStore``: every statement canopy-care runs on a person's data.
private struct Transaction: CareWrites {
    let db: Database
    let store: SQLiteCareStore

    // MARK: Plants

    func plant(owner: String, id: String) throws -> Care.Plant? {
        try store.plants(db.cachedStatement(sql: "SELECT * FROM plants WHERE owner = ? AND id = ?"), [owner, id], profile: true).first
    }

    func hasPlant(owner: String, id: String) throws -> Bool {
        try Bool.fetchOne(db.cachedStatement(sql: "SELECT 1 FROM plants WHERE id = ? AND owner = ?"), arguments: [id, owner]) != nil
    }

    func plantIDTaken(_ id: String) throws -> Bool {
        try Bool.fetchOne(db, sql: "SELECT 1 FROM plants WHERE id = ?", arguments: [id]) ?? false
    }

    func plantCount(owner: String) throws -> Int {
        try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM plants WHERE owner = ?", arguments: [owner]) ?? 0
    }

    func plants(owner: String) throws -> [Care.Plant] {
        try store.plants(db.cachedStatement(sql: "SELECT * FROM plants WHERE owner = ?"), [owner], profile: true)
    }

    func plants(owner: String, matching request: Care.ListPlants.Request) throws -> Care.ListPlants.Reply {
        var conditions = ["owner = ?"]
        var arguments: [any DatabaseValueConvertible] = [owner]
        if let search = request.search?.trimmingCharacters(in: .whitespaces).lowercased(), !search.isEmpty {
            conditions.append("searchText LIKE ? ESCAPE '\\'")
            let escaped = search.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "%", with: "\\%").replacingOccurrences(
                of: "_", with: "\\_")
            arguments.append("%\(escaped)%")
        }
        if let favourite = request.favourite {
            conditions.append("favourite = ?")
            arguments.append(favourite)
        }
        if let family = request.family {
            conditions.append("family = ? COLLATE NOCASE")
            arguments.append(family)
        }
        if let light = request.light {
            conditions.append("light = ?")
            arguments.append(light.rawValue)
        }
        if let watering = request.watering {
            switch watering {
            case .often: conditions.append("wateringDays <= 4")
            case .weekly: conditions.append("wateringDays BETWEEN 5 AND 10")
            case .rarely: conditions.append("wateringDays >= 11")
            }
        }
        if let source = request.source {
            conditions.append("source = ?")
            arguments.append(source.rawValue)
        }
        if let from = request.addedFrom {
            conditions.append("dateAdded >= ?")
            arguments.append(from.timeIntervalSince1970)
        }
        if let to = request.addedTo {
            conditions.append("dateAdded < ?")
            arguments.append(to.timeIntervalSince1970)
        }
        let direction = request.descending ? "DESC" : "ASC"
        let order =
            switch request.sort {
            case .dateAdded: "dateAdded \(direction), id"
            case .dateIdentified: "dateIdentified IS NULL, dateIdentified \(direction), id"
            case .name: "sortName \(direction), id"
            case .family: "family COLLATE NOCASE \(direction), sortName, id"
            }
        let filter = conditions.joined(separator: " AND ")
        let total = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM plants WHERE \(filter)", arguments: StatementArguments(arguments)) ?? 0
        let plants = try store.plants(
            db.makeStatement(sql: "SELECT * FROM plants WHERE \(filter) ORDER BY \(order) LIMIT ? OFFSET ?"),
            StatementArguments(arguments + [request.limit, request.offset]), profile: false)
        return Care.ListPlants.Reply(plants: plants, total: total)
    }

    func statistics(owner: String, monthStart: Date, now: Date, weekEnd: Date) throws -> Care.Statistics.Reply {
        func count(_ sql: String, _ arguments: StatementArguments) throws -> Int { try Int.fetchOne(db, sql: sql, arguments: arguments) ?? 0 }
        func groups(_ column: String) throws -> [String: Int] {
            Dictionary(
                uniqueKeysWithValues: try Row.fetchAll(
                    db, sql: "SELECT \(column) AS key, COUNT(*) AS n FROM plants WHERE owner = ? GROUP BY \(column)",
                    arguments: [owner]
                ).map { ($0["key"] as String, $0["n"] as Int) })
        }
        return Care.Statistics.Reply(
            total: try count("SELECT COUNT(*) FROM plants WHERE owner = ?", [owner]),
            favourites: try count("SELECT COUNT(*) FROM plants WHERE owner = ? AND favourite", [owner]),
            families: try groups("family"), sources: try groups("source"),
            addedThisMonth: try count("SELECT COUNT(*) FROM plants WHERE owner = ? AND dateAdded >= ?", [owner, monthStart.timeIntervalSince1970]),
            upcomingTasks: try count(
                "SELECT COUNT(*) FROM tasks WHERE owner = ? AND showAt >= ? AND showAt < ?",
                [owner, now.timeIntervalSince1970, weekEnd.timeIntervalSince1970]),
            overdueTasks: try count("SELECT COUNT(*) FROM tasks WHERE owner = ? AND showAt < ?", [owner, now.timeIntervalSince1970]))
    }

    func save(_ plant: Care.Plant, owner: String, override: Care.Profile?) throws -> Care.Plant {
        let profile = override ?? store.catalog.lookup(plant.scientificName)?.profile
        let searchText = ([plant.scientificName, plant.family, plant.customName ?? ""] + plant.commonNames).joined(separator: "\u{1F}").lowercased()
        let sortName = (plant.customName ?? plant.commonNames.first ?? plant.scientificName).lowercased()
        // An upsert, not INSERT OR REPLACE: a replace deletes the row first, and the delete
        // would cascade to the plant's tasks and care log.
        try db.execute(
            sql: """
                INSERT INTO plants (id, owner, scientificName, commonNames, family, genus, customName, location, notes, favourite,
                    imageIDs, source, confidence, dateIdentified, dateAdded, profileOverride, searchText, sortName, light, wateringDays)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (id) DO UPDATE SET scientificName = excluded.scientificName, commonNames = excluded.commonNames,
                    family = excluded.family, genus = excluded.genus, customName = excluded.customName, location = excluded.location,
                    notes = excluded.notes, favourite = excluded.favourite, imageIDs = excluded.imageIDs, source = excluded.source,
                    confidence = excluded.confidence, dateIdentified = excluded.dateIdentified, profileOverride = excluded.profileOverride,
                    searchText = excluded.searchText, sortName = excluded.sortName, light = excluded.light, wateringDays = excluded.wateringDays,
                    version = plants.version + 1
                """,
            arguments: [
                plant.id, owner, plant.scientificName, SQLiteCareStore.joined(plant.commonNames), plant.family, plant.genus,
                plant.customName, plant.location, plant.notes, plant.favourite, SQLiteCareStore.joined(plant.imageIDs),
                plant.identificationSource.rawValue, plant.identificationConfidence, plant.dateIdentified?.timeIntervalSince1970,
                plant.dateAdded.timeIntervalSince1970, try override.map { Data(try store.codec.encode($0)) }, searchText, sortName,
                profile?.light.rawValue, profile?.wateringIntervalDays,
            ])
        return try self.plant(owner: owner, id: plant.id)!
    }

    func deletePlant(owner: String, id: String) throws {
        try db.execute(sql: "DELETE FROM plants WHERE owner = ? AND id = ?", arguments: [owner, id])
    }

    // MARK: Preferences

    func preferences(owner: String) throws -> Care.Preferences {
        guard let data = try Data.fetchOne(db, sql: "SELECT value FROM preferences WHERE owner = ?", arguments: [owner]) else { return Care.Preferences() }
        return (try? store.codec.decode(Care.Preferences.self, from: [UInt8](data))) ?? Care.Preferences()
    }

    func deletePreferences(owner: String) throws {
        try db.execute(sql: "DELETE FROM preferences WHERE owner = ?", arguments: [owner])
    }

    func savePreferences(_ preferences: Care.Preferences, owner: String) throws {
        try db.execute(sql: "INSERT OR REPLACE INTO preferences (owner, value) VALUES (?, ?)", arguments: [owner, Data(try store.codec.encode(preferences))])
    }

    // MARK: Tasks and the care log

    func task(owner: String, id: String) throws -> StoredTask? {
        try SQLiteCareStore.tasks(db.cachedStatement(sql: "SELECT * FROM tasks WHERE owner = ? AND id = ?"), [owner, id]).first
    }

    func tasks(owner: String, plantID: String) throws -> [StoredTask] {
        // By the plant's index: SQLite's planner would take the owner's (every task of the
        // person) for the two equalities, and a collection of 500 plants made saves 25% slower.
        try SQLiteCareStore.tasks(db.cachedStatement(sql: "SELECT * FROM tasks INDEXED BY tasksByPlant WHERE plantID = ? AND owner = ?"), [plantID, owner])
    }

    func tasks(owner: String, showingBefore before: Date?, limit: Int) throws -> [StoredTask] {
        if let before {
            return try SQLiteCareStore.tasks(
                db.cachedStatement(sql: "SELECT * FROM tasks WHERE owner = ? AND showAt < ? ORDER BY showAt, id LIMIT ?"),
                [owner, before.timeIntervalSince1970, limit])
        }
        return try SQLiteCareStore.tasks(db.cachedStatement(sql: "SELECT * FROM tasks WHERE owner = ? ORDER BY showAt, id LIMIT ?"), [owner, limit])
    }

    func nextTask(owner: String, plantID: String) throws -> StoredTask? {
        try SQLiteCareStore.tasks(
            db.cachedStatement(sql: "SELECT * FROM tasks INDEXED BY tasksByPlant WHERE plantID = ? AND owner = ? ORDER BY showAt, id LIMIT 1"),
            [plantID, owner]
        ).first
    }

    func customTaskCount(owner: String, plantID: String) throws -> Int {
        try Int.fetchOne(
            db, sql: "SELECT COUNT(*) FROM tasks INDEXED BY tasksByPlant WHERE plantID = ? AND owner = ? AND kind = 'custom'",
            arguments: [plantID, owner]) ?? 0
    }

    func saveTask(_ stored: StoredTask) throws {
        let task = stored.task
        try db.execute(
            sql: """
                INSERT INTO tasks (id, owner, plantID, kind, title, anchor, due, snoozedUntil, showAt, everyDays) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)
                ON CONFLICT (id) DO UPDATE SET title = excluded.title, anchor = excluded.anchor, due = excluded.due,
                    snoozedUntil = NULL, showAt = excluded.showAt, everyDays = excluded.everyDays
                """,
            arguments: [
                task.id, stored.owner, task.plantID, task.kind.rawValue, task.title, stored.anchor.timeIntervalSince1970,
                task.due.timeIntervalSince1970, task.due.timeIntervalSince1970, stored.everyDays,
            ])
    }

    func deleteTask(owner: String, id: String) throws {
        try db.execute(sql: "DELETE FROM tasks WHERE owner = ? AND id = ?", arguments: [owner, id])
    }

    func snoozeTask(owner: String, id: String, until: Date) throws {
        try db.execute(
            sql: "UPDATE tasks SET snoozedUntil = ?, showAt = ? WHERE owner = ? AND id = ?",
            arguments: [until.timeIntervalSince1970, until.timeIntervalSince1970, owner, id])
    }

    func logCare(owner: String, plantID: String, kind: Care.TaskKind, at: Date) throws {
        try db.execute(
            sql: "INSERT INTO careLog (owner, plantID, kind, at) VALUES (?, ?, ?, ?)",
            arguments: [owner, plantID, kind.rawValue, at.timeIntervalSince1970])
    }

    func useRequestKey(owner: String, key: String, now: Date) throws -> Bool {
        let at = now.timeIntervalSince1970
        try db.execute(
            sql: """
                DELETE FROM requestKeys WHERE owner = ? AND (at < ? OR key IN
                    (SELECT key FROM requestKeys WHERE owner = ? ORDER BY at DESC LIMIT -1 OFFSET ?))
                """, arguments: [owner, at - RequestKeys.lifetime, owner, RequestKeys.maximumPerOwner - 1])
        try db.execute(sql: "INSERT OR IGNORE INTO requestKeys (owner, key, at) VALUES (?, ?, ?)", arguments: [owner, key, at])
        return db.changesCount > 0
    }

    func deleteRequestKeys(owner: String) throws {
        try db.execute(sql: "DELETE FROM requestKeys WHERE owner = ?", arguments: [owner])
    }

    func careLog(owner: String, plantID: String, limit: Int) throws -> [Care.LogEntry] {
        try Row.fetchAll(
            db, sql: "SELECT * FROM careLog WHERE owner = ? AND plantID = ? ORDER BY at DESC LIMIT ?",
            arguments: [owner, plantID, limit]
        ).map {
            Care.LogEntry(plantID: $0["plantID"], kind: Care.TaskKind(rawValue: $0["kind"]) ?? .custom, at: Date(timeIntervalSince1970: $0["at"]))
        }
    }

    // MARK: Follow-ups

    func enqueue(owner: String, service: String, operation: String, body: [UInt8], now: Date) throws {
        try db.execute(
            sql: "INSERT INTO outbox (owner, service, operation, body, nextAttempt, createdAt) VALUES (?, ?, ?, ?, ?, ?)",
            arguments: [owner, service, operation, Data(body), now.timeIntervalSince1970, now.timeIntervalSince1970])
    }

    func enqueueReminderSync(owner: String, now: Date) throws {
        try db.execute(
            sql: "UPDATE outbox SET generation = generation + 1 WHERE owner = ? AND operation = ? AND attempts = 0",
            arguments: [owner, Reminders.Sync.name])
        if db.changesCount == 0 {
            try enqueue(owner: owner, service: Reminders.service, operation: Reminders.Sync.name, body: [], now: now)
        }
    }
}

/// Calls back when a transaction that added or changed follow-ups commits.
private final class OutboxCommits: TransactionObserver, FollowUpObservation, @unchecked Sendable {
    private let wake: @Sendable () -> Void
    private weak var database: DatabasePool?
    /// Whether the transaction under way touched the outbox (the writer's thread only).
    private var touched = false

    init(wake: @escaping @Sendable () -> Void, database: DatabasePool) {
        self.wake = wake
        self.database = database
    }

    func stop() { database?.remove(transactionObserver: self) }

    func observes(eventsOfKind eventKind: DatabaseEventKind) -> Bool {
        switch eventKind {
        case .insert(let table), .update(let table, _): table == "outbox"
        case .delete: false
        }
    }

    func databaseDidChange(with event: DatabaseEvent) {
        touched = true
    }

    func databaseDidCommit(_ db: Database) {
        guard touched else { return }
        touched = false
        wake()
    }

    func databaseDidRollback(_ db: Database) {
        touched = false
    }
}
