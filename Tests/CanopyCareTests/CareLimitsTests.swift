import CanopyBroker
import CanopyBus
import CanopyMessages
import CanopyServiceKit
import CanopyTesting
import Foundation
import Testing

@testable import CanopyCare

/// What one person can store and list is bounded, and every field out of range is refused
/// with a message naming it, before anything is written. Requests go through the in-process
/// bus: the runtime validates them once, before a handler runs, as it does on the wire.
struct CareLimitsTests {
    let directory: URL
    let library: CareLibrary
    let care: InProcessBus
    let codec = MessageCodec()

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-care-limits-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        library = CareLibrary(store: try SQLiteCareStore(path: directory.appendingPathComponent("care.sqlite").path), maximumPlants: 5)
        care = InProcessBus(serving: CareService(library: library))
    }

    /// The error `operation` is refused with for alice, or nil when it is answered.
    func refusal<Operation: BusOperation>(_ operation: Operation.Type, _ request: Operation.Request, owner: String = "alice") async -> CanopyError? {
        do {
            _ = try await care.call(operation, request, principal: owner)
            return nil
        } catch let error as CanopyError {
            return error
        } catch {
            return CanopyError(.internal, "\(error)")
        }
    }

    func plantCount() throws -> Int {
        try library.store.read { data in try data.plantCount(owner: "alice") }
    }

    /// A plant with one field far over its limit (built here: test arguments are printed).
    func oversized(_ field: String) -> Care.Plant {
        switch field {
        case "customName": Care.Plant(scientificName: "Ficus lyrata", customName: String(repeating: "x", count: 1_000_000))
        case "location": Care.Plant(scientificName: "Ficus lyrata", location: String(repeating: "y", count: 2_000_000))
        case "family": Care.Plant(scientificName: "Ficus lyrata", family: String(repeating: "z", count: 101))
        case "commonNames[0]": Care.Plant(scientificName: "Ficus lyrata", commonNames: [String(repeating: "n", count: 2_000)])
        case "imageIDs": Care.Plant(scientificName: "Ficus lyrata", imageIDs: Array(repeating: "a", count: 201))
        // One character with 500,000 combining marks: one "character", 1 MB of UTF-8.
        default: Care.Plant(scientificName: "Ficus lyrata", notes: "e" + String(repeating: "\u{301}", count: 500_000))
        }
    }

    @Test(arguments: ["customName", "location", "family", "commonNames[0]", "imageIDs", "notes"])
    func oversizedPlantFieldsAreRefusedByBytesNamingTheField(field: String) async throws {
        let error = await refusal(Care.AddPlant.self, oversized(field))
        #expect(error?.code == .tooLarge)
        #expect(error?.message.hasPrefix(field) == true, "\(error?.message.prefix(120) ?? "")")
        #expect(error?.field == field)
        #expect(try plantCount() == 0)
    }

    @Test func profileOverridesOutOfRangeAreRefusedNamingTheField() async throws {
        let base = try #require(Catalog.shipped.lookup("Monstera deliciosa")?.profile)
        let cases: [(String, (inout Care.Profile) -> Void)] = [
            ("profile.wateringIntervalDays", { $0.wateringIntervalDays = -5 }),
            ("profile.repotIntervalMonths", { $0.repotIntervalMonths = -12 }),
            ("profile.dormancyMonths[0]", { $0.dormancyMonths = [13] }),
            ("profile.dormancyMonths[1]", { $0.dormancyMonths = [1, -1] }),
            (
                "profile temperatures",
                {
                    $0.temperatureMinimumC = 30
                    $0.temperatureMaximumC = 10
                }
            ),
            ("profile.humidity", { $0.humidity = "soggy" }),
            ("profile.temperatureOptimumC", { $0.temperatureOptimumC = 1e9 }),
        ]
        for (field, change) in cases {
            var profile = base
            change(&profile)
            let plant = Care.Plant(scientificName: "Monstera deliciosa", profile: profile, profileOverridden: true)
            let error = await refusal(Care.AddPlant.self, plant)
            #expect(error?.code == .badRequest, "\(field)")
            #expect(error?.message.hasPrefix(field) == true, "\(field): \(error?.message ?? "accepted")")
        }
        #expect(try plantCount() == 0)
    }

    @Test func preferencesOutOfRangeAreRefusedNamingTheField() async throws {
        let cases: [(String, Care.Preferences)] = [
            ("quietStartMinute", Care.Preferences(quietStartMinute: -5, quietEndMinute: 60)),
            ("quietEndMinute", Care.Preferences(quietStartMinute: 60, quietEndMinute: 99_999)),
            ("quietStartMinute and quietEndMinute", Care.Preferences(quietStartMinute: 60)),
            ("preferredMinute", Care.Preferences(preferredMinute: 1_440)),
            (
                "pauseStart",
                Care.Preferences(pauseStart: Date(timeIntervalSince1970: 3_093_527_980_800), pauseEnd: Date(timeIntervalSince1970: 3_093_528_000_000))
            ),
            ("timeZone", Care.Preferences(timeZone: String(repeating: "A", count: 65))),
            ("timeZone", Care.Preferences(timeZone: "Mars/Olympus_Mons")),
            ("timeZone", Care.Preferences(timeZone: "CET+1")),
        ]
        for (field, preferences) in cases {
            let error = await refusal(Care.SetPreferences.self, preferences)
            #expect(error != nil && [.badRequest, .tooLarge].contains(error!.code), "\(field)")
            #expect(error?.message.hasPrefix(field) == true, "\(field): \(error?.message ?? "accepted")")
        }
    }

    @Test func limitsAreRangesNotSpecialValues() async throws {
        let negative = await refusal(Care.UpcomingTasks.self, .init(days: 7, limit: -1))
        #expect(negative?.field == "limit")
        let days = await refusal(Care.UpcomingTasks.self, .init(days: 367))
        #expect(days?.field == "days")
        let list = await refusal(Care.ListPlants.self, .init(limit: 0))
        #expect(list?.field == "limit")
        let year99999 = await refusal(Care.ListPlants.self, .init(addedFrom: Date(timeIntervalSince1970: 3_093_527_980_800)))
        #expect(year99999?.field == "addedFrom")
        let plant = try await care.call(Care.AddPlant.self, Care.Plant(scientificName: "Ficus lyrata"), principal: "alice")
        let never = await refusal(Care.AddCustomTask.self, .init(plantID: plant.id, title: "Wipe", everyDays: 0))
        #expect(never?.field == "everyDays")
        let untitled = await refusal(Care.AddCustomTask.self, .init(plantID: plant.id, title: "", everyDays: 3))
        #expect(untitled?.field == "title")
    }

    @Test func badPlantsAreRefusedAndChangeNothing() async throws {
        let cases: [(String, Care.Plant)] = [
            ("scientificName", Care.Plant(scientificName: " ")),
            ("identificationConfidence", Care.Plant(scientificName: "Ficus", identificationConfidence: 2)),
            ("notes", Care.Plant(scientificName: "Ficus", notes: String(repeating: "x", count: 20_000))),
        ]
        for (field, plant) in cases {
            let error = await refusal(Care.AddPlant.self, plant)
            #expect(error?.field == field, "\(field): \(error?.message ?? "accepted")")
        }
        #expect(try plantCount() == 0)
        // Infinity has no JSON: a plant carrying it cannot reach the bus, and its own check says so.
        var profile = try #require(Catalog.shipped.lookup("Monstera deliciosa")?.profile)
        profile.temperatureOptimumC = .infinity
        #expect(throws: CanopyError.self) { try Care.Plant(scientificName: "Monstera deliciosa", profile: profile, profileOverridden: true).validate() }
    }

    @Test func onePersonKeepsABoundedNumberOfPlants() async throws {
        for index in 0..<5 { _ = try library.add(Care.Plant(scientificName: "Ficus lyrata", customName: "\(index)"), owner: "alice") }
        let error = await refusal(Care.AddPlant.self, Care.Plant(scientificName: "Ficus lyrata"))
        #expect(error?.code == .tooLarge)
        #expect(try plantCount() == 5)
        _ = try library.add(Care.Plant(scientificName: "Ficus lyrata"), owner: "bob") // others are not affected
    }

    @Test func aPageEndsBeforeItOutgrowsOneReplyAndSaysWhereToGoOn() throws {
        let notes = String(repeating: "n", count: 9_000)
        for index in 0..<5 { _ = try library.add(Care.Plant(scientificName: "Ficus lyrata", customName: "\(index)", notes: notes), owner: "alice") }
        var seen: [String] = []
        var offset = 0
        var pages = 0
        while true {
            let page = try library.list(.init(limit: 50, offset: offset), owner: "alice", replyBytes: 48 * 1024)
            #expect(page.total == 5)
            #expect(try codec.encode(page).count <= 48 * 1024)
            #expect(!page.plants.isEmpty)
            seen += page.plants.map(\.id)
            pages += 1
            guard let next = page.nextOffset else { break }
            offset = next
        }
        #expect(pages > 1, "9 KB of notes each: not all five fit in 48 KiB")
        #expect(Set(seen).count == 5)
        #expect(try library.list(.init(limit: 50), owner: "alice").nextOffset == nil, "a 16 MiB reply holds them all")
    }

    @Test func malformedNumbersAndDuplicateKeysAreRefusedNamingTheField() async throws {
        // In process: the bytes go through the decoding and checks the bus uses, no sockets.
        let care = InProcessBus(serving: CareService(library: library))
        for body in [#"{"limit":18446744073709551616}"#, #"{"limit":1.5}"#] {
            let error = await #expect(throws: CanopyError.self) {
                try await care.call(service: Care.ListPlants.service, operation: Care.ListPlants.name, body: Array(body.utf8), principal: "alice")
            }
            #expect(error?.code == .badRequest)
            #expect(error?.message.contains("limit") == true, "\(error?.message ?? "")")
            #expect(error?.message.contains("not valid JSON") == false)
        }
        let duplicate = await #expect(throws: CanopyError.self) {
            try await care.call(
                service: Care.AddPlant.service, operation: Care.AddPlant.name, body: Array(#"{"scientificName":"Ficus lyrata","scientificName":"Other"}"#.utf8),
                principal: "alice")
        }
        #expect(duplicate?.message.contains("'scientificName' appears twice") == true)
        #expect(try plantCount() == 0, "nothing was stored")
        let anonymous = await #expect(throws: CanopyError.self) { try await care.call(Care.ListPlants.self, .init()) }
        #expect(anonymous?.code == .unauthorized)
    }
}

