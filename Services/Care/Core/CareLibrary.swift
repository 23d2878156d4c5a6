import CanopyBus
import CanopyMessages
import CanopyServiceKit
import Collections
import Foundation

/// canopy-care's operations, each scoped to its owner: the domain's rules (what a plant
/// gets on its way in, when its tasks fall, what other services are told), over a store that
/// holds the data (``CareStoring``; no SQL here). Requests arrive validated (the runtime
/// checks every field before a handler runs), so nothing here checks them again.
/// Thread-safe.
final class CareLibrary: Sendable {
    /// The time it goes by (`--clock`).
    let clock: ServiceClock
    let store: any CareStoring
    /// Tasks handed to canopy-remind per person (the pending local notifications an iPhone keeps).
    let reminderWindow: Int
    /// Plants one person may keep.
    let maximumPlants: Int
    /// How long after an account's deletion its second pass runs (``Care/DeleteAccount``).
    let erasureSecondPass: Duration
    private let codec = MessageCodec()

    init(
        store: any CareStoring, reminderWindow: Int = 64, maximumPlants: Int = Care.Limits.plantsPerPerson, clock: ServiceClock = .system,
        erasureSecondPass: Duration = .seconds(60)
    ) {
        self.clock = clock
        self.store = store
        self.reminderWindow = reminderWindow
        self.maximumPlants = maximumPlants
        self.erasureSecondPass = erasureSecondPass
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
        return try store.write(owner: owner) { data in
            if chosenID {
                if let existing = try data.plant(owner: owner, id: plant.id) { return existing }
                if try data.plantIDTaken(plant.id) {
                    throw CanopyError(.conflict, "the plant id '\(plant.id)' is taken; leave id empty and one is chosen")
                }
            }
            let (count, preferences) = try data.plantCountAndPreferences(owner: owner)
            guard count < maximumPlants else {
                throw CanopyError(.tooLarge, "your collection has \(count) plants, the most one person may keep; delete some before adding more")
            }
            let scheduler = try Scheduler(preferences: preferences)
            let saved = try data.save(plant, owner: owner, override: override)
            try reschedule(data, owner: owner, plant: saved, scheduler: scheduler, now: now, new: true)
            try data.enqueueReminderSync(owner: owner, now: now)
            return saved
        }
    }

    func get(_ id: String, owner: String) throws -> Care.Plant {
        guard let plant = try store.read({ data in try data.plant(owner: owner, id: id) }) else { throw notFound(id) }
        return plant
    }

    /// Replaces the plant's editable fields; with `plant.version` given, only when the plant
    /// is still at that version (two phones editing one plant: the second sees `stale`).
    func update(_ plant: Care.Plant, owner: String, now: Date? = nil) throws -> Care.Plant {
        let now = now ?? clock.now()
        return try store.write(owner: owner) { data in
            guard let existing = try data.plant(owner: owner, id: plant.id) else { throw notFound(plant.id) }
            if let expected = plant.version, expected != existing.version {
                throw CanopyError(
                    .stale,
                    "the plant \(plant.id) changed since version \(expected) was read (it is at version \(existing.version ?? 1)); read it again and make the change to that"
                )
            }
            var updated = plant
            updated.dateAdded = existing.dateAdded
            if updated.genus.isEmpty { updated.genus = String(updated.scientificName.split(separator: " ").first ?? "") }
            let override = plant.profileOverridden ? plant.profile : nil
            let saved = try data.save(updated, owner: owner, override: override)
            if saved.profile != existing.profile {
                try reschedule(data, owner: owner, plant: saved, scheduler: try Scheduler(preferences: try data.preferences(owner: owner)), now: now)
                try data.enqueueReminderSync(owner: owner, now: now)
            }
            return saved
        }
    }

    /// Deletes the plant with its tasks and log, and records in the same transaction the
    /// follow-ups: cancel its reminders, purge its images, forget its identifications.
    func delete(_ id: String, owner: String, now: Date? = nil) throws {
        let now = now ?? clock.now()
        try store.write(owner: owner) { data in
            guard try data.hasPlant(owner: owner, id: id) else { return } // deleting twice is fine
            try data.deletePlant(owner: owner, id: id)
            try data.enqueue(
                owner: owner, service: Reminders.service, operation: Reminders.CancelPlant.name,
                body: try codec.encode(Reminders.CancelPlant.Request(plantID: id)), now: now)
            try data.enqueue(
                owner: owner, service: Images.service, operation: Images.Purge.name,
                body: try codec.encode(Images.Purge.Request(plantID: id)), now: now)
            try data.enqueue(
                owner: owner, service: Identification.service, operation: Identification.ForgetPlant.name,
                body: try codec.encode(Identification.ForgetPlant.Request(plantID: id)), now: now)
            try data.enqueueReminderSync(owner: owner, now: now)
        }
    }

