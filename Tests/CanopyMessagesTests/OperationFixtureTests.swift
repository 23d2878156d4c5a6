import CanopyMessages
import Foundation
import Testing

/// The request and reply of every `care`, `images` and `remind` operation, pinned as golden JSON in
/// `Fixtures/operations/`, so that a change to the contract is always deliberate: a test
/// fails until the fixture is changed with it. `CANOPY_RECORD_FIXTURES=1 swift test --filter
/// OperationFixtureTests` writes them anew (then read the diff).
struct OperationFixtureTests {
    let codec = MessageCodec()
    static let day = Date(timeIntervalSince1970: 1_780_000_000) // 2026-05-28T20:26:40Z
    static let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures/operations")

    static let profile = Care.Profile(
        light: .brightIndirect, wateringIntervalDays: 7, wateringAmount: "until it drains", temperatureMinimumC: 15, temperatureMaximumC: 30,
        temperatureOptimumC: 22, humidity: "high", fertilizerIntervalDays: 30, fertilizerType: "balanced liquid", dormancyMonths: [12, 1],
        toxicToPets: true, mistIntervalDays: 3, repotIntervalMonths: 24, prune: true)
    static let plant = Care.Plant(
        id: "6f1c9a52-0d6b-4c1e-9a43-2b7f4e8d1c00", scientificName: "Monstera deliciosa", commonNames: ["Swiss cheese plant"], family: "Araceae",
        genus: "Monstera", customName: "Big Monty", location: "Living room", notes: "Repotted in spring", favourite: true,
        imageIDs: [String(repeating: "ab", count: 32)], identificationSource: .plantnet, identificationConfidence: 0.93,
        dateIdentified: day, dateAdded: day, profile: profile, profileOverridden: false)
    static let task = Care.Task(
        id: "6f1c9a52-0d6b-4c1e-9a43-2b7f4e8d1c00:water", plantID: plant.id, kind: .water, title: "Water Big Monty",
        due: day, snoozedUntil: nil)
    static let sha = String(repeating: "0f", count: 32)
    static let photo = Images.Photo(sha256: sha, plantID: plant.id, width: 1200, height: 800, format: "jpeg", bytes: 182_311, addedAt: day)
    /// A window: one task due twice (snoozed the first time), another once.
    static let window = Reminders.Sync.Request(window: [
        Care.Task(id: task.id, plantID: plant.id, kind: .water, title: task.title, due: day, snoozedUntil: day.addingTimeInterval(3_600)),
        Care.Task(id: plant.id + ":mist", plantID: plant.id, kind: .mist, title: "Mist Big Monty", due: day.addingTimeInterval(86_400)),
        Care.Task(id: task.id, plantID: plant.id, kind: .water, title: task.title, due: day.addingTimeInterval(7 * 86_400)),
    ])
    static let device = Reminders.Device(
        id: "0b7e4c1a-9f3d-4e2b-8a6c-5d1f2e3a4b5c", channel: .webhook, address: "https://hooks.example.org/canopy",
        name: "kitchen display", active: true, registeredAt: day)
    static let reminder = Reminders.Reminder(taskID: task.id, plantID: plant.id, kind: .water, title: task.title, due: day, state: .pending)
    static let tier = Images.TierStatistics(entries: 12, bytes: 345_678, limitBytes: 52_428_800, hits: 90, misses: 10, evictions: 2)

