import CVips
import CanopyBroker
import CanopyBus
import CanopyMessages
import CanopyTesting
import Foundation
import GRDB
import Synchronization
import Testing

@testable import CanopyCare
@testable import CanopyImages

/// canopy-care on the bus (in process, and over the real broker for the lifecycle), and its
/// outbox delivering to the real canopy-images.
@Suite(.serialized)
struct CareServiceTests {
    func withCare(
        _ mode: BusMode = .inProcess, configuration: BrokerConfiguration = .testing, credit: Int = 4,
        _ body: (TestBus, any BusCalling, CareLibrary, URL) async throws -> Void
    ) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-care-live-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try await withTestBus(mode, configuration: configuration) { bus in
            let library = CareLibrary(store: try SQLiteCareStore(path: directory.appendingPathComponent("care.sqlite").path))
            try await bus.serve(CareService(library: library), credit: credit)
            try await body(bus, try bus.client(), library, directory)
        }
    }

    @Test(arguments: BusMode.allCases) func thePlantLifecycleWorksOverTheBus(_ mode: BusMode) async throws {
        try await withCare(mode) { _, client, _, _ in
            let added = try await client.call(Care.AddPlant.self, Care.Plant(scientificName: "Monstera deliciosa", favourite: true), principal: "alice")
            #expect(added.family == "Araceae" && added.commonNames.contains("Swiss cheese plant"))
            #expect(added.profile?.wateringIntervalDays == 7)
            var edited = added
            edited.customName = "Big Monty"
            edited.profile?.wateringIntervalDays = 10
            edited.profileOverridden = true
            let updated = try await client.call(Care.UpdatePlant.self, edited, principal: "alice")
            #expect(updated.customName == "Big Monty" && updated.profile?.wateringIntervalDays == 10 && updated.profileOverridden)

            let list = try await client.call(Care.ListPlants.self, .init(search: "swiss"), principal: "alice")
            #expect(list.plants.map(\.id) == [added.id])
            let tasks = try await client.call(Care.UpcomingTasks.self, .init(days: 30), principal: "alice")
            #expect(tasks.upcoming.contains { $0.kind == .water })
            let stats = try await client.call(Care.Statistics.self, .init(), principal: "alice")
            #expect(stats.total == 1 && stats.favourites == 1)

            let missing = await #expect(throws: CanopyError.self) { _ = try await client.call(Care.GetPlant.self, .init(id: added.id), principal: "bob") }
            #expect(missing?.code == .notFound)
            let anonymous = await #expect(throws: CanopyError.self) { _ = try await client.call(Care.ListPlants.self, .init()) }
            #expect(anonymous?.code == .unauthorized)
            let zone = await #expect(throws: CanopyError.self) {
                _ = try await client.call(Care.SetPreferences.self, .init(timeZone: "Atlantis/Capital"), principal: "alice")
            }
            #expect(zone?.code == .badRequest)
            _ = try await client.call(Care.DeletePlant.self, .init(id: added.id), principal: "alice")
            #expect(try await client.call(Care.ListPlants.self, .init(), principal: "alice").total == 0)
        }
    }

    @Test func followUpsAreDeliveredWhenTheirServiceIsUpAndRetriedWhenItIsNot() async throws {
        try await withCare { bus, client, library, directory in
            let images = try ImageLibrary(directory: directory.appendingPathComponent("images"))
            try await bus.serve(ImageService(library: images))
            let plant = try await client.call(Care.AddPlant.self, Care.Plant(scientificName: "Ficus lyrata"), principal: "alice")
            let photo = try await client.call(Images.Put.self, .init(plantID: plant.id, data: Data(Self.jpeg)), principal: "alice")
            _ = try await client.call(Care.DeletePlant.self, .init(id: plant.id), principal: "alice")

            let outbox = Outbox(library: library, bus: try bus.client(timeout: .seconds(2), asService: true), interval: .seconds(1), logger: bus.logger)
            let now = Date()
            let first = await outbox.deliverDue(now: now)
            #expect(first.delivered == 1, "images.purge reached canopy-images")
            #expect(first.failed == 2, "canopy-remind and canopy-identify are not running yet; canopy-remind's second follow-up waits behind its first")
            #expect(try await client.call(Images.List.self, .init(plantID: plant.id), principal: "alice").isEmpty)
            #expect(throws: (any Error).self) { _ = try images.store.original(photo.sha256) }

            // Nothing is lost: the rest waits, with backoff, across a restart.
            #expect(await outbox.deliverDue(now: now).failed == 0, "not due again yet")
            let reopened = try SQLiteCareStore(path: try #require(library.store as? SQLiteCareStore).database.path)
            let pending = try reopened.database.read { db in
                try Row.fetchAll(db, sql: "SELECT operation, attempts, lastError FROM outbox ORDER BY id")
            }
            #expect(Set(pending.map { $0["operation"] as String }) == [Reminders.CancelPlant.name, Identification.ForgetPlant.name, Reminders.Sync.name])
            // canopy-remind's two go in their order: the first was tried, the second waits behind it.
            let tried = pending.filter { ($0["attempts"] as Int) == 1 }
            #expect(tried.count == 2 && tried.allSatisfy { ($0["lastError"] as String).contains("noWorkers") })
            let waiting = pending.filter { ($0["attempts"] as Int) == 0 }
            #expect(waiting.count == 1 && [Reminders.CancelPlant.name, Reminders.Sync.name].contains(waiting.first?["operation"] as String? ?? ""))
            let later = await Outbox(
                library: CareLibrary(store: reopened), bus: try bus.client(timeout: .seconds(2), asService: true), interval: .seconds(1), logger: bus.logger
            )
            .deliverDue(now: now.addingTimeInterval(3))
            #expect(later.failed == 2, "retried after the backoff, canopy-remind's second still behind its first")
        }
    }

    /// The outbox sleeps until a commit adds a follow-up, not until its timer: with an hour's
    /// interval, a window still reaches canopy-remind at once; and a backlog of many people's
    /// windows goes side by side, each arriving once.
    @Test func aCommitWakesTheOutboxAndManyPeoplesFollowUpsGoSideBySide() async throws {
        try await withCare { bus, client, library, _ in
            let remind = SyncRecorder { _ in }
            try await bus.serve(remind, credit: 32)
            let outbox = Outbox(library: library, bus: try bus.client(timeout: .seconds(10), asService: true), interval: .seconds(3_600), logger: bus.logger)
            try await withRunning([outbox], logger: bus.logger) {
                #expect(try await eventually { outbox.passes.count >= 1 }, "its first pass is done: asleep now, for an hour")
                _ = try await client.call(Care.AddPlant.self, Care.Plant(scientificName: "Ficus lyrata"), principal: "alice")
                #expect(try await eventually(within: .seconds(30)) { remind.windows.withLock { !$0.isEmpty } }, "the commit woke the outbox")
                let owners = (0..<300).map { "person-\($0)" }
                for owner in owners { _ = try library.add(Care.Plant(scientificName: "Monstera deliciosa"), owner: owner) }
                #expect(try await eventually(within: .seconds(30)) { remind.windows.withLock { $0.count } >= 301 })
                #expect(remind.windows.withLock { $0.count } == 301, "each person's window once")
                // Confirmed ones are deleted when their pass ends, after they arrived.
                #expect(
                    try await eventually(within: .seconds(30)) {
                        try await library.store.pendingFollowUps().count == 0
                    }, "every confirmed follow-up is deleted")
            }
        }
    }

    /// While a lane waits for a retry, the follow-up behind it is due but not sent: the outbox
    /// sleeps until the retry instead of turning without pause (it made thousands of passes a
    /// second before).
    @Test func aLaneWaitingForARetryDoesNotKeepTheOutboxTurning() async throws {
        try await withCare { bus, client, library, _ in // nobody serves canopy-remind
            let outbox = Outbox(library: library, bus: try bus.client(timeout: .seconds(2), asService: true), interval: .seconds(3_600), logger: bus.logger)
            let store = try #require(library.store as? SQLiteCareStore)
            func mostAttempts() throws -> Int {
                try store.database.read { db in try Int.fetchOne(db, sql: "SELECT MAX(attempts) FROM outbox") ?? 0 }
            }
            try await withRunning([outbox], logger: bus.logger) {
                let plant = try await client.call(Care.AddPlant.self, Care.Plant(scientificName: "Ficus lyrata"), principal: "alice")
                _ = try await client.call(Care.DeletePlant.self, .init(id: plant.id), principal: "alice")
                #expect(try await eventually { try mostAttempts() >= 1 }, "the first failed")
                let passesAtFirstFailure = outbox.passes.count
                // The retry comes 1 s later, then 2 s after that.
                #expect(try await eventually(within: .seconds(20)) { try mostAttempts() >= 3 }, "retried with backoff")
                let passes = outbox.passes.count - passesAtFirstFailure
                // Three lanes (remind, images, identify) fail and retry; each retry is a pass,
                // and so is the wake-up its own commit makes: about a dozen (5,493 before).
                #expect(passes <= 40, "\(passes) passes in 3 s of waiting for retries")
            }
        }
    }

    /// A change made while the person's reminder sync is on its way (its window already read)
    /// is not lost: the row stays, and the next pass sends the newer window. Before, the
    /// change found the sync pending, added none, and the sent row was deleted.
    @Test func aChangeWhileItsSyncIsOnItsWayGoesInTheNextSync() async throws {
        try await withCare { bus, client, library, _ in
            let plant = try await client.call(Care.AddPlant.self, Care.Plant(scientificName: "Ficus lyrata"), principal: "alice")
            let task = try #require(
                try await client.call(Care.UpcomingTasks.self, .init(days: 60), principal: "alice").upcoming.first { $0.plantID == plant.id })
            let until = Date(timeIntervalSince1970: (Date().timeIntervalSince1970 + 3_600).rounded())
            let remind = SyncRecorder { library in
                _ = try library.snooze(task.id, until: until, owner: "alice") // the change, while the first sync is answered
            }
            remind.library = library
            try await bus.serve(remind)

            let outbox = Outbox(library: library, bus: try bus.client(timeout: .seconds(10), asService: true), interval: .seconds(1), logger: bus.logger)
            _ = await outbox.deliverDue()
            _ = await outbox.deliverDue()
            let windows = remind.windows.withLock { $0 }
            #expect(windows.count == 2, "the sync on its way during the snooze was sent again")
            #expect(windows.first?.tasks.first { $0.id == task.id }?.snoozedUntil == nil)
            #expect(windows.last?.tasks.first { $0.id == task.id }?.snoozedUntil == until, "the second window has the snooze")
            #expect(await outbox.deliverDue().delivered == 0, "and then nothing is left")
        }
    }

    /// A canopy-remind stand-in that records the windows it is handed, and makes a change in
    /// canopy-care while it answers the first.
    final class SyncRecorder: BusService, @unchecked Sendable {
        let name = Reminders.service
        let windows = Mutex<[Reminders.Sync.Request]>([])
        let change: @Sendable (CareLibrary) throws -> Void
        var library: CareLibrary?

        init(change: @escaping @Sendable (CareLibrary) throws -> Void) { self.change = change }

        func register(_ handlers: inout OperationHandlers) {
            handlers.on(Reminders.Sync.self) { [self] request, _, _ in
                let first = windows.withLock { windows in
                    windows.append(request)
                    return windows.count == 1
                }
                if first, let library { try change(library) }
                return Empty()
            }
        }
    }

    /// A real photo-like JPEG, made with libvips.
    static var jpeg: [UInt8] {
        _ = canopy_vips_start()
        let image = canopy_vips_pattern(640, 480)!
        defer { canopy_vips_release(image) }
        var bytes: UnsafeMutableRawPointer?
        var length = 0
        precondition(canopy_vips_encode(image, CANOPY_JPEG, 85, &bytes, &length) == 0)
        defer { canopy_vips_free(bytes) }
        return Array(UnsafeRawBufferPointer(start: bytes, count: length))
    }
}
