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
        func on<Operation: BusOperation>(_ operation: Operation.Type, _ work: @escaping @Sendable (Operation.Request, RequestContext) throws -> Operation.Reply) {
            handlers.on(operation) { request, context in try await offThePool { try work(request, context) } }
        }
        on(Care.CatalogSearch.self) { request, _ in library.store.catalog.search(request.text, limit: request.limit ?? 20) }
        on(Care.AddPlant.self) { plant, context in try library.add(plant, owner: try context.requirePrincipal()) }
        on(Care.GetPlant.self) { request, context in try library.get(request.id, owner: try context.requirePrincipal()) }
        on(Care.UpdatePlant.self) { plant, context in try library.update(plant, owner: try context.requirePrincipal()) }
        on(Care.DeletePlant.self) { request, context in
            try library.delete(request.id, owner: try context.requirePrincipal())
            return Empty()
        }
        on(Care.ListPlants.self) { request, context in
            try library.list(request, owner: try context.requirePrincipal(), replyBytes: context.maximumReplyBytes)
        }
        on(Care.Statistics.self) { _, context in try library.statistics(owner: try context.requirePrincipal()) }
        on(Care.SetPreferences.self) { preferences, context in try library.setPreferences(preferences, owner: try context.requirePrincipal()) }
        on(Care.UpcomingTasks.self) { request, context in
            try library.upcoming(days: request.days, limit: request.limit, owner: try context.requirePrincipal())
        }
        on(Care.NextTasks.self) { request, context in try library.nextTasks(request.keys, context: context) }
        on(Care.CompleteTask.self) { request, context in try library.complete(request.id, at: request.at, owner: try context.requirePrincipal()) }
        on(Care.SnoozeTask.self) { request, context in try library.snooze(request.id, until: request.until, owner: try context.requirePrincipal()) }
        on(Care.SkipTask.self) { request, context in try library.skip(request.id, owner: try context.requirePrincipal()) }
        on(Care.AddCustomTask.self) { request, context in try library.addCustomTask(request, owner: try context.requirePrincipal()) }
        on(Care.ReminderWindow.self) { request, context in
            .init(window: try library.reminderWindow(owner: try context.requirePrincipal(), count: request.count))
        }
        on(Care.CareLog.self) { request, context in try library.log(plantID: request.plantID, owner: try context.requirePrincipal()) }
    }
}