    /// Every fixture: its file name and the value it pins.
    static var cases: [(name: String, value: any Encodable)] {
        [
            ("care.catalog.search.request", Care.CatalogSearch.Request(text: "monstera", limit: 5)),
            (
                "care.catalog.search.reply",
                [
                    Care.Species(
                        scientificName: "Monstera deliciosa", commonNames: ["Swiss cheese plant"], family: "Araceae",
                        genus: "Monstera", profile: profile, sources: ["rhs"])
                ]
            ),
            ("care.plants.add.request", plant),
            ("care.plants.add.reply", plant),
            ("care.plants.get.request", Care.GetPlant.Request(id: plant.id)),
            ("care.plants.update.request", plant),
            ("care.plants.delete.request", Care.DeletePlant.Request(id: plant.id)),
            ("care.plants.delete.reply", Empty()),
            (
                "care.plants.list.request",
                Care.ListPlants.Request(
                    search: "mon", favourite: true, family: "Araceae", light: .brightIndirect,
                    watering: .weekly, source: .plantnet, addedFrom: day, addedTo: day,
                    sort: .name, descending: false, limit: 20, offset: 40)
            ),
            ("care.plants.list.reply", Care.ListPlants.Reply(plants: [plant], total: 61, nextOffset: 41)),
            (
                "care.statistics.reply",
                Care.Statistics.Reply(
                    total: 6, favourites: 3, families: ["Araceae": 2], sources: ["plantnet": 4],
                    addedThisMonth: 1, upcomingTasks: 5, overdueTasks: 1)
            ),
            (
                "care.preferences.set.request",
                Care.Preferences(
                    timeZone: "Europe/Berlin", preferredMinute: 540, quietStartMinute: 1_320,
                    quietEndMinute: 420, wateringFactor: 1.2, pauseStart: day,
                    pauseEnd: day.addingTimeInterval(7 * 86_400), southernHemisphere: false)
            ),
            ("care.tasks.upcoming.request", Care.UpcomingTasks.Request(days: 7, limit: 100)),
            ("care.tasks.upcoming.reply", Care.UpcomingTasks.Reply(overdue: [task], upcoming: [task])),
            ("care.tasks.complete.request", Care.CompleteTask.Request(id: task.id, at: day)),
            ("care.tasks.snooze.request", Care.SnoozeTask.Request(id: task.id, until: day)),
            ("care.tasks.skip.request", Care.SkipTask.Request(id: task.id)),
            ("care.tasks.task.reply", task),
            ("care.tasks.add-custom.request", Care.AddCustomTask.Request(plantID: plant.id, title: "Wipe the leaves", everyDays: 14)),
            ("care.log.request", Care.CareLog.Request(plantID: plant.id)),
            ("care.log.reply", [Care.LogEntry(plantID: plant.id, kind: .water, at: day)]),
            ("images.put.request", Images.Put.Request(plantID: plant.id, data: Data([0xFF, 0xD8, 0xFF, 0xE0]))),
            ("images.put.reply", photo),
            ("images.fetch.request", Images.Fetch.Request(plantID: plant.id, url: "https://example.org/monstera.jpg")),
            ("images.variant.request", Images.GetVariant.Request(sha256: sha, variant: .thumbnail, format: .webp)),
            ("images.variant.piece.request", Images.GetVariant.Request(sha256: sha, variant: .full, format: .jpeg, offset: 8_388_608)),
            (
                "images.variant.reply",
                Images.GetVariant.Reply(
                    sha256: sha, variant: .full, format: .jpeg, width: 5_472, height: 3_648,
                    data: Data([0xFF, 0xD8]), source: "original", offset: 8_388_608,
                    totalBytes: 19_700_000, nextOffset: 16_777_216)
            ),
            ("images.palette.request", Images.Palette.Request(sha256: sha)),
            (
                "images.palette.reply",
                Images.Palette.Reply(
                    sha256: sha,
                    swatches: [
                        Images.Swatch(
                            role: "vibrant", hex: "#3a7d44", population: 0.42,
                            oklab: [0.52, -0.09, 0.07])
                    ], cached: true)
            ),
            ("images.list.request", Images.List.Request(plantID: plant.id)),
            ("images.list.reply", [photo]),
            ("images.purge.request", Images.Purge.Request(plantID: plant.id, sha256: sha)),
            ("images.purge.reply", Images.Purge.Reply(photos: 1)),
            ("images.warm.request", Images.Warm.Request(sha256s: [sha], variants: [.thumbnail, .gallery], format: .jpeg)),
            ("images.warm.reply", Images.Warm.Reply(made: 2, alreadyCached: 0)),
            (
                "images.variants.request",
                Images.GetVariants.Request(keys: [
                    .init(principal: "user-42", sha256: sha, variant: .thumbnail),
                    .init(principal: "user-7", sha256: sha, variant: .gallery, format: .webp),
                ])
            ),
            (
                "images.variants.reply",
                Images.GetVariants.Reply(
                    results: [
                        .init(value: .init(width: 150, height: 150, source: "memory", bytes: 2)),
                        .init(error: CanopyError(.notFound, "no photo \(sha) among yours")),
                    ],
                    attachments: [Data([0xFF, 0xD8])])
            ),
            ("care.tasks.next.request", Care.NextTasks.Request(keys: [.init(principal: "user-42", plantID: plant.id)])),
            (
                "care.tasks.next.reply",
                Care.NextTasks.Reply(results: [
                    .init(value: .init(task: task)), .init(value: .init(task: nil)),
                    .init(error: CanopyError(.notFound, "no plant p-9 in your collection")),
                ])
            ),
            (
                "images.stats.reply",
                Images.Stats.Reply(
                    memory: tier, disk: tier, originals: 3, originalBytes: 9_000_000, palettes: 2,
                    memoryPressure: "normal")
            ),
            ("care.tasks.reminder-sync.request", Care.RequestReminderSync.Request()),
            ("remind.reminders.sync.request", window),
            ("remind.reminders.cancel-plant.request", Reminders.CancelPlant.Request(plantID: plant.id)),
            (
                "remind.devices.register.request",
                Reminders.RegisterDevice.Request(
                    channel: .webhook, address: "https://hooks.example.org/canopy",
                    name: "kitchen display", secret: "whsec_" + String(repeating: "A", count: 32))
            ),
            ("remind.devices.register.reply", device),
            ("remind.devices.remove.request", Reminders.RemoveDevice.Request(id: device.id)),
            ("remind.devices.list.request", Empty()),
            ("remind.devices.list.reply", [device]),
            ("remind.reminders.pending.request", Reminders.Pending.Request(limit: 64)),
            ("remind.reminders.pending.reply", [reminder]),
            ("remind.reminders.failures.request", Reminders.Failures.Request(limit: 100)),
            (
                "remind.reminders.failures.reply",
                [
                    Reminders.Failure(
                        reminder: reminder, deviceID: device.id, attempts: 8,
                        lastError: "the webhook answered HTTP 503", at: day)
                ]
            ),
            ("remind.reminders.send-test.request", Reminders.SendTest.Request(deviceID: device.id)),
            ("remind.reminders.send-test.reply", Reminders.SendTest.Reply(accepted: true, detail: "HTTP 200")),
        ]
    }

