import CanopyBus
import CanopyMessages
import Collections
import CanopyServiceKit
import Foundation
import GRDB

/// canopy-care's operations, each scoped to its owner. Requests arrive validated (the
/// runtime checks every field before a handler runs), so nothing here checks them again.
/// Thread-safe.
final class CareLibrary: Sendable {
    /// The time it goes by (`--clock`).
    let clock: ServiceClock
    let store: CareStore
    /// Tasks handed to canopy-remind per person (the pending local notifications an iPhone keeps).
    let reminderWindow: Int
    /// Plants one person may keep.
    let maximumPlants: Int
    private let codec = MessageCodec()

    init(store: CareStore, reminderWindow: Int = 64, maximumPlants: Int = Care.Limits.plantsPerPerson, clock: ServiceClock = .system) {
        self.clock = clock
        self.store = store
        self.reminderWindow = reminderWindow
        self.maximumPlants = maximumPlants
    }

    private func notFound(_ id: String) -> CanopyError {
        CanopyError(.notFound, "no plant \(id) in your collection; care.plants.list shows them")
    }

    // MARK: - Plants

    /// Adds a plant. With an id chosen by the caller (canopy-identify files photos under the
    /// plant id before the plant exists), adding again answers the plant already added, so a
    /// retried call makes no second plant; an id someone else's plant has is refused.
    func add(_ plant: Care.Plant, owner: String, now: Date? = nil) throws -> Care.Plant {
        let now = now ?? clock.now()
        var plant = plant
        let chosenID = !plant.id.isEmpty
        if !chosenID { plant.id = UUID().uuidString.lowercased() }
        plant.dateAdded = now
        if let species = store.catalog.lookup(plant.scientificName) {
            if plant.family.isEmpty { plant.family = species.family }
            if plant.commonNames.isEmpty { plant.commonNames = species.commonNames }
        }
        if plant.genus.isEmpty { plant.genus = String(plant.scientificName.split(separator: " ").first ?? "") }
        let override = plant.profileOverridden ? plant.profile : nil
        return try store.database.write { db in
            if chosenID {
                if let existing = try store.plant(db, owner: owner, id: plant.id) { return existing }
                if try Bool.fetchOne(db, sql: "SELECT 1 FROM plants WHERE id = ?", arguments: [plant.id]) ?? false {
                    throw CanopyError(.conflict, "the plant id '\(plant.id)' is taken; leave id empty and one is chosen")
                }
            }
            let count = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM plants WHERE owner = ?", arguments: [owner]) ?? 0
            guard count < maximumPlants else {
                throw CanopyError(.tooLarge, "your collection has \(count) plants, the most one person may keep; delete some before adding more")
            }
            let scheduler = try Scheduler(preferences: try store.preferences(db, owner: owner))
            try store.save(db, plant, owner: owner, override: override)
            let saved = try store.plant(db, owner: owner, id: plant.id)!
            try store.reschedule(db, owner: owner, plant: saved, scheduler: scheduler, now: now)
            try store.enqueueReminderSync(db, owner: owner, now: now)
            return saved
        }
    }

    func get(_ id: String, owner: String) throws -> Care.Plant {
        guard let plant = try store.database.read({ db in try store.plant(db, owner: owner, id: id) }) else { throw notFound(id) }
        return plant
    }

    func update(_ plant: Care.Plant, owner: String, now: Date? = nil) throws -> Care.Plant {
        let now = now ?? clock.now()
        return try store.database.write { db in
            guard let existing = try store.plant(db, owner: owner, id: plant.id) else { throw notFound(plant.id) }
            var updated = plant
            updated.dateAdded = existing.dateAdded
            if updated.genus.isEmpty { updated.genus = String(updated.scientificName.split(separator: " ").first ?? "") }
            let override = plant.profileOverridden ? plant.profile : nil
            try store.save(db, updated, owner: owner, override: override)
            let saved = try store.plant(db, owner: owner, id: plant.id)!
            if saved.profile != existing.profile {
                try store.reschedule(db, owner: owner, plant: saved, scheduler: try Scheduler(preferences: try store.preferences(db, owner: owner)), now: now)
                try store.enqueueReminderSync(db, owner: owner, now: now)
            }
            return saved
        }
    }

