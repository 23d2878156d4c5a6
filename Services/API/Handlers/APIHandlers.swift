import CanopyBus
import CanopyMessages
import Foundation

/// The routes of docs/openapi.yaml, one handler each (the protocol is generated from the
/// document), each turning an HTTP request into a bus call made for the caller and its reply
/// into the response. Fields are checked once, where the request is validated before its
/// handler runs (a service's `Validatable` request); the `CanopyError` that comes back names
/// the field, and the edge middleware turns it, like a ``RequestFieldError`` (what only the
/// edge can check: path parameters, multipart parts), into a problem naming that field.
struct APIHandlers: APIProtocol {
    let bus: any BusCalling
    /// How long one bus call may take.
    var timeout: Duration = .seconds(10)
    /// Every route, for `POST /v1/batch` to run in process.
    var operations: OperationTable?
    var metrics: APIMetrics?
    /// Implicit batching of variant and next-task lookups; `nil` sends each lookup alone.
    var lookups: Lookups?
    /// Signs a person out everywhere (canopy-api's revocations), when the edge has a store.
    var signOut: (@Sendable (String) async throws -> Void)?
    /// Forgets a person's idempotency keys and their kept answers (after their account's deletion).
    var forgetKeys: (@Sendable (String) async throws -> Void)?

    /// The caller the edge middleware authenticated (every route needs one).
    func caller() throws -> String {
        guard let principal = Caller.principal else { throw CanopyError(.unauthorized, "this route needs a bearer token") }
        return principal
    }

    /// One bus call made for the caller.
    func call<Operation: BusOperation>(_ operation: Operation.Type, _ request: Operation.Request) async throws -> Operation.Reply {
        try await bus.call(operation, request, principal: try caller(), timeout: timeout)
    }

    // MARK: - Plants

    func listPlants(_ input: Operations.ListPlants.Input) async throws -> Operations.ListPlants.Output {
        let query = input.query
        // The API's pages are smaller than the bus allows (100, not 500): the one range the
        // edge checks itself. Every other field is checked once, by canopy-care.
        let limit = try RequestFieldError.check(query.limit ?? 20, "limit", 1...100)
        let request = Care.ListPlants.Request(
            search: query.search, favourite: query.favourite, family: query.family, light: try query.light.map { try convert($0) },
            watering: try query.watering.map { try convert($0) }, source: try query.source.map { try convert($0) },
            addedFrom: query.addedFrom, addedTo: query.addedTo, sort: try query.sort.map { try convert($0) } ?? .dateAdded,
            descending: query.descending ?? true, limit: limit, offset: query.offset ?? 0)
        let reply = try await call(Care.ListPlants.self, request)
        return .ok(
            .init(
                body: .json(
                    .init(
                        plants: try reply.plants.map(Components.Schemas.Plant.init), total: reply.total,
                        nextOffset: reply.nextOffset))))
    }

    func createPlant(_ input: Operations.CreatePlant.Input) async throws -> Operations.CreatePlant.Output {
        guard case .json(let body) = input.body else { throw CanopyError(.badRequest, "the body is JSON") }
        // With an Idempotency-Key the plant's id comes from it: a repeat the edge runs again
        // (its first run's edge died) answers the plant the first one added.
        let plant = try await call(Care.AddPlant.self, try Care.Plant(body, id: Caller.idempotencyKey.map(IdempotencyKeys.plantID) ?? ""))
        return .created(.init(body: .json(try .init(plant))))
    }

    func getPlant(_ input: Operations.GetPlant.Input) async throws -> Operations.GetPlant.Output {
        let plant = try await call(Care.GetPlant.self, .init(id: try RequestFieldError.identifier(input.path.plantID, "plantID")))
        return .ok(.init(headers: .init(eTag: PlantVersion.entityTag(plant)), body: .json(try .init(plant))))
    }

