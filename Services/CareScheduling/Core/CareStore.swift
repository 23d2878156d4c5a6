import CanopyMessages
import CanopyStore
import Foundation
import GRDB

/// canopy-care's store: one SQLite file (GRDB, WAL) with the collection, preferences, tasks,
/// the care log and the outbox of follow-ups for other services. Every query names the
/// owner. Searching, filtering, sorting and paging happen in SQL. Thread-safe.
final class CareStore: Sendable {
    let database: DatabasePool
    let catalog: Catalog
    private let codec = MessageCodec()

    init(path: String, catalog: Catalog = .shipped) throws {
        database = try SQLiteStore.open(path: path, migrator: Self.migrator)
        self.catalog = catalog
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(sql: """
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
        return migrator
    }

    // MARK: - Plants

    /// The plant with its effective profile, or `nil` when the owner has no such plant.
    func plant(_ db: Database, owner: String, id: String) throws -> Care.Plant? {
        try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM plants WHERE owner = ? AND id = ?"), arguments: [owner, id]).map(plant)
    }

    /// The separator of list columns (common names, image ids): a control character no name holds.
    static let separator: Character = "\u{1F}"

    static func joined(_ values: [String]) -> String {
        values.map { $0.replacingOccurrences(of: String(separator), with: " ") }.joined(separator: String(separator))
    }

    static func split(_ text: String) -> [String] {
        text.isEmpty ? [] : text.split(separator: separator, omittingEmptySubsequences: false).map(String.init)
    }

    /// A plant from its row; with `profile` false the care profile is left out (listings).
    func plant(_ row: Row, profile: Bool) throws -> Care.Plant {
        let overrideData = row["profileOverride"] as Data?
        let override = profile ? overrideData.flatMap { try? codec.decode(Care.Profile.self, from: [UInt8]($0)) } : nil
        let scientificName: String = row["scientificName"]
        return Care.Plant(
            id: row["id"], scientificName: scientificName, commonNames: Self.split(row["commonNames"]),
            family: row["family"], genus: row["genus"], customName: row["customName"], location: row["location"], notes: row["notes"],
            favourite: row["favourite"], imageIDs: Self.split(row["imageIDs"]),
            identificationSource: Care.Source(rawValue: row["source"]) ?? .other, identificationConfidence: row["confidence"],
            dateIdentified: (row["dateIdentified"] as Double?).map(Date.init(timeIntervalSince1970:)),
            dateAdded: Date(timeIntervalSince1970: row["dateAdded"]),
            profile: profile ? override ?? catalog.lookup(scientificName)?.profile : nil, profileOverridden: overrideData != nil)
    }

    func plant(_ row: Row) throws -> Care.Plant { try plant(row, profile: true) }

    /// Writes every column of a plant, the derived ones included.
    func save(_ db: Database, _ plant: Care.Plant, owner: String, override: Care.Profile?) throws {
        let profile = override ?? catalog.lookup(plant.scientificName)?.profile
        let searchText = ([plant.scientificName, plant.family, plant.customName ?? ""] + plant.commonNames).joined(separator: "\u{1F}").lowercased()
        let sortName = (plant.customName ?? plant.commonNames.first ?? plant.scientificName).lowercased()
        // An upsert, not INSERT OR REPLACE: a replace deletes the row first, and the delete
        // would cascade to the plant's tasks and care log.
        try db.execute(sql: """
            INSERT INTO plants (id, owner, scientificName, commonNames, family, genus, customName, location, notes, favourite,
                imageIDs, source, confidence, dateIdentified, dateAdded, profileOverride, searchText, sortName, light, wateringDays)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (id) DO UPDATE SET scientificName = excluded.scientificName, commonNames = excluded.commonNames,
                family = excluded.family, genus = excluded.genus, customName = excluded.customName, location = excluded.location,
                notes = excluded.notes, favourite = excluded.favourite, imageIDs = excluded.imageIDs, source = excluded.source,
                confidence = excluded.confidence, dateIdentified = excluded.dateIdentified, profileOverride = excluded.profileOverride,
                searchText = excluded.searchText, sortName = excluded.sortName, light = excluded.light, wateringDays = excluded.wateringDays
            """, arguments: [
                plant.id, owner, plant.scientificName, Self.joined(plant.commonNames), plant.family, plant.genus,
                plant.customName, plant.location, plant.notes, plant.favourite, Self.joined(plant.imageIDs),
                plant.identificationSource.rawValue, plant.identificationConfidence, plant.dateIdentified?.timeIntervalSince1970,
                plant.dateAdded.timeIntervalSince1970, try override.map { Data(try codec.encode($0)) }, searchText, sortName,
                profile?.light.rawValue, profile?.wateringIntervalDays,
            ])
    }

    /// One page of the owner's plants matching `request`, and how many match in all.
    func list(owner: String, _ request: Care.ListPlants.Request) throws -> Care.ListPlants.Reply {
        var conditions = ["owner = ?"]
        var arguments: [any DatabaseValueConvertible] = [owner]
        if let search = request.search?.trimmingCharacters(in: .whitespaces).lowercased(), !search.isEmpty {
            conditions.append("searchText LIKE ? ESCAPE '\\'")
            let escaped = search.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "%", with: "\\%").replacingOccurrences(of: "_", with: "\\_")
            arguments.append("%\(escaped)%")
        }
        if let favourite = request.favourite { conditions.append("favourite = ?"); arguments.append(favourite) }
        if let family = request.family { conditions.append("family = ? COLLATE NOCASE"); arguments.append(family) }
        if let light = request.light { conditions.append("light = ?"); arguments.append(light.rawValue) }
        if let watering = request.watering {
            switch watering {
            case .often: conditions.append("wateringDays <= 4")
            case .weekly: conditions.append("wateringDays BETWEEN 5 AND 10")
            case .rarely: conditions.append("wateringDays >= 11")
            }
        }
        if let source = request.source { conditions.append("source = ?"); arguments.append(source.rawValue) }
        if let from = request.addedFrom { conditions.append("dateAdded >= ?"); arguments.append(from.timeIntervalSince1970) }
        if let to = request.addedTo { conditions.append("dateAdded < ?"); arguments.append(to.timeIntervalSince1970) }
        let direction = request.descending ? "DESC" : "ASC"
        let order = switch request.sort {
        case .dateAdded: "dateAdded \(direction), id"
        case .dateIdentified: "dateIdentified IS NULL, dateIdentified \(direction), id"
        case .name: "sortName \(direction), id"
        case .family: "family COLLATE NOCASE \(direction), sortName, id"
        }
        let filter = conditions.joined(separator: " AND ")
        return try database.read { db in
            let total = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM plants WHERE \(filter)", arguments: StatementArguments(arguments)) ?? 0
            let rows = try Row.fetchAll(db, sql: "SELECT * FROM plants WHERE \(filter) ORDER BY \(order) LIMIT ? OFFSET ?",
                                        arguments: StatementArguments(arguments + [request.limit, request.offset]))
            return Care.ListPlants.Reply(plants: try rows.map { try plant($0, profile: false) }, total: total)
        }
    }

    // MARK: - Preferences

    func preferences(_ db: Database, owner: String) throws -> Care.Preferences {
        guard let data = try Data.fetchOne(db, sql: "SELECT value FROM preferences WHERE owner = ?", arguments: [owner]) else { return Care.Preferences() }
        return (try? codec.decode(Care.Preferences.self, from: [UInt8](data))) ?? Care.Preferences()
    }

    func savePreferences(_ db: Database, _ preferences: Care.Preferences, owner: String) throws {
        try db.execute(sql: "INSERT OR REPLACE INTO preferences (owner, value) VALUES (?, ?)", arguments: [owner, Data(try codec.encode(preferences))])
    }

    // MARK: - Tasks

    static func task(_ row: Row) -> Care.Task {
        Care.Task(id: row["id"], plantID: row["plantID"], kind: Care.TaskKind(rawValue: row["kind"]) ?? .custom, title: row["title"],
                  due: Date(timeIntervalSince1970: row["due"]), snoozedUntil: (row["snoozedUntil"] as Double?).map(Date.init(timeIntervalSince1970:)))
    }

    /// (Re)writes the task of `kind` for a plant: due after `anchor`, or removed when the
    /// profile no longer calls for it.
    func schedule(_ db: Database, owner: String, plant: Care.Plant, kind: Care.TaskKind, anchor: Date, scheduler: Scheduler) throws {
        let id = "\(plant.id):\(kind.rawValue)"
        guard let profile = plant.profile, let due = scheduler.nextDue(kind, profile: profile, after: anchor) else {
            try db.execute(sql: "DELETE FROM tasks WHERE id = ?", arguments: [id])
            return
        }
        let name = plant.customName ?? plant.commonNames.first ?? plant.scientificName
        try write(db, id: id, owner: owner, plantID: plant.id, kind: kind, title: "\(kind.rawValue.capitalized) \(name)", anchor: anchor, due: due, everyDays: nil)
    }

    /// (Re)writes a custom task: due `everyDays` after `anchor`.
    func scheduleCustom(_ db: Database, id: String, owner: String, plantID: String, title: String, everyDays: Int, anchor: Date, scheduler: Scheduler) throws {
        try write(db, id: id, owner: owner, plantID: plantID, kind: .custom, title: title, anchor: anchor,
                  due: scheduler.nextDue(everyDays: everyDays, after: anchor), everyDays: everyDays)
    }

    private func write(_ db: Database, id: String, owner: String, plantID: String, kind: Care.TaskKind, title: String, anchor: Date, due: Date, everyDays: Int?) throws {
        try db.execute(sql: """
            INSERT INTO tasks (id, owner, plantID, kind, title, anchor, due, snoozedUntil, showAt, everyDays) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)
            ON CONFLICT (id) DO UPDATE SET title = excluded.title, anchor = excluded.anchor, due = excluded.due,
                snoozedUntil = NULL, showAt = excluded.showAt, everyDays = excluded.everyDays
            """, arguments: [id, owner, plantID, kind.rawValue, title, anchor.timeIntervalSince1970, due.timeIntervalSince1970, due.timeIntervalSince1970, everyDays])
    }

    /// Reschedules one task row from its anchor (after preferences change, or complete/skip).
    func reschedule(_ db: Database, row: Row, plant: Care.Plant, anchor: Date, scheduler: Scheduler) throws {
        let kind = Care.TaskKind(rawValue: row["kind"]) ?? .custom
        if kind == .custom, let everyDays = row["everyDays"] as Int? {
            try scheduleCustom(db, id: row["id"], owner: row["owner"], plantID: plant.id, title: row["title"], everyDays: everyDays, anchor: anchor, scheduler: scheduler)
        } else {
            try schedule(db, owner: row["owner"], plant: plant, kind: kind, anchor: anchor, scheduler: scheduler)
        }
    }

    /// Reschedules every task of a plant from its anchors (or `now` for new ones); custom
    /// tasks keep their own interval.
    func reschedule(_ db: Database, owner: String, plant: Care.Plant, scheduler: Scheduler, now: Date) throws {
        let rows = try Row.fetchAll(db, sql: "SELECT * FROM tasks WHERE plantID = ?", arguments: [plant.id])
        var anchors: [Care.TaskKind: Date] = [:]
        for row in rows {
            let kind = Care.TaskKind(rawValue: row["kind"]) ?? .custom
            if kind == .custom {
                try reschedule(db, row: row, plant: plant, anchor: Date(timeIntervalSince1970: row["anchor"]), scheduler: scheduler)
            } else {
                anchors[kind] = Date(timeIntervalSince1970: row["anchor"])
            }
        }
        let wanted = plant.profile.map(Scheduler.kinds(for:)) ?? []
        for kind in Care.TaskKind.allCases where kind != .custom {
            if wanted.contains(kind) {
                try schedule(db, owner: owner, plant: plant, kind: kind, anchor: anchors[kind] ?? now, scheduler: scheduler)
            } else {
                try db.execute(sql: "DELETE FROM tasks WHERE id = ?", arguments: ["\(plant.id):\(kind.rawValue)"])
            }
        }
    }

    // MARK: - Outbox

    /// Records a follow-up for another service, delivered by the outbox until confirmed.
    func enqueue(_ db: Database, owner: String, service: String, operation: String, body: [UInt8], now: Date) throws {
        try db.execute(sql: "INSERT INTO outbox (owner, service, operation, body, nextAttempt, createdAt) VALUES (?, ?, ?, ?, ?, ?)",
                       arguments: [owner, service, operation, Data(body), now.timeIntervalSince1970, now.timeIntervalSince1970])
    }

    /// Asks for the owner's reminder window to be handed over again; one pending request per
    /// owner is enough (the window is read when it is sent). A pending one is marked asked
    /// again (its generation bumped): it may be on its way with a window read before this
    /// change, and is then sent again rather than deleted (see ``Outbox``).
    func enqueueReminderSync(_ db: Database, owner: String, now: Date) throws {
        try db.execute(sql: "UPDATE outbox SET generation = generation + 1 WHERE owner = ? AND operation = ? AND attempts = 0",
                       arguments: [owner, Reminders.Sync.name])
        if db.changesCount == 0 {
            try enqueue(db, owner: owner, service: Reminders.service, operation: Reminders.Sync.name, body: [], now: now)
        }
    }
}