    /// Deletes the plant with its tasks and log (cascade), and records in the same
    /// transaction the follow-ups: cancel its reminders, purge its images, forget its
    /// identifications.
    func delete(_ id: String, owner: String, now: Date? = nil) throws {
        let now = now ?? clock.now()
        try store.database.write { db in
            guard try store.plant(db, owner: owner, id: id) != nil else { return } // deleting twice is fine
            try db.execute(sql: "DELETE FROM plants WHERE owner = ? AND id = ?", arguments: [owner, id])
            try store.enqueue(db, owner: owner, service: Reminders.service, operation: Reminders.CancelPlant.name,
                              body: try codec.encode(Reminders.CancelPlant.Request(plantID: id)), now: now)
            try store.enqueue(db, owner: owner, service: Images.service, operation: Images.Purge.name,
                              body: try codec.encode(Images.Purge.Request(plantID: id)), now: now)
            try store.enqueue(db, owner: owner, service: Identification.service, operation: Identification.ForgetPlant.name,
                              body: try codec.encode(Identification.ForgetPlant.Request(plantID: id)), now: now)
            try store.enqueueReminderSync(db, owner: owner, now: now)
        }
    }

    /// A page of the collection. The page ends early when the next plant would take the
    /// reply past `replyBytes` (the broker's frame limit); `nextOffset` says where to go on.
    func list(_ request: Care.ListPlants.Request, owner: String, replyBytes: Int = RequestContext.defaultMaximumReplyBytes) throws -> Care.ListPlants.Reply {
        var reply = try store.list(owner: owner, request)
        var budget = replyBytes - 1_024
        let fitting = reply.plants.prefix { plant in
            budget -= plant.listingBytesBound
            return budget >= 0
        }
        guard !fitting.isEmpty || reply.plants.isEmpty else {
            throw CanopyError(.tooLarge, "one plant of this page is larger than the broker's frame limit of \(replyBytes) bytes; raise --max-frame-bytes")
        }
        reply.plants = Array(fitting)
        let next = request.offset + reply.plants.count
        reply.nextOffset = next < reply.total ? next : nil
        return reply
    }

    func statistics(owner: String, now: Date? = nil) throws -> Care.Statistics.Reply {
        let now = now ?? clock.now()
        return try store.database.read { db in
            let scheduler = try Scheduler(preferences: try store.preferences(db, owner: owner))
            let monthStart = scheduler.calendar.date(from: scheduler.calendar.dateComponents([.year, .month], from: now))!
            func count(_ sql: String, _ arguments: StatementArguments) throws -> Int { try Int.fetchOne(db, sql: sql, arguments: arguments) ?? 0 }
            func groups(_ column: String) throws -> [String: Int] {
                Dictionary(uniqueKeysWithValues: try Row.fetchAll(db, sql: "SELECT \(column) AS key, COUNT(*) AS n FROM plants WHERE owner = ? GROUP BY \(column)",
                                                                   arguments: [owner]).map { ($0["key"] as String, $0["n"] as Int) })
            }
            let week = now.addingTimeInterval(7 * 86_400).timeIntervalSince1970
            return Care.Statistics.Reply(
                total: try count("SELECT COUNT(*) FROM plants WHERE owner = ?", [owner]),
                favourites: try count("SELECT COUNT(*) FROM plants WHERE owner = ? AND favourite", [owner]),
                families: try groups("family"), sources: try groups("source"),
                addedThisMonth: try count("SELECT COUNT(*) FROM plants WHERE owner = ? AND dateAdded >= ?", [owner, monthStart.timeIntervalSince1970]),
                upcomingTasks: try count("SELECT COUNT(*) FROM tasks WHERE owner = ? AND showAt >= ? AND showAt < ?", [owner, now.timeIntervalSince1970, week]),
                overdueTasks: try count("SELECT COUNT(*) FROM tasks WHERE owner = ? AND showAt < ?", [owner, now.timeIntervalSince1970]))
        }
    }

    // MARK: - Preferences and tasks

    func setPreferences(_ preferences: Care.Preferences, owner: String, now: Date? = nil) throws -> Care.Preferences {
        let now = now ?? clock.now()
        let scheduler = try Scheduler(preferences: preferences)
        try store.database.write { db in
            try store.savePreferences(db, preferences, owner: owner)
            for row in try Row.fetchAll(db, sql: "SELECT * FROM plants WHERE owner = ?", arguments: [owner]) {
                try store.reschedule(db, owner: owner, plant: try store.plant(row), scheduler: scheduler, now: now)
            }
            try store.enqueueReminderSync(db, owner: owner, now: now)
        }
        return preferences
    }

