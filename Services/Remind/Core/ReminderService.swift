import AsyncHTTPClient
import CanopyBus
import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation
import Logging
import ServiceLifecycle

/// canopy-remind on the bus: one handler per operation of ``Reminders``.
public struct ReminderService: BusService {
    public let name = Reminders.service
    let library: ReminderLibrary
    let dispatcher: Dispatcher

    public func register(_ handlers: inout OperationHandlers) {
        let (library, dispatcher) = (self.library, self.dispatcher)
        // What waits on the store and is not async runs on a Dispatch thread (``onBlocking``).
        handlers.on(Reminders.Sync.self) { request, owner, _ in
            dispatcher.schedule(try await library.sync(request.occurrences, owner: owner))
            return Empty()
        }
        handlers.onBlocking(Reminders.CancelPlant.self) { request, owner, _ in
            try library.cancel(plantID: request.plantID, owner: owner)
            return Empty()
        }
        handlers.onBlocking(Reminders.ForgetPerson.self) { _, owner, _ in
            try library.forget(owner: owner)
            return Empty()
        }
        handlers.onBlocking(Reminders.RegisterDevice.self) { request, owner, _ in try library.register(request, owner: owner) }
        handlers.onBlocking(Reminders.RemoveDevice.self) { request, owner, _ in
            try library.removeDevice(request.id, owner: owner)
            return Empty()
        }
        handlers.onBlocking(Reminders.ListDevices.self) { _, owner, _ in try library.devices(owner: owner) }
        handlers.onBlocking(Reminders.Pending.self) { request, owner, _ in try library.pending(owner: owner, limit: request.limit ?? 64) }
        handlers.onBlocking(Reminders.Failures.self) { request, owner, _ in try library.failures(owner: owner, limit: request.limit ?? 100) }
        handlers.on(Reminders.SendTest.self) { request, owner, _ in
            try await dispatcher.sendTest(deviceID: request.deviceID, owner: owner)
        }
    }
}

extension Dispatcher {
    /// A test notification to one of `owner`'s devices, now, outside the reminder queue.
    func sendTest(deviceID: String, owner: String) async throws -> Reminders.SendTest.Reply {
        guard let device = try await store.read({ data in try data.device(owner: owner, id: deviceID) }) else {
            throw CanopyError(.notFound, "no device \(deviceID) among yours; devices.list shows them")
        }
        guard let channel = channels[device.device.channel] else {
            throw CanopyError(.badRequest, "this service has no \(device.device.channel.rawValue) channel configured")
        }
        let now = clock.now()
        let test = Reminders.Reminder(taskID: "test", plantID: "test", kind: .custom, title: "Canopy test notification", due: now, state: .sending)
        let notification = ReminderNotification(
            id: ReminderNotification.key(deviceID: deviceID, reminders: [("test", now.timeIntervalSince1970)]), reminders: [test])
        return switch await channel.deliver(notification, to: device) {
        case .accepted(let detail): .init(accepted: true, detail: detail)
        case .retry(let detail), .rejected(let detail, _): .init(accepted: false, detail: detail)
        }
    }
}

/// Everything `canopy-remind serve` can be told.
public struct ReminderServiceSettings: Sendable {
    /// Where the store lives (`<data-dir>/remind`; the database is `remind.sqlite` in it) when
    /// ``postgres`` is nil.
    public var directory: URL
    /// The PostgreSQL every replica shares (`--database-url`), or nil for SQLite.
    public var postgres: PostgresSettings?
    /// How the worker reaches its broker (endpoint, credit, heartbeats, CURVE keys).
    public var runner: ServiceRunner.Configuration
    /// Where `/metrics` and `/health` listen; `nil` for nowhere.
    public var metrics: ListenAddress?
    /// The dispatcher's timing.
    public var dispatch = DispatchSettings()
    /// Hosts webhooks and ntfy topics may name even on loopback or private addresses.
    public var allowedHosts: Set<String> = []
    /// Apple's push service, when the operator gave its key; without it there is no `apns`
    /// channel and APNs devices are refused when they register.
    public var apns: APNsSettings?
    /// The time the service goes by (`--clock`).
    public var clock: ServiceClock = .system
    /// Every notification written to the log instead of sent, whatever its device's channel
    /// (`--rehearse`): a stack replaying yesterday's traffic (`canopy replay --fresh`) or a
    /// staging copy of production's stores must never notify real people.
    public var rehearsal = false

