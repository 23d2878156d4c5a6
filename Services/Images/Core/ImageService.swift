import CanopyBus
import CanopyMessages
import CanopyServiceKit
import Foundation

/// canopy-images on the bus: one handler per operation of ``Images``, each scoped to the
/// request's principal.
public struct ImageService: BusService {
    public let name = Images.service
    let library: ImageLibrary

    init(library: ImageLibrary) {
        self.library = library
    }

    public func register(_ handlers: inout OperationHandlers) {
        let library = self.library
        handlers.on(Images.Put.self) { request, owner, _ in
            try await library.put([UInt8](request.data), owner: owner, plantID: request.plantID)
        }
        handlers.on(Images.Fetch.self) { request, owner, _ in
            try await library.fetch(request.url, owner: owner, plantID: request.plantID)
        }
        handlers.on(Images.GetVariant.self) { request, owner, context in
            try await library.variant(request, owner: owner, replyBytes: context.maximumReplyBytes)
        }
        handlers.on(Images.GetVariants.self) { request, context in
            await library.variants(request.keys, context: context)
        }
        handlers.on(Images.Palette.self) { request, owner, _ in
            try await library.palette(request.sha256, owner: owner)
        }
        handlers.onBlocking(Images.List.self) { request, owner, _ in
            try library.list(owner: owner, plantID: request.plantID)
        }
        handlers.on(Images.ForgetPerson.self) { _, owner, _ in
            try await library.forget(owner: owner)
            return Empty()
        }
        handlers.on(Images.Purge.self) { request, owner, _ in
            try await library.purge(owner: owner, plantID: request.plantID, sha256: request.sha256)
        }
        handlers.on(Images.Warm.self) { request, owner, _ in
            try await library.warm(request, owner: owner)
        }
        handlers.on(Images.Stats.self) { _, _ in
            try await library.statistics()
        }
    }
}
