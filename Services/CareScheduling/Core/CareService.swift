import CanopyBus
import CanopyMessages
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
        handlers.on(Care.CatalogSearch.self) { request, _ in
            library.store.catalog.search(request.text, limit: request.limit ?? 20)
        }
        handlers.on(Care.AddPlant.self) { plant, context in try library.add(plant, owner: try context.requirePrincipal()) }
        handlers.on(Care.GetPlant.self) { request, context in try library.get(request.id, owner: try context.requirePrincipal()) }
        handlers.on(Care.UpdatePlant.self) { plant, context in try library.update(plant, owner: try context.requirePrincipal()) }
        handlers.on(Care.DeletePlant.self) { request, context in
            try library.delete(request.id, owner: try context.requirePrincipal())
            return Empty()
        }
        handlers.on(Care.ListPlants.self) { request, context in
            try library.list(request, owner: try context.requirePrincipal(), replyBytes: context.maximumReplyBytes)
        }
        handlers.on(Care.Statistics.self) { _, context in try library.statistics(owner: try context.requirePrincipal()) }
        handlers.on(Care.SetPreferences.self) { preferences, context in try library.setPreferences(preferences, owner: try context.requirePrincipal()) }
        handlers.on(Care.UpcomingTasks.self) { request, context in
            try library.upcoming(days: request.days, limit: request.limit, owner: try context.requirePrincipal())
        }
        handlers.on(Care.NextTasks.self) { request, context in try await library.nextTasks(request.keys, context: context) }
        handlers.on(Care.CompleteTask.self) { request, context in try library.complete(request.id, at: request.at, owner: try context.requirePrincipal()) }
        handlers.on(Care.SnoozeTask.self) { request, context in try library.snooze(request.id, until: request.until, owner: try context.requirePrincipal()) }
        handlers.on(Care.SkipTask.self) { request, context in try library.skip(request.id, owner: try context.requirePrincipal()) }
        handlers.on(Care.AddCustomTask.self) { request, context in try library.addCustomTask(request, owner: try context.requirePrincipal()) }
        handlers.on(Care.ReminderWindow.self) { request, context in
            .init(window: try library.reminderWindow(owner: try context.requirePrincipal(), count: request.count))
        }
        handlers.on(Care.CareLog.self) { request, context in try library.log(plantID: request.plantID, owner: try context.requirePrincipal()) }
    }
}
