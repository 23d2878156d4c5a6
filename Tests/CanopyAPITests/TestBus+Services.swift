import CanopyCare
import CanopyIdentify
import CanopyImages
import CanopyMessages
import CanopyRemind
import CanopyTesting

/// Each service behind the API with `settings`, as `serve` builds it (live) or as its parts
/// (in process): one line per service in the suites' stacks.
extension TestBus {
    func start(_ settings: CareServiceSettings) async throws {
        try await start(
            Care.service, live: { try await buildCareService(settings: settings, context: $0, logger: $1) },
            inProcess: { try await makeCareService(settings: settings, bus: $0, logger: $1) })
    }

    func start(_ settings: ReminderServiceSettings) async throws {
        try await start(
            Reminders.service, live: { try await buildReminderService(settings: settings, context: $0, logger: $1) },
            inProcess: { try await makeReminderService(settings: settings, bus: $0, logger: $1) })
    }

    func start(_ settings: ImageServiceSettings) async throws {
        try await start(
            Images.service, live: { try await buildImageService(settings: settings, context: $0, logger: $1) },
            inProcess: { try await makeImageService(settings: settings, logger: $1) })
    }

    func start(_ settings: IdentificationServiceSettings) async throws {
        try await start(
            Identification.service, live: { try await buildIdentificationService(settings: settings, context: $0, logger: $1) },
            inProcess: { try await makeIdentificationService(settings: settings, bus: $0, logger: $1) })
    }
}