    /// Deletes a person's account: every plant with its tasks and log, their preferences, and
    /// in the same transaction the follow-ups that make the other services forget them.
    func deleteAccount(owner: String, secondPass: Bool = false, now: Date? = nil) throws -> Int {
        let now = now ?? clock.now()
        defer { store.eraseResidue() }
        let (empty, again) = (try codec.encode(Empty()), try codec.encode(Care.DeleteAccount.Request(secondPass: true)))
        return try store.write(owner: owner) { data in
            let plants = try data.plants(owner: owner)
            for plant in plants { try data.deletePlant(owner: owner, id: plant.id) }
            try data.deletePreferences(owner: owner)
            try data.deleteRequestKeys(owner: owner)
            for (service, operation) in [
                (Reminders.service, Reminders.ForgetPerson.name), (Identification.service, Identification.ForgetPerson.name),
                (Images.service, Images.ForgetPerson.name),
            ] {
                try data.enqueue(owner: owner, service: service, operation: operation, body: empty, now: now)
            }
            if !secondPass {
                // What a request already on its way adds after this, erased too (Care.DeleteAccount).
                try data.enqueue(
                    owner: owner, service: Care.service, operation: Care.DeleteAccount.name, body: again,
                    now: now.addingTimeInterval(erasureSecondPass.seconds))
            }
            return plants.count
        }
    }