/// The outbox's series: pending, the oldest one's age, deliveries by outcome.
struct OutboxMetricsTests {
    @Test func pendingFollowUpsAndTheirAgeAreReported() async throws {
        _ = Observability.registry
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-care-outbox-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try await withLiveBus { bus in // no canopy-images, no canopy-remind: follow-ups stay pending
            let library = CareLibrary(store: try SQLiteCareStore(path: directory.appendingPathComponent("care.sqlite").path))
            let start = Date()
            let plant = try library.add(Care.Plant(scientificName: "Ficus lyrata"), owner: "alice", now: start)
            try library.delete(plant.id, owner: "alice", now: start)
            let outbox = Outbox(library: library, bus: try bus.client(timeout: .milliseconds(200), asService: true), interval: .seconds(1), logger: bus.logger)
            let later = start.addingTimeInterval(90)
            let pass = await outbox.deliverDue(now: later)
            let figures = await outbox.report(pass, now: later)
            #expect(pass.failed >= 3)
            #expect(figures.pending >= 3 && figures.oldestSeconds >= 89)
            // The series are in the registry (other outboxes of this test process share them,
            // so only the counter, which never goes down, is read as a number).
            let text = Observability.registry.emitToString()
            #expect(text.contains("canopy_care_outbox_pending ") && text.contains("canopy_care_outbox_oldest_seconds "))
            let failed = text.split(separator: "\n").first { $0.hasPrefix(#"canopy_care_outbox_deliveries_total{outcome="failed"} "#) }
            #expect(failed.flatMap { Double($0.split(separator: " ").last ?? "") }.map { $0 >= 3 } == true)
        }
    }
}

/// The same bounds through the real broker, with a small frame limit.
@Suite(.serialized)
struct CareLimitsOnTheBusTests {
    @Test func listingLargePlantsOnASmallBrokerPagesInsteadOfWedging() async throws {
        var configuration = BrokerConfiguration.testing
        configuration.maximumFrameBytes = 64 * 1024
        try await CareServiceTests().withCare(.live, configuration: configuration, credit: 2) { _, client, _, _ in
            let notes = String(repeating: "n", count: 9_500)
            for index in 0..<8 {
                _ = try await client.call(
                    Care.AddPlant.self, Care.Plant(scientificName: "Ficus lyrata", customName: "\(index)", notes: notes), principal: "alice")
            }
            let refused = await #expect(throws: CanopyError.self) {
                try await client.call(
                    Care.AddPlant.self, Care.Plant(scientificName: "Ficus lyrata", customName: String(repeating: "x", count: 60_000)), principal: "alice")
            }
            #expect(refused?.code == .tooLarge)
            // More listings than the worker has credit, every one answered.
            for _ in 0..<8 {
                var offset = 0, ids: Set<String> = []
                while true {
                    let page = try await client.call(Care.ListPlants.self, .init(limit: 100, offset: offset), principal: "alice")
                    ids.formUnion(page.plants.map(\.id))
                    guard let next = page.nextOffset else { break }
                    offset = next
                }
                #expect(ids.count == 8)
            }
        }
    }
}
