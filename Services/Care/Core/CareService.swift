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
        // Every operation waits on its store, so each runs on a Dispatch thread (``onBlocking``).
        handlers.onBlocking(Care.CatalogSearch.self) { request, _ in library.store.catalog.search(request.text, limit: request.limit ?? 20) }
        handlers.onBlocking(Care.AddPlant.self) { plant, owner, _ in try library.add(plant, owner: owner) }
        handlers.onBlocking(Care.GetPlant.self) { request, owner, _ in try library.get(request.id, owner: owner) }
        handlers.onBlocking(Care.UpdatePlant.self) { plant, owner, _ in try library.update(plant, owner: owner) }
        handlers.onBlocking(Care.DeleteAccount.self) { request, owner, _ in
            .init(plants: try library.deleteAccount(owner: owner, secondPass: request.secondPass ?? false))
        }
        handlers.onBlocking(Care.DeletePlant.self) { request, owner, _ in
            try library.delete(request.id, owner: owner)
            return Empty()
        }
        handlers.onBlocking(Care.ListPlants.self) { request, owner, context in
            try library.list(request, owner: owner, replyBytes: context.maximumReplyBytes)
        }
        handlers.onBlocking(Care.Statistics.self) { _, owner, _ in try library.statistics(owner: owner) }
        handlers.onBlocking(Care.SetPreferences.self) { preferences, owner, _ in try library.setPreferences(preferences, owner: owner) }
        handlers.onBlocking(Care.UpcomingTasks.self) { request, owner, _ in
            try library.upcoming(request, owner: owner)
        }
        handlers.onBlocking(Care.NextTasks.self) { request, context in try library.nextTasks(request.keys, context: context) }
        handlers.onBlocking(Care.CompleteTask.self) { request, owner, _ in try library.complete(request.id, at: request.at, key: request.key, owner: owner) }
        handlers.onBlocking(Care.SnoozeTask.self) { request, owner, _ in try library.snooze(request.id, until: request.until, owner: owner) }
        handlers.onBlocking(Care.SkipTask.self) { request, owner, _ in try library.skip(request.id, key: request.key, owner: owner) }
        handlers.onBlocking(Care.AddCustomTask.self) { request, owner, _ in try library.addCustomTask(request, owner: owner) }
        handlers.onBlocking(Care.RequestReminderSync.self) { _, owner, _ in
            try library.requestReminderSync(owner: owner)
            return Empty()
        }
        handlers.onBlocking(Care.CareLog.self) { request, owner, _ in try library.log(plantID: request.plantID, owner: owner) }
    }
}
