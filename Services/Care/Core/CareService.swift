import CanopyBus
import CanopyMessages
import CanopyServiceKit
import Foundation

/// canopy-care on the bus: one handler per operation of ``Care``.
public struct CareService: BusService {
    public let name = Care.service
    let library: CareLibrary

    init(library: CareLibrary) {
        self.library = library
    }

    public func register(_ handlers: inout OperationHandlers) {
        let library = self.library
        // Every operation waits on SQLite (GRDB's blocking calls), so each runs on a Dispatch
        // thread: the cooperative pool, a thread a core, is never held waiting for a database
        // connection (which would starve the tasks that hold one, and everything else).
        func on<Operation: BusOperation>(_ operation: Operation.Type, _ work: @escaping @Sendable (Operation.Request, RequestContext) throws -> Operation.Reply)
        {
            handlers.on(operation) { request, context in try await offThePool { try work(request, context) } }
        }
        func on<Operation: BusOperation>(
            _ operation: Operation.Type,
            _ work: @escaping @Sendable (Operation.Request, _ owner: String, RequestContext) throws -> Operation.Reply
        ) {
            handlers.on(operation) { request, owner, context in try await offThePool { try work(request, owner, context) } }
        }
        on(Care.CatalogSearch.self) { request, _ in library.store.catalog.search(request.text, limit: request.limit ?? 20) }
        on(Care.AddPlant.self) { plant, owner, _ in try library.add(plant, owner: owner) }
        on(Care.GetPlant.self) { request, owner, _ in try library.get(request.id, owner: owner) }
        on(Care.UpdatePlant.self) { plant, owner, _ in try library.update(plant, owner: owner) }
        on(Care.DeleteAccount.self) { request, owner, _ in .init(plants: try library.deleteAccount(owner: owner, secondPass: request.secondPass ?? false)) }
        on(Care.DeletePlant.self) { request, owner, _ in
            try library.delete(request.id, owner: owner)
            return Empty()
        }
        on(Care.ListPlants.self) { request, owner, context in
            try library.list(request, owner: owner, replyBytes: context.maximumReplyBytes)
        }
        on(Care.Statistics.self) { _, owner, _ in try library.statistics(owner: owner) }
        on(Care.SetPreferences.self) { preferences, owner, _ in try library.setPreferences(preferences, owner: owner) }
        on(Care.UpcomingTasks.self) { request, owner, _ in
            try library.upcoming(request, owner: owner)
        }
        on(Care.NextTasks.self) { request, context in try library.nextTasks(request.keys, context: context) }
        on(Care.CompleteTask.self) { request, owner, _ in try library.complete(request.id, at: request.at, key: request.key, owner: owner) }
        on(Care.SnoozeTask.self) { request, owner, _ in try library.snooze(request.id, until: request.until, owner: owner) }
        on(Care.SkipTask.self) { request, owner, _ in try library.skip(request.id, key: request.key, owner: owner) }
        on(Care.AddCustomTask.self) { request, owner, _ in try library.addCustomTask(request, owner: owner) }
        on(Care.RequestReminderSync.self) { _, owner, _ in
            try library.requestReminderSync(owner: owner)
            return Empty()
        }
        on(Care.CareLog.self) { request, owner, _ in try library.log(plantID: request.plantID, owner: owner) }
    }
}