    /// A page of the collection. The page ends early when the next plant would take the
    /// reply past `replyBytes` (the broker's frame limit); `nextOffset` says where to go on.
    func list(_ request: Care.ListPlants.Request, owner: String, replyBytes: Int = RequestContext.defaultMaximumReplyBytes) throws -> Care.ListPlants.Reply {
        var reply = try store.read { data in try data.plants(owner: owner, matching: request) }
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

    /// The collection's counts; "this month" and "this week" in the person's time zone.
    func statistics(owner: String, now: Date? = nil) throws -> Care.Statistics.Reply {
        let now = now ?? clock.now()
        return try store.read { data in
            let scheduler = try Scheduler(preferences: try data.preferences(owner: owner))
            let monthStart = scheduler.calendar.date(from: scheduler.calendar.dateComponents([.year, .month], from: now))!
            return try data.statistics(owner: owner, monthStart: monthStart, now: now, weekEnd: now.addingTimeInterval(7 * 86_400))
        }
    }

    // MARK: - Preferences and tasks

    func setPreferences(_ preferences: Care.Preferences, owner: String, now: Date? = nil) throws -> Care.Preferences {
        let now = now ?? clock.now()
        let scheduler = try Scheduler(preferences: preferences)
        try store.write(owner: owner) { data in
            try data.savePreferences(preferences, owner: owner)
            for plant in try data.plants(owner: owner) {
                try reschedule(data, owner: owner, plant: plant, scheduler: scheduler, now: now)
            }
            try data.enqueueReminderSync(owner: owner, now: now)
        }
        return preferences
    }

    func upcoming(_ request: Care.UpcomingTasks.Request, owner: String, now: Date? = nil) throws -> Care.UpcomingTasks.Reply {
        let now = now ?? clock.now()
        let horizon = now.addingTimeInterval(Double(request.days) * 86_400)
        let tasks = try store.read { data in try data.tasks(owner: owner, showingBefore: horizon, limit: request.limit ?? 1_000) }
        return Care.UpcomingTasks.Reply(overdue: tasks.filter { $0.showAt < now }.map(\.task), upcoming: tasks.filter { $0.showAt >= now }.map(\.task))
    }

    /// The next task of several plants (``Care/NextTasks``), each for its own key's
    /// principal: a plant that is not that person's is `notFound`, whoever else has it. One
    /// read, two indexed look-ups a key.
    func nextTasks(_ keys: [Care.NextTasks.Key], context: RequestContext) throws -> Care.NextTasks.Reply {
        let owners = keys.map { key in Result { () throws(CanopyError) in try context.principal(forKey: key.principal) } }
        let results = try store.read { data in
            try zip(keys, owners).map { key, principal -> Lookup.Result<Care.NextTasks.Next> in
                let owner: String
                switch principal {
                case .success(let principal): owner = principal
                case .failure(let error): return .init(error: error)
                }
                guard try data.hasPlant(owner: owner, id: key.plantID) else { return .init(error: self.notFound(key.plantID)) }
                return .init(value: .init(task: try data.nextTask(owner: owner, plantID: key.plantID)?.task))
            }
        }
        return Care.NextTasks.Reply(results: results)
    }

    /// The task, its plant and the owner's scheduler, in a write transaction; or notFound.
    /// `body` says whether it changed anything: only then are the reminders told.
    private func withTask(_ id: String, owner: String, now: Date, _ body: (any CareWrites, StoredTask, Care.Plant, Scheduler) throws -> Bool) throws
        -> Care.Task
    {
        try store.write(owner: owner) { data in
            guard let task = try data.task(owner: owner, id: id),
                let plant = try data.plant(owner: owner, id: task.task.plantID)
            else { throw CanopyError(.notFound, "no task \(id) among yours; care.tasks.upcoming lists them") }
            if try body(data, task, plant, try Scheduler(preferences: try data.preferences(owner: owner))) {
                try data.enqueueReminderSync(owner: owner, now: now)
            }
            return try data.task(owner: owner, id: id)!.task
        }
    }

    /// Logs the care and re-anchors the rule at `at`. With a `key` used before (a retried
    /// request), nothing more is done: the task as it is now.
    func complete(_ id: String, at: Date?, key: String? = nil, owner: String, now: Date? = nil) throws -> Care.Task {
        let now = now ?? clock.now()
        let done = at ?? now
        return try withTask(id, owner: owner, now: now) { data, task, plant, scheduler in
            if let key, try !data.useRequestKey(owner: owner, key: key, now: now) { return false }
            try data.logCare(owner: owner, plantID: plant.id, kind: task.task.kind, at: done)
            try reschedule(data, task, plant: plant, anchor: done, scheduler: scheduler)
            return true
        }
    }

    /// Shows the task at `until` without changing its rule.
    func snooze(_ id: String, until: Date, owner: String, now: Date? = nil) throws -> Care.Task {
        try withTask(id, owner: owner, now: now ?? clock.now()) { data, _, _, _ in
            try data.snoozeTask(owner: owner, id: id, until: until)
            return true
        }
    }

    /// Moves to the next occurrence as if done when due, without logging care; with a `key`
    /// used before, nothing more.
    func skip(_ id: String, key: String? = nil, owner: String, now: Date? = nil) throws -> Care.Task {
        let now = now ?? clock.now()
        return try withTask(id, owner: owner, now: now) { data, task, plant, scheduler in
            if let key, try !data.useRequestKey(owner: owner, key: key, now: now) { return false }
            try reschedule(data, task, plant: plant, anchor: task.task.due, scheduler: scheduler)
            return true
        }
    }

    /// Adds a task of the person's own to a plant.
    func addCustomTask(_ request: Care.AddCustomTask.Request, owner: String, now: Date? = nil) throws -> Care.Task {
        let now = now ?? clock.now()
        let title = request.title.trimmingCharacters(in: .whitespaces)
        return try store.write(owner: owner) { data in
            guard try data.hasPlant(owner: owner, id: request.plantID) else { throw notFound(request.plantID) }
            let custom = try data.customTaskCount(owner: owner, plantID: request.plantID)
            guard custom < Care.Limits.customTasksPerPlant else {
                throw CanopyError(.tooLarge, "this plant has \(custom) custom tasks, the most one plant may have; remove one first")
            }
            let scheduler = try Scheduler(preferences: try data.preferences(owner: owner))
            let task = StoredTask(
                task: Care.Task(
                    id: "\(request.plantID):custom:\(UUID().uuidString.lowercased())", plantID: request.plantID, kind: .custom, title: title,
                    due: scheduler.nextDue(everyDays: request.everyDays, after: now)),
                owner: owner, anchor: now, everyDays: request.everyDays)
            try data.saveTask(task)
            try data.enqueueReminderSync(owner: owner, now: now)
            return task.task
        }
    }

    func log(plantID: String, owner: String) throws -> [Care.LogEntry] {
        try store.read { data in
            guard try data.hasPlant(owner: owner, id: plantID) else { throw notFound(plantID) }
            return try data.careLog(owner: owner, plantID: plantID, limit: Care.Limits.logEntries)
        }
    }

    // MARK: - Scheduling

    /// (Re)writes the task of `kind` for a plant: due after `anchor`, or removed when the
    /// profile no longer calls for it.
    private func schedule(_ data: any CareWrites, owner: String, plant: Care.Plant, kind: Care.TaskKind, anchor: Date, scheduler: Scheduler) throws {
        if let task = planned(owner: owner, plant: plant, kind: kind, anchor: anchor, scheduler: scheduler) {
            try data.saveTask(task)
        } else {
            try data.deleteTask(owner: owner, id: "\(plant.id):\(kind.rawValue)")
        }
    }

    /// The plant's task of `kind` counted from `anchor`, or nil when its profile has none.
    private func planned(owner: String, plant: Care.Plant, kind: Care.TaskKind, anchor: Date, scheduler: Scheduler) -> StoredTask? {
        guard let profile = plant.profile, let due = scheduler.nextDue(kind, profile: profile, after: anchor) else { return nil }
        let name = plant.customName ?? plant.commonNames.first ?? plant.scientificName
        return StoredTask(
            task: Care.Task(id: "\(plant.id):\(kind.rawValue)", plantID: plant.id, kind: kind, title: "\(kind.rawValue.capitalized) \(name)", due: due),
            owner: owner, anchor: anchor, everyDays: nil)
    }

    /// Reschedules one task from `anchor` (after complete or skip, or new preferences).
    private func reschedule(_ data: any CareWrites, _ stored: StoredTask, plant: Care.Plant, anchor: Date, scheduler: Scheduler) throws {
        if stored.task.kind == .custom, let everyDays = stored.everyDays {
            var next = stored
            next.anchor = anchor
            next.task.due = scheduler.nextDue(everyDays: everyDays, after: anchor)
            next.task.snoozedUntil = nil
            try data.saveTask(next)
        } else {
            try schedule(data, owner: stored.owner, plant: plant, kind: stored.task.kind, anchor: anchor, scheduler: scheduler)
        }
    }

    /// Reschedules every task of a plant from its anchors (or `now` for new ones); custom
    /// tasks keep their own interval. A `new` plant has no tasks yet: none is read or deleted.
    private func reschedule(_ data: any CareWrites, owner: String, plant: Care.Plant, scheduler: Scheduler, now: Date, new: Bool = false) throws {
        var anchors: [Care.TaskKind: Date] = [:]
        for task in new ? [] : try data.tasks(owner: owner, plantID: plant.id) {
            if task.task.kind == .custom {
                try reschedule(data, task, plant: plant, anchor: task.anchor, scheduler: scheduler)
            } else {
                anchors[task.task.kind] = task.anchor
            }
        }
        // Written together: one statement for the saves and one for the deletes where the
        // store can (a PostgreSQL round trip each, not one per kind).
        let wanted = plant.profile.map(Scheduler.kinds(for:)) ?? []
        var saves: [StoredTask] = []
        var deletes: [String] = []
        for kind in Care.TaskKind.allCases where kind != .custom {
            if wanted.contains(kind), let task = planned(owner: owner, plant: plant, kind: kind, anchor: anchors[kind] ?? now, scheduler: scheduler) {
                saves.append(task)
            } else if !new {
                deletes.append("\(plant.id):\(kind.rawValue)")
            }
        }
        try data.saveTasks(saves)
        try data.deleteTasks(owner: owner, ids: deletes)
    }

    // MARK: - Reminder windows

    /// The owner's next `reminderWindow` care occurrences, soonest first, as handed to
    /// canopy-remind: each task's next occurrence (overdue ones too, and snoozed ones at their
    /// snooze), then the occurrences after it as if each were done when due. So a person who
    /// ignores every reminder still has a window reaching ahead. A task may come several times,
    /// once per occurrence (`due`).
    /// Sends the owner's window to canopy-remind again, through the outbox (a sync already
    /// waiting there goes with the window as it is when sent): canopy-remind's refill.
    func requestReminderSync(owner: String) throws {
        let now = clock.now()
        try store.write(owner: owner) { data in try data.enqueueReminderSync(owner: owner, now: now) }
    }

    func reminderWindow(owner: String, count: Int? = nil, now: Date? = nil) throws -> [Care.Task] {
        let now = now ?? clock.now()
        let count = min(count ?? reminderWindow, reminderWindow)
        return try store.read { data in
            let tasks = try data.tasks(owner: owner, showingBefore: nil, limit: count)
            guard !tasks.isEmpty else { return [] }
            let scheduler = try Scheduler(preferences: try data.preferences(owner: owner))
            var profiles: [String: Care.Profile?] = [:]
            var queue = Heap<Occurrence>()
            for task in tasks { queue.insert(Occurrence(task: task.task, everyDays: task.everyDays)) }
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
                            profiles[following.plantID] = try data.plant(owner: owner, id: following.plantID)?.profile
                        }
                        guard let profile = profiles[following.plantID] ?? nil,
                            let due = scheduler.nextDue(following.kind, profile: profile, after: after), due > after
                        else { break }
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