    func updatePlant(_ input: Operations.UpdatePlant.Input) async throws -> Operations.UpdatePlant.Output {
        guard case .json(let body) = input.body else { throw CanopyError(.badRequest, "the body is JSON") }
        var change = try Care.Plant(body, id: try RequestFieldError.identifier(input.path.plantID, "plantID"))
        change.version = try input.headers.ifMatch.flatMap(PlantVersion.expected)
        let plant = try await call(Care.UpdatePlant.self, change)
        return .ok(.init(headers: .init(eTag: PlantVersion.entityTag(plant)), body: .json(try .init(plant))))
    }

    /// Deletes the caller's account. The person is signed out first (the token this came
    /// with too), so that nothing of theirs can be added while or after canopy-care deletes
    /// (no plant left behind by a request racing the deletion); then their data goes, and
    /// the answers kept for their idempotency keys.
    func deleteAccount(_ input: Operations.DeleteAccount.Input) async throws -> Operations.DeleteAccount.Output {
        let person = try caller()
        try await signOut?(person)
        _ = try await call(Care.DeleteAccount.self, .init())
        try await forgetKeys?(person)
        return .noContent(.init())
    }

    func deletePlant(_ input: Operations.DeletePlant.Input) async throws -> Operations.DeletePlant.Output {
        _ = try await call(Care.DeletePlant.self, .init(id: try RequestFieldError.identifier(input.path.plantID, "plantID")))
        return .noContent(.init())
    }

    func setFavourite(_ input: Operations.SetFavourite.Input) async throws -> Operations.SetFavourite.Output {
        guard case .json(let body) = input.body else { throw CanopyError(.badRequest, "the body is JSON") }
        let id = try RequestFieldError.identifier(input.path.plantID, "plantID")
        // Read, change, write against the version read: an edit made in between is kept (the
        // write is refused stale and made again on the plant as it is now).
        for attempt in 1... {
            var plant = try await call(Care.GetPlant.self, .init(id: id))
            guard plant.favourite != body.favourite else { return .ok(.init(body: .json(try .init(plant)))) }
            plant.favourite = body.favourite
            plant.profile = plant.profileOverridden ? plant.profile : nil // the catalog's stays the catalog's
            do {
                return .ok(.init(body: .json(try .init(try await call(Care.UpdatePlant.self, plant)))))
            } catch let error as CanopyError where error.code == .stale && attempt < 5 {
                continue
            }
        }
        fatalError("unreachable: the loop returns or throws")
    }

    func getNextTask(_ input: Operations.GetNextTask.Input) async throws -> Operations.GetNextTask.Output {
        let key = Care.NextTasks.Key(principal: try caller(), plantID: try RequestFieldError.identifier(input.path.plantID, "plantID"))
        let next: Care.NextTasks.Next
        if let lookups {
            next = try await lookups.nextTasks.load(key)
        } else {
            guard let result = try await call(Care.NextTasks.self, .init(keys: [key])).results.first else {
                throw CanopyError(.internal, "care.tasks.next answered no result for its one key")
            }
            next = try result.get()
        }
        return .ok(.init(body: .json(.init(plantID: key.plantID, task: try next.task.map(Components.Schemas.Task.init)))))
    }

    // MARK: - Tasks

    func listUpcomingTasks(_ input: Operations.ListUpcomingTasks.Input) async throws -> Operations.ListUpcomingTasks.Output {
        let reply = try await call(Care.UpcomingTasks.self, .init(days: input.query.days ?? 7, limit: input.query.limit ?? 100))
        return .ok(.init(body: .json(.init(tasks: try reply.upcoming.map(Components.Schemas.Task.init)))))
    }

    func listOverdueTasks(_ input: Operations.ListOverdueTasks.Input) async throws -> Operations.ListOverdueTasks.Output {
        let reply = try await call(Care.UpcomingTasks.self, .init(days: 0, limit: input.query.limit ?? 100))
        return .ok(.init(body: .json(.init(tasks: try reply.overdue.map(Components.Schemas.Task.init)))))
    }