    @Test(arguments: cases.map(\.name))
    func theWireFormatIsPinned(name: String) throws {
        let value = try #require(Self.cases.first { $0.name == name }?.value)
        let encoded = try codec.encode(value)
        let file = Self.directory.appendingPathComponent(name + ".json")
        if ProcessInfo.processInfo.environment["CANOPY_RECORD_FIXTURES"] == "1" {
            try FileManager.default.createDirectory(at: Self.directory, withIntermediateDirectories: true)
            try Data(encoded + [0x0A]).write(to: file)
            return
        }
        var pinned = [UInt8](try Data(contentsOf: file))
        while pinned.last == 0x0A { pinned.removeLast() }
        #expect(
            String(decoding: encoded, as: UTF8.self) == String(decoding: pinned, as: UTF8.self),
            "\(name) changed; if on purpose, record the fixtures again (CANOPY_RECORD_FIXTURES=1)")
    }

    @Test func everyCareImagesAndRemindOperationHasItsRequestPinned() {
        let pinned = Set(Self.cases.map(\.name))
        let operations: [any BusOperation.Type] = [
            Care.CatalogSearch.self, Care.AddPlant.self, Care.GetPlant.self, Care.UpdatePlant.self, Care.DeletePlant.self, Care.ListPlants.self,
            Care.SetPreferences.self, Care.UpcomingTasks.self, Care.CompleteTask.self, Care.SnoozeTask.self, Care.SkipTask.self,
            Care.AddCustomTask.self, Care.CareLog.self,
            Care.RequestReminderSync.self, Care.NextTasks.self,
            Images.Put.self, Images.GetVariants.self, Images.Fetch.self, Images.GetVariant.self, Images.Palette.self, Images.List.self, Images.Purge.self,
            Images.Warm.self,
            Reminders.Sync.self, Reminders.CancelPlant.self, Reminders.RegisterDevice.self, Reminders.RemoveDevice.self, Reminders.ListDevices.self,
            Reminders.Pending.self, Reminders.Failures.self, Reminders.SendTest.self,
        ]
        for operation in operations {
            let full = operation.name.hasPrefix(operation.service + ".") ? operation.name : "\(operation.service).\(operation.name)"
            let name = full + ".request"
            #expect(pinned.contains(name), "\(name) is not pinned")
        }
    }
}