    public init(directory: URL, runner: ServiceRunner.Configuration, metrics: ListenAddress? = nil) {
        self.directory = directory
        self.runner = runner
        self.metrics = metrics
    }

    /// The store's path.
    public var databasePath: String { directory.appendingPathComponent("remind.sqlite").path }
}

/// Builds what `canopy-remind serve` runs, in start order: the bus client (for refills from
/// canopy-care), the APNs client when configured, the dispatcher, the bus worker, and the `/metrics` and `/health` listener
/// when `settings` name one.
public func buildReminderService(
    settings: ReminderServiceSettings, context: ZMQContext, logger: Logger,
    clock: (any ReminderClock)? = nil
) async throws -> [any Service] {
    try OperatingEndpoint.ensureFree(settings.metrics) // a taken port stops it before anything opens
    let bus = try BusClient(configuration: settings.runner.client, context: context, logger: logger)
    return try await makeReminderService(settings: settings, bus: bus, logger: logger, clock: clock)
        .assembled(runner: settings.runner, bus: bus, metrics: settings.metrics, context: context, logger: logger)
}

/// canopy-remind's parts: its handlers on its store (PostgreSQL when `settings` name one, else
/// SQLite in `settings.directory`), the APNs client when configured (started before the
/// dispatcher, closed after it), and the dispatcher, which asks canopy-care for fresh windows
/// through `bus`.
public func makeReminderService(
    settings: ReminderServiceSettings, bus: any BusCalling, logger: Logger,
    clock: (any ReminderClock)? = nil
) async throws -> ServiceParts {
    let apns = try settings.apns.map { try APNsChannel(settings: $0, logger: logger) } // its key read before anything is made
    do {
        let store: any ReminderStoring
        if let postgres = settings.postgres {
            store = try await PostgresReminderStore.open(url: postgres.url, poolSize: postgres.poolSize, waitingUpTo: postgres.wait, logger: logger)
        } else {
            try FileManager.default.createDirectory(at: settings.directory, withIntermediateDirectories: true)
            store = try SQLiteReminderStore(path: settings.databasePath)
        }
        let http = try notificationHTTP(allowedHosts: settings.allowedHosts)
        var channels: [any NotificationChannel] = [
            LogChannel(logger: logger), WebhookChannel(http: http), NtfyChannel(http: http),
        ]
        if let apns { channels.append(apns) }
        if settings.rehearsal { channels = channels.map { LogChannel(logger: logger, rehearsing: $0.kind) } }
        let library = ReminderLibrary(store: store, allowedHosts: settings.allowedHosts, channels: Set(channels.map(\.kind)), clock: settings.clock)
        let dispatcher = Dispatcher(
            store: store, channels: channels, clock: clock ?? SystemReminderClock(clock: settings.clock), settings: settings.dispatch,
            refill: { owner in
                // The person's window runs low: canopy-care sends a fresh one through its
                // outbox, in order with the syncs of changes (reminders.sync, to any replica).
                do {
                    _ = try await bus.call(Care.RequestReminderSync.self, .init(), principal: owner, timeout: .seconds(10))
                } catch {
                    logger.warning("remind.refill.failed", metadata: ["remind.error": "\(error)"])
                }
            }, logger: logger)
        return ServiceParts(
            handlers: ReminderService(library: library, dispatcher: dispatcher), background: (apns.map { [$0] } ?? []) + [dispatcher],
            onShutdown: (store as? PostgresReminderStore).map { [$0.database.beginShutdown] } ?? [])
    } catch {
        try? await apns?.client.shutdown() // nothing will run it
        throw error
    }
}