    func completeTask(_ input: Operations.CompleteTask.Input) async throws -> Operations.CompleteTask.Output {
        var at: Date?
        if case .json(let body) = input.body { at = body.at }
        let task = try await call(
            Care.CompleteTask.self,
            .init(
                id: try RequestFieldError.identifier(input.path.taskID, "taskID"), at: at,
                key: Caller.idempotencyKey))
        return .ok(.init(body: .json(try .init(task))))
    }

    func snoozeTask(_ input: Operations.SnoozeTask.Input) async throws -> Operations.SnoozeTask.Output {
        guard case .json(let body) = input.body else { throw CanopyError(.badRequest, "the body is JSON") }
        let task = try await call(Care.SnoozeTask.self, .init(id: try RequestFieldError.identifier(input.path.taskID, "taskID"), until: body.until))
        return .ok(.init(body: .json(try .init(task))))
    }

    func skipTask(_ input: Operations.SkipTask.Input) async throws -> Operations.SkipTask.Output {
        let id = try RequestFieldError.identifier(input.path.taskID, "taskID")
        return .ok(.init(body: .json(try .init(try await call(Care.SkipTask.self, .init(id: id, key: Caller.idempotencyKey))))))
    }

    // MARK: - Account

    func getStatistics(_ input: Operations.GetStatistics.Input) async throws -> Operations.GetStatistics.Output {
        let statistics = try await call(Care.Statistics.self, Empty())
        return .ok(
            .init(
                body: .json(
                    .init(
                        total: statistics.total, favourites: statistics.favourites, families: .init(additionalProperties: statistics.families),
                        sources: .init(additionalProperties: statistics.sources), addedThisMonth: statistics.addedThisMonth,
                        upcomingTasks: statistics.upcomingTasks, overdueTasks: statistics.overdueTasks))))
    }

    func setPreferences(_ input: Operations.SetPreferences.Input) async throws -> Operations.SetPreferences.Output {
        guard case .json(let body) = input.body else { throw CanopyError(.badRequest, "the body is JSON") }
        let stored = try await call(
            Care.SetPreferences.self,
            Care.Preferences(
                timeZone: body.timeZone, preferredMinute: body.preferredMinute ?? 540, quietStartMinute: body.quietStartMinute,
                quietEndMinute: body.quietEndMinute, wateringFactor: body.wateringFactor ?? 1, pauseStart: body.pauseStart, pauseEnd: body.pauseEnd,
                southernHemisphere: body.southernHemisphere ?? false))
        return .ok(
            .init(
                body: .json(
                    .init(
                        timeZone: stored.timeZone, preferredMinute: stored.preferredMinute, quietStartMinute: stored.quietStartMinute,
                        quietEndMinute: stored.quietEndMinute, wateringFactor: stored.wateringFactor, pauseStart: stored.pauseStart,
                        pauseEnd: stored.pauseEnd, southernHemisphere: stored.southernHemisphere))))
    }
}

/// A field of the request that is wrong, named in the problem's `field`.
struct RequestFieldError: Error {
    var field: String
    var message: String

    init(field: String, _ message: String) {
        self.field = field
        self.message = message
    }

    /// `value` when it is an id as the document's `Identifier` says (1 to 200 ASCII letters,
    /// digits, `.`, `_`, `:` or `-`: the generated server does not check patterns), else an
    /// error naming `field`.
    static func identifier(_ value: String, _ field: String) throws -> String {
        do {
            try Field.identifier(value, field, maximumBytes: Care.Limits.idBytes)
        } catch {
            throw RequestFieldError(field: field, error.message)
        }
        return value
    }

    /// `value` when it is in `range`, else an error naming `field`.
    static func check(_ value: Int, _ field: String, _ range: ClosedRange<Int>) throws -> Int {
        guard range.contains(value) else {
            throw RequestFieldError(field: field, "\(field) is \(range.lowerBound) to \(range.upperBound); got \(value)")
        }
        return value
    }
}