    func upcoming(_ request: Care.UpcomingTasks.Request, owner: String, now: Date? = nil) throws -> Care.UpcomingTasks.Reply {
        let now = now ?? clock.now()
        let limit = request.limit
        let horizon = now.addingTimeInterval(Double(request.days) * 86_400).timeIntervalSince1970
        let rows = try store.database.read { db in
            try Row.fetchAll(db, sql: "SELECT * FROM tasks WHERE owner = ? AND showAt < ? ORDER BY showAt, id LIMIT ?",
                             arguments: [owner, horizon, limit ?? 1_000])
        }
        let tasks = rows.map(CareStore.task)
        return Care.UpcomingTasks.Reply(overdue: tasks.filter { ($0.snoozedUntil ?? $0.due) < now }, upcoming: tasks.filter { ($0.snoozedUntil ?? $0.due) >= now })
    }

    /// The next task of several plants (``Care/NextTasks``), each for its own key's
    /// principal: a plant that is not that person's is `notFound`, whoever else has it. One
    /// read, two indexed look-ups a key.
    func nextTasks(_ keys: [Care.NextTasks.Key], context: RequestContext) throws -> Care.NextTasks.Reply {
        let owners = keys.map { key in Result { () throws(CanopyError) in try context.principal(forKey: key.principal) } }
        let results = try store.database.read { db in
            try zip(keys, owners).map { key, principal -> Lookup.Result<Care.NextTasks.Next> in
                let owner: String
                switch principal {
                case .success(let principal): owner = principal
                case .failure(let error): return .init(error: error)
                }
                guard try Bool.fetchOne(db.cachedStatement(sql: "SELECT 1 FROM plants WHERE id = ? AND owner = ?"), arguments: [key.plantID, owner]) != nil else {
                    return .init(error: self.notFound(key.plantID))
                }
                let row = try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM tasks WHERE plantID = ? AND owner = ? ORDER BY showAt, id LIMIT 1"),
                                           arguments: [key.plantID, owner])
                return .init(value: .init(task: row.map(CareStore.task)))
            }
        }
        return Care.NextTasks.Reply(results: results)
    }

    /// The task's plant, the task row, and the owner's scheduler, or notFound.
    private func withTask<T>(_ id: String, owner: String, _ body: (Database, Care.Plant, Row, Scheduler) throws -> T) throws -> T {
        try store.database.write { db in
            guard let row = try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM tasks WHERE owner = ? AND id = ?"), arguments: [owner, id]),
                  let plant = try store.plant(db, owner: owner, id: row["plantID"])
            else { throw CanopyError(.notFound, "no task \(id) among yours; care.tasks.upcoming lists them") }
            return try body(db, plant, row, try Scheduler(preferences: try store.preferences(db, owner: owner)))
        }
    }

    private func reread(_ db: Database, _ id: String) throws -> Care.Task {
        try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM tasks WHERE id = ?"), arguments: [id]).map(CareStore.task)!
    }

    /// Logs the care and re-anchors the rule at `at`.
    func complete(_ id: String, at: Date?, owner: String, now: Date? = nil) throws -> Care.Task {
        let now = now ?? clock.now()
        return try withTask(id, owner: owner) { db, plant, row, scheduler in
            let done = at ?? now
            let kind = Care.TaskKind(rawValue: row["kind"]) ?? .custom
            try db.execute(sql: "INSERT INTO careLog (owner, plantID, kind, at) VALUES (?, ?, ?, ?)",
                           arguments: [owner, plant.id, kind.rawValue, done.timeIntervalSince1970])
            try store.reschedule(db, row: row, plant: plant, anchor: done, scheduler: scheduler)
            try store.enqueueReminderSync(db, owner: owner, now: now)
            return try reread(db, id)
        }
    }

    /// Shows the task at `until` without changing its rule.
    func snooze(_ id: String, until: Date, owner: String, now: Date? = nil) throws -> Care.Task {
        let now = now ?? clock.now()
        return try withTask(id, owner: owner) { db, _, _, _ in
            try db.execute(sql: "UPDATE tasks SET snoozedUntil = ?, showAt = ? WHERE id = ?", arguments: [until.timeIntervalSince1970, until.timeIntervalSince1970, id])
            try store.enqueueReminderSync(db, owner: owner, now: now)
            return try reread(db, id)
        }
    }

    /// Moves to the next occurrence as if done when due, without logging care.
    func skip(_ id: String, owner: String, now: Date? = nil) throws -> Care.Task {
        let now = now ?? clock.now()
        return try withTask(id, owner: owner) { db, plant, row, scheduler in
            try store.reschedule(db, row: row, plant: plant, anchor: Date(timeIntervalSince1970: row["due"]), scheduler: scheduler)
            try store.enqueueReminderSync(db, owner: owner, now: now)
            return try reread(db, id)
        }
    }

    /// Adds a task of the person's own to a plant.
    func addCustomTask(_ request: Care.AddCustomTask.Request, owner: String, now: Date? = nil) throws -> Care.Task {
        let now = now ?? clock.now()
        let title = request.title.trimmingCharacters(in: .whitespaces)
        return try store.database.write { db in
            guard try store.plant(db, owner: owner, id: request.plantID) != nil else { throw notFound(request.plantID) }
            let custom = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM tasks WHERE owner = ? AND plantID = ? AND kind = 'custom'",
                                          arguments: [owner, request.plantID]) ?? 0
            guard custom < Care.Limits.customTasksPerPlant else {
                throw CanopyError(.tooLarge, "this plant has \(custom) custom tasks, the most one plant may have; remove one first")
            }
            let id = "\(request.plantID):custom:\(UUID().uuidString.lowercased())"
            try store.scheduleCustom(db, id: id, owner: owner, plantID: request.plantID, title: title, everyDays: request.everyDays,
                                     anchor: now, scheduler: try Scheduler(preferences: try store.preferences(db, owner: owner)))
            try store.enqueueReminderSync(db, owner: owner, now: now)
            return try reread(db, id)
        }
    }

    func log(plantID: String, owner: String) throws -> [Care.LogEntry] {
        try store.database.read { db in
            guard try store.plant(db, owner: owner, id: plantID) != nil else { throw notFound(plantID) }
            return try Row.fetchAll(db, sql: "SELECT * FROM careLog WHERE owner = ? AND plantID = ? ORDER BY at DESC LIMIT ?",
                                    arguments: [owner, plantID, Care.Limits.logEntries]).map {
                Care.LogEntry(plantID: $0["plantID"], kind: Care.TaskKind(rawValue: $0["kind"]) ?? .custom, at: Date(timeIntervalSince1970: $0["at"]))
            }
        }
    }

    /// The owner's next `reminderWindow` care occurrences, soonest first, as handed to
    /// canopy-remind: each task's next occurrence (overdue ones too, and snoozed ones at their
    /// snooze), then the occurrences after it as if each were done when due. So a person who
    /// ignores every reminder still has a window reaching ahead. A task may come several times,
    /// once per occurrence (`due`).
    func reminderWindow(owner: String, count: Int? = nil, now: Date? = nil) throws -> [Care.Task] {
        let now = now ?? clock.now()
        let count = min(count ?? reminderWindow, reminderWindow)
        return try store.database.read { db in
            let rows = try Row.fetchAll(db, sql: "SELECT * FROM tasks WHERE owner = ? ORDER BY showAt, id LIMIT ?", arguments: [owner, count])
            guard !rows.isEmpty else { return [] }
            let scheduler = try Scheduler(preferences: try store.preferences(db, owner: owner))
            var profiles: [String: Care.Profile?] = [:]
            // (when it shows, the occurrence, the rule's interval for custom tasks)
            var queue = Heap<Occurrence>()
            for row in rows {
                let task = CareStore.task(row)
                queue.insert(Occurrence(task: task, everyDays: row["everyDays"]))
            }
            var window: [Care.Task] = []
            while window.count < count, let next = queue.popMin() {
                window.append(next.task)
                // The occurrences after it, from now on: a task ignored for a month still has
                // reminders ahead of today, not only the ones it missed.
                var following = next.task
                following.snoozedUntil = nil
                var steps = 0
                repeat {
                    let after = following.due
                    if following.kind == .custom {
                        guard let everyDays = next.everyDays else { break }
                        following.due = scheduler.nextDue(everyDays: everyDays, after: after)
                    } else {
                        if profiles[following.plantID] == nil {
                            profiles[following.plantID] = try store.plant(db, owner: owner, id: following.plantID)?.profile
                        }
                        guard let profile = profiles[following.plantID] ?? nil,
                              let due = scheduler.nextDue(following.kind, profile: profile, after: after), due > after else { break }
                        following.due = due
                    }
                    steps += 1
                } while following.due < now && steps < 1_000
                guard following.due > next.task.due, following.due >= now || steps >= 1_000 else { continue }
                queue.insert(Occurrence(task: following, everyDays: next.everyDays))
            }
            return window
        }
    }

    /// One occurrence in the window being built, ordered by when it shows.
    private struct Occurrence: Comparable {
        var task: Care.Task
        var everyDays: Int?
        var showAt: Date { task.snoozedUntil ?? task.due }
        static func < (lhs: Self, rhs: Self) -> Bool { (lhs.showAt, lhs.task.id) < (rhs.showAt, rhs.task.id) }
        static func == (lhs: Self, rhs: Self) -> Bool { lhs.showAt == rhs.showAt && lhs.task.id == rhs.task.id }
    }
}
