import CanopyBroker
import CanopyBus
import CanopyCare
import CanopyImages
import CanopyImaging
import CanopyMessages
import CanopySamples
import CanopyServiceKit
import CanopyStore
import CanopyTesting
import Foundation
import Testing

@testable import CanopyIdentify

/// canopy-identify as `serve` makes it, with the real canopy-images and canopy-care beside
/// it and a local server that behaves as Pl@ntNet's API does: on the in-process bus, and
/// through the real broker (`.live`) as `serve` builds it where the test says so.
@Suite(.serialized)
struct IdentificationServiceTests {
    struct Stack {
        let bus: TestBus
        let client: any BusCalling
        let tools: IdentificationTools
        let plantNet: FakePlantNet?
        /// Where `/metrics` and `/health` listen (live only).
        let operatingPort: Int?

        func submit(
            _ photos: [[UInt8]], organs: [Identification.Organ]? = nil, as owner: String = "alice",
            location: Identification.Location? = nil, exact: Bool = false
        ) async throws -> Identification.Record {
            let inputs = (organs ?? Array(repeating: .leaf, count: photos.count)).map { Identification.PhotoInput(organ: $0) }
            return try await client.call(
                Identification.Submit.self, .init(photos: inputs, data: photos.map { Data($0) }, location: location, exactLocation: exact),
                principal: owner, timeout: .seconds(60))
        }
    }

    /// canopy-identify (`replicas` of it, on one PostgreSQL database when more than one or
    /// `postgres`), canopy-images and canopy-care on a test bus.
    func withStack(
        _ provider: Identification.Provider = .reference, remaining: Int = 500, references: Int = 0, mode: BusMode = .inProcess,
        replicas: Int = 1, postgres: Bool = false, _ body: (Stack) async throws -> Void
    ) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-identify-live-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        try await withTestBus(mode) { bus in
            let images = ImageServiceSettings(directory: directory.appendingPathComponent("images"), runner: bus.runnerConfiguration(credit: 8))
            var care = CareServiceSettings(directory: directory.appendingPathComponent("care"), runner: bus.runnerConfiguration())
            care.outboxInterval = .milliseconds(200)
            var settings = IdentificationServiceSettings(
                directory: directory.appendingPathComponent("identify"), runner: bus.runnerConfiguration(credit: 8),
                metrics: .anyLoopbackPort)
            settings.provider = provider
            settings.sweepInterval = .milliseconds(200)
            if postgres || replicas > 1 {
                settings.postgres = PostgresSettings(url: try await PostgresServer.shared().database(), poolSize: 4)
            }
            let tools = try await IdentificationTools(databasePath: settings.databasePath, postgres: settings.postgres, logger: bus.logger)
            for index in 0..<references {
                try tools.addReferences(
                    .init(scientificName: ReferenceMatchingTests.name(index), commonNames: ["Test plant \(index)"], family: "Testaceae"),
                    photos: try (0..<3).map { try PlantScene.species(index).photo(seed: $0) })
            }
            var plantNet: FakePlantNet?
            if provider != .reference {
                let fake = FakePlantNet(remaining: remaining)
                bus.run([fake.application])
                var remote = PlantNetSettings(apiKey: FakePlantNet.key)
                remote.baseURL = try await fake.baseURL()
                remote.backoff = [.milliseconds(10), .milliseconds(20), .milliseconds(40)]
                settings.plantNet = remote
                plantNet = fake
            }
            var operatingPort: Int?
            if let live = bus.live {
                live.run(try await buildImageService(settings: images, context: live.context, logger: live.logger))
                live.run(try await buildCareService(settings: care, context: live.context, logger: live.logger))
                let identify = try await buildIdentificationService(settings: settings, context: live.context, logger: live.logger)
                let listener = try #require(identify.first(OperatingEndpoint.self))
                live.run(identify)
                for _ in 1..<replicas {
                    var replica = settings
                    replica.metrics = nil
                    live.run(try await buildIdentificationService(settings: replica, context: live.context, logger: live.logger))
                }
                for service in [Images.service, Care.service] {
                    try await live.waitForWorkers(1, service: service)
                }
                try await live.waitForWorkers(replicas, service: Identification.service)
                operatingPort = try await listener.boundPort(within: .seconds(60))
            } else {
                precondition(replicas == 1, "replicas of a service run on the live bus")
                try await bus.run(try await makeImageService(settings: images, logger: bus.logger))
                try await bus.run(try await makeCareService(settings: care, bus: try bus.client(asService: true), logger: bus.logger))
                try await bus.run(
                    try await makeIdentificationService(settings: settings, bus: try bus.client(timeout: .seconds(60), asService: true), logger: bus.logger))
            }
            try await body(Stack(bus: bus, client: try bus.client(timeout: .seconds(60)), tools: tools, plantNet: plantNet, operatingPort: operatingPort))
        }
    }

    static func photo(_ species: Int, seed: Int, width: Int = 320, height: Int = 240) throws -> [UInt8] {
        try PlantScene.species(species).photo(seed: seed, width: width, height: height)
    }

    // MARK: - Submit, dedupe, accept

    @Test func submitStoresThePhotosRanksTheSpeciesAndAcceptingAddsThePlantOnce() async throws {
        try await withStack(references: 10) { stack in
            let photos = [try Self.photo(2, seed: 40), try Self.photo(2, seed: 41)]
            let record = try await stack.submit(photos, organs: [.leaf, .flower], location: .init(latitude: 52.520_008, longitude: 13.404_954))
            #expect(record.owner == "alice" && record.provider == .reference && record.organs == [.leaf, .flower])
            #expect(record.results.first?.scientificName == ReferenceMatchingTests.name(2))
            #expect(record.results.first?.commonNames == ["Test plant 2"])
            #expect(record.location == .init(latitude: 52.52, longitude: 13.4), "coarsened to about 1 km")
            #expect(record.photoIDs == photos.map(IdentificationLibrary.sha256))
            let stored = try await stack.client.call(Images.List.self, .init(plantID: record.plantID), principal: "alice")
            #expect(Set(stored.map(\.sha256)) == Set(record.photoIDs), "the photos went through canopy-images")

            // The same photos and organs again (in another order): the same identification, at once.
            let again = try await stack.submit(photos.reversed(), organs: [.flower, .leaf])
            #expect(again == record)
            let exact = try await stack.submit([try Self.photo(3, seed: 42)], location: .init(latitude: 52.520_008, longitude: 13.404_954), exact: true)
            #expect(exact.location?.latitude == 52.520_008)

            let accepted = try await stack.client.call(Identification.Accept.self, .init(id: record.id, rank: 1, customName: "Lab plant"), principal: "alice")
            #expect(accepted.plant.id == record.plantID)
            #expect(accepted.plant.scientificName == "Plantae species2" && accepted.plant.customName == "Lab plant")
            #expect(accepted.plant.identificationSource == .reference)
            #expect(accepted.plant.identificationConfidence == record.results[0].score)
            #expect(Set(accepted.plant.imageIDs) == Set(record.photoIDs))
            #expect(accepted.identification.acceptedAt != nil && accepted.identification.acceptedName == "Plantae species2")
            let twice = try await stack.client.call(Identification.Accept.self, .init(id: record.id, rank: 2), principal: "alice")
            #expect(twice.plant == accepted.plant, "accepting again makes no second plant")
            #expect(try await stack.client.call(Care.ListPlants.self, .init(), principal: "alice").total == 1)

            let typed = try await stack.client.call(Identification.Accept.self, .init(id: exact.id, scientificName: "Monstera deliciosa"), principal: "alice")
            #expect(typed.plant.identificationSource == .manual && typed.plant.identificationConfidence == nil && typed.plant.family == "Araceae")
        }
    }

    /// A process that died mid-submission (its claim taken, a photo stored, no record) leaves
    /// nothing behind: the same photos again are identified (under its plant id, or a new one
    /// once the sweep has cleared it), and photos nobody submits again are purged.
    @Test func whatAProcessThatDiedMidSubmissionStoredIsTakenOverOrPurged() async throws {
        try await withStack(references: 3) { stack in
            // The tools' store stands for the process that died: a claim of another holder.
            let died = stack.tools.store
            let (again, abandoned) = (try Self.photo(1, seed: 60), try Self.photo(2, seed: 61))
            for (photo, plantID) in [(again, "left-behind"), (abandoned, "never-named")] {
                let key = IdentificationLibrary.submissionKey([(IdentificationLibrary.sha256(Data(photo)), .leaf)])
                #expect(try died.claimSubmission(owner: "alice", key: key, plantID: plantID, now: Date(), until: Date() + 120) == plantID)
                _ = try await stack.client.call(Images.Put.self, .init(plantID: plantID, data: Data(photo)), principal: "alice")
            }
            // The same photos again: identified, their photo under the identification's plant.
            let record = try await stack.submit([again])
            let kept = try await stack.client.call(Images.List.self, .init(plantID: record.plantID), principal: "alice")
            #expect(kept.map(\.sha256) == record.photoIDs)
            // Nothing stays under a plant id no identification names.
            func photos(_ plantID: String) async throws -> Int {
                try await stack.client.call(Images.List.self, .init(plantID: plantID), principal: "alice").count
            }
            #expect(try await eventually { try await photos("never-named") == 0 }, "the sweep purged the photo nobody submitted again")
            if record.plantID != "left-behind" {
                #expect(try await eventually { try await photos("left-behind") == 0 })
            }
            // And the claims go (the sweep lets go of each once its photos are purged).
            #expect(
                try await eventually { try died.takeAbandonedSubmissions(now: Date() + 1, until: Date() + 121, limit: 10).isEmpty }, "every claim is cleared")
        }
    }

    @Test func everyPersonSeesAndChangesOnlyTheirOwn() async throws {
        try await withStack(references: 4) { stack in
            let photo = try Self.photo(1, seed: 9)
            let alices = try await stack.submit([photo])
            for call in [
                { try await stack.client.call(Identification.Get.self, .init(id: alices.id), principal: "bob") as Any },
                { try await stack.client.call(Identification.Accept.self, .init(id: alices.id, rank: 1), principal: "bob") as Any },
            ] {
                let error = await #expect(throws: CanopyError.self) { _ = try await call() }
                #expect(error?.code == .notFound)
            }
            #expect(try await stack.client.call(Identification.History.self, .init(), principal: "bob").items.isEmpty)
            _ = try await stack.bus.client(asService: true).call(Identification.ForgetPlant.self, .init(plantID: alices.plantID), principal: "bob")
            #expect(try await stack.client.call(Identification.Get.self, .init(id: alices.id), principal: "alice") == alices)

            // The same photo from Bob is Bob's identification, not Alice's.
            let bobs = try await stack.submit([photo], as: "bob")
            #expect(bobs.id != alices.id && bobs.owner == "bob")
            // Nor may Bob name Alice's stored photo.
            let borrowed = await #expect(throws: CanopyError.self) {
                _ = try await stack.client.call(
                    Identification.Submit.self, .init(photos: [.init(organ: .leaf, photoID: alices.photoIDs[0])]), principal: "mallory")
            }
            #expect(borrowed?.code == .notFound)
            // By id, Alice's own stored photo works.
            let byID = try await stack.client.call(
                Identification.Submit.self, .init(photos: [.init(organ: .bark, photoID: alices.photoIDs[0])]), principal: "alice")
            #expect(byID.photoIDs == alices.photoIDs && byID.id != alices.id, "another organ is another submission")
            let anonymous = await #expect(throws: CanopyError.self) {
                _ = try await stack.client.call(Identification.History.self, .init())
            }
            #expect(anonymous?.code == .unauthorized)
        }
    }

    /// `references.add` over the bus: the operator's, matched at once; a person may not call
    /// it, and a photo that is no image changes nothing.
    @Test func referencesAddedOverTheBusAreMatchedAndOnlyAnOperatorMayAddThem() async throws {
        try await withStack { stack in
            let photos = try (1...3).map { Data(try Self.photo(2, seed: $0)) }
            let added = try await stack.client.call(
                Identification.AddReferences.self,
                .init(scientificName: "Ficus exemplaris Demo.", commonNames: ["Demo fig"], family: "Moraceae", data: photos))
            #expect(added == .init(scientificName: "Ficus exemplaris Demo.", photos: 3))
            #expect(try stack.tools.references().map(\.scientificName) == ["Ficus exemplaris Demo."])
            let match = try await stack.submit([try Self.photo(2, seed: 40)])
            #expect(match.results.first?.scientificName.hasPrefix("Ficus exemplaris") == true, "\(match.results)")

            let person = await #expect(throws: CanopyError.self) {
                _ = try await stack.client.call(Identification.AddReferences.self, .init(scientificName: "Ficus sneaky", data: photos), principal: "mallory")
            }
            #expect(person?.code == .unauthorized)
            let broken = await #expect(throws: CanopyError.self) {
                _ = try await stack.client.call(Identification.AddReferences.self, .init(scientificName: "Ficus broken", data: [Data("not an image".utf8)]))
            }
            #expect(broken != nil)
            #expect(try stack.tools.references().map(\.scientificName) == ["Ficus exemplaris Demo."], "nothing of the broken one was added")
        }
    }

    @Test func historyIsNewestFirstInPagesAndForgettingAPlantForgetsItsIdentifications() async throws {
        try await withStack(references: 3) { stack in
            var records: [Identification.Record] = []
            for seed in 0..<5 {
                records.append(try await stack.submit([try Self.photo(seed % 3, seed: 100 + seed)]))
            }
            var seen: [String] = []
            var after: String?
            repeat {
                let page = try await stack.client.call(Identification.History.self, .init(limit: 2, after: after), principal: "alice")
                #expect(page.items.count <= 2)
                seen += page.items.map(\.id)
                after = page.next
            } while after != nil
            #expect(seen == records.reversed().map(\.id))

            let accepted = try await stack.client.call(Identification.Accept.self, .init(id: records[1].id, rank: 1), principal: "alice")
            let forPlant = try await stack.client.call(Identification.History.self, .init(plantID: accepted.plant.id), principal: "alice")
            #expect(forPlant.items.map(\.id) == [records[1].id])

            // Deleting the plant in canopy-care reaches canopy-identify through care's outbox.
            _ = try await stack.client.call(Care.DeletePlant.self, .init(id: accepted.plant.id), principal: "alice")
            #expect(
                try await eventually(within: .seconds(20)) {
                    try await stack.client.call(Identification.History.self, .init(plantID: accepted.plant.id), principal: "alice").items.isEmpty
                }, "care's outbox called identifications.forget-plant")
            let gone = await #expect(throws: CanopyError.self) {
                _ = try await stack.client.call(Identification.Get.self, .init(id: records[1].id), principal: "alice")
            }
            #expect(gone?.code == .notFound)
            #expect(try await stack.client.call(Identification.History.self, .init(), principal: "alice").items.count == 4)
        }
    }

    /// A plant photo whose features are missing (the matcher's format changed) is described
    /// again from canopy-images' `small` variant by the person's next identification.
    @Test func aPlantPhotoWithoutFeaturesIsDescribedAgainByTheNextIdentification() async throws {
        try await withStack(references: 3) { stack in
            let photos = try (0..<3).map { try PlantScene.species(310).photo(seed: $0) }
            let record = try await stack.submit(photos)
            _ = try await stack.client.call(Identification.Accept.self, .init(id: record.id, scientificName: "My plant"), principal: "alice")
            try stack.tools.store.deleteFeatures(record.photoIDs)
            #expect(try stack.tools.store.plantPhotosWithoutFeatures(owner: "alice", limit: 8).count == 3)
            // Someone else's identification describes none of Alice's photos.
            _ = try await stack.submit([try Self.photo(1, seed: 20)], as: "bob")
            #expect(try stack.tools.store.plantPhotosWithoutFeatures(owner: "alice", limit: 8).count == 3)
            let next = try await stack.submit([try PlantScene.species(310).photo(seed: 3)])
            #expect(try stack.tools.store.plantPhotosWithoutFeatures(owner: "alice", limit: 8).isEmpty)
            #expect(try stack.tools.store.features(record.photoIDs).count == 3)
            #expect(next.results.first?.plantID == record.plantID, "\(next.results.prefix(2).map { "\($0.plantID ?? $0.scientificName) \($0.score)" })")
        }
    }

    @Test func aNewPhotoOfOneOfAPersonsTwentyPlantsNamesThatPlant() async throws {
        try await withStack(references: 10) { stack in
            var plants: [String] = []
            for index in 0..<20 {
                // Identified from three photos, which stay the plant's.
                let record = try await stack.submit(try (0..<3).map { try PlantScene.species(300 + index).photo(seed: $0) })
                plants.append(
                    try await stack.client.call(Identification.Accept.self, .init(id: record.id, scientificName: "Plant \(index)"), principal: "alice").plant.id
                )
            }
            // The matcher names the right one of 20 for about four in five new photos
            // (docs/PERFORMANCE.md); every one named that way is accepted as that plant.
            var named = 0
            for index in 0..<20 {
                // Two new photos, as the app sends 1 to 5.
                let record = try await stack.submit([try PlantScene.species(300 + index).photo(seed: 3), try PlantScene.species(300 + index).photo(seed: 4)])
                guard record.results.first?.plantID == plants[index] else { continue }
                named += 1
                // Accepting "that is my plant" adds nothing to the collection.
                let accepted = try await stack.client.call(Identification.Accept.self, .init(id: record.id, rank: 1), principal: "alice")
                #expect(accepted.plant.id == plants[index])
            }
            #expect(named >= 16, "the right plant first for \(named) of 20")
            #expect(try await stack.client.call(Care.ListPlants.self, .init(), principal: "alice").total == 20)
            // Bob's photos are never matched against Alice's plants.
            let bobs = try await stack.submit([try PlantScene.species(305).photo(seed: 3)], as: "bob")
            #expect(bobs.results.allSatisfy { $0.plantID == nil })
        }
    }

    @Test func whatServeBuildsIsHealthyAndCountsItsWork() async throws {
        try await withStack(references: 2, mode: .live) { stack in
            let port = try #require(stack.operatingPort)
            #expect(try await OperatingProbe.waitForHealth(port, status: 200))
            let before = try await OperatingProbe.metrics(port)
            let photo = try Self.photo(1, seed: 30) // not one of the reference photos (seeds 1 to 3)
            _ = try await stack.submit([photo])
            _ = try await stack.submit([photo])
            // Other suites of this process share the registry: compare growth only.
            let after = try await OperatingProbe.metrics(port)
            #expect(after.growth(since: before, "canopy_identify_submissions_total", ["result": "new"]) >= 1)
            #expect(after.growth(since: before, "canopy_identify_submissions_total", ["result": "repeat"]) >= 1)
            #expect(after.growth(since: before, "canopy_identify_features_computed_total", [:]) >= 1)
            #expect(after.growth(since: before, "canopy_identify_provider_duration_seconds_count", ["provider": "reference", "outcome": "ok"]) >= 1)
            #expect(
                after.growth(
                    since: before, "canopy_service_handler_duration_seconds_count",
                    ["service": "identify", "operation": "identifications.submit", "outcome": "ok"]) >= 2)
        }
    }

    // MARK: - Bad input

    @Test func badPhotosGetTypedErrorsAndChangeNothing() async throws {
        try await withStack(references: 2) { stack in
            let good = try Self.photo(0, seed: 1)
            let cases: [(String, Identification.Submit.Request, CanopyError.Code)] = [
                ("not an image", .init(photos: [.init(organ: .leaf)], data: [Data("this is not a photo".utf8)]), .badRequest),
                ("truncated", .init(photos: [.init(organ: .leaf)], data: [Data(good.prefix(good.count / 3))]), .badRequest),
                ("too many", .init(photos: Array(repeating: .init(organ: .leaf), count: 6), data: Array(repeating: Data(good), count: 6)), .tooLarge),
                ("none", .init(photos: []), .badRequest),
                ("bytes missing", .init(photos: [.init(organ: .leaf), .init(organ: .flower)], data: [Data(good)]), .badRequest),
                ("bad photo id", .init(photos: [.init(organ: .leaf, photoID: "../../etc/passwd")]), .badRequest),
                ("bad location", .init(photos: [.init(organ: .leaf)], data: [Data(good)], location: .init(latitude: 91, longitude: 0)), .badRequest),
            ]
            for (name, request, code) in cases {
                let error = await #expect(throws: CanopyError.self, "\(name)") {
                    _ = try await stack.client.call(Identification.Submit.self, request, principal: "alice")
                }
                #expect(error?.code == code, "\(name): \(error?.message ?? "")")
            }
            // A photo over the bus's frame limit is refused by the broker, and the service goes on.
            let huge = Data(count: 17 * 1024 * 1024)
            let tooLarge = await #expect(throws: CanopyError.self) {
                _ = try await stack.client.call(Identification.Submit.self, .init(photos: [.init(organ: .leaf)], data: [huge]), principal: "alice")
            }
            #expect(tooLarge?.code == .tooLarge)

            // A valid photo with a broken one: refused, and neither the valid photo nor its
            // features stay behind, however often it is tried.
            let valid = try Self.photo(1, seed: 5)
            let svg = Data(#"<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>"#.utf8)
            for _ in 0..<3 {
                let mixed = await #expect(throws: CanopyError.self) {
                    _ = try await stack.client.call(
                        Identification.Submit.self, .init(photos: [.init(organ: .leaf), .init(organ: .flower)], data: [Data(valid), svg]),
                        principal: "alice", timeout: .seconds(60))
                }
                #expect(mixed?.code == .badRequest)
            }
            let validID = PhotoID.of(valid)
            let gone = await #expect(throws: CanopyError.self) {
                _ = try await stack.client.call(Images.GetVariant.self, .init(sha256: validID, variant: .thumbnail), principal: "alice")
            }
            #expect(gone?.code == .notFound, "the valid photo was removed again")
            #expect(try stack.tools.store.features([validID]).isEmpty, "and its features")
            #expect(try await stack.client.call(Identification.History.self, .init(), principal: "alice").items.isEmpty)
            #expect(try await stack.submit([good]).results.first != nil)
        }
    }

    // MARK: - Pl@ntNet

    @Test func plantNetIsAskedAsDocumentedWithGallerySizedPhotos() async throws {
        try await withStack(.plantnet) { stack in
            let big = try Self.photo(5, seed: 1, width: 1600, height: 1200)
            let record = try await stack.submit([big, try Self.photo(5, seed: 2)], organs: [.leaf, .flower])
            #expect(record.provider == .plantnet)
            #expect(record.results.map(\.scientificNameWithoutAuthor) == ["Monstera deliciosa", "Philodendron bipinnatifidum", "Epipremnum aureum"])
            let best = try #require(record.results.first)
            #expect(best.authorship == "Liebm." && best.scientificName == "Monstera deliciosa Liebm." && best.genus == "Monstera" && best.family == "Araceae")
            #expect(best.gbifID == 2_868_241 && best.score == 0.8231 && best.commonNames == ["Swiss cheese plant", "Ceriman"])
            let call = try #require(stack.plantNet?.calls.last)
            #expect(call.project == "all" && call.organs == ["leaf", "flower"])
            #expect(call.query["include-related-images"] == "false" && call.query["nb-results"] == "10" && call.query["lang"] == "en")
            #expect(call.imageBytes.count == 2 && call.imageBytes[0] < big.count / 2, "the gallery size went, not the original")
            let quota = try await stack.client.call(Identification.Quota.self, .init())
            #expect(quota.remaining == 499 && quota.dailyLimit == 500 && quota.provider == .plantnet)

            // Asked once: the same photos again are answered from the store.
            _ = try await stack.submit([big, try Self.photo(5, seed: 2)], organs: [.leaf, .flower])
            #expect(stack.plantNet?.calls.count == 1)
        }
    }

    @Test func concurrentIdenticalSubmissionsReachPlantNetOnce() async throws {
        // Live: the broker coalesces identical submissions in flight (the in-process bus does not).
        try await withStack(.plantnet, mode: .live) { stack in
            let photo = try Self.photo(6, seed: 1)
            let ids = try await withThrowingTaskGroup(of: String.self) { group in
                for _ in 0..<8 { group.addTask { try await stack.submit([photo]).id } }
                return try await group.reduce(into: Set<String>()) { $0.insert($1) }
            }
            #expect(ids.count == 1)
            #expect(stack.plantNet?.calls.count == 1)
        }
    }

    @Test func theSamePhotosOnTwoReplicasAtOnceAreIdentifiedOnceAndCountedOnce() async throws {
        // Two canopy-identify replicas on one PostgreSQL; the requests differ (a location or
        // none), so the broker does not coalesce them: the store's claim does.
        try await withStack(.plantnet, mode: .live, replicas: 2) { stack in
            let photo = try Self.photo(7, seed: 1)
            let location = Identification.Location(latitude: 52.5, longitude: 13.4)
            let ids = try await withThrowingTaskGroup(of: String.self) { group in
                for index in 0..<8 { group.addTask { try await stack.submit([photo], location: index % 2 == 0 ? location : nil).id } }
                return try await group.reduce(into: Set<String>()) { $0.insert($1) }
            }
            #expect(ids.count == 1, "one identification: \(ids)")
            #expect(stack.plantNet?.calls.count == 1, "one call to Pl@ntNet, one unit of its quota: \(stack.plantNet?.calls.map(\.query) ?? [])")
            let history = try await stack.client.call(Identification.History.self, .init(), principal: "alice")
            #expect(history.items.count == 1)
        }
    }

    @Test func everyPlantNetAnswerIsHandledAsDocumented() async throws {
        try await withStack(.plantnet) { stack in
            let fake = try #require(stack.plantNet)
            var seed = 0
            func submit() async throws -> Identification.Record {
                seed += 1
                return try await stack.submit([try Self.photo(7, seed: seed)])
            }
            // 404 "Species not found": an identification with no candidates.
            fake.script([.notFound])
            #expect(try await submit().results.isEmpty)
            // 429 and 5xx are retried (1, 2, 4 s in service; shorter here), then answered.
            fake.script([.status(429), .status(503)])
            var calls = fake.calls.count
            #expect(try await submit().results.count == 3)
            #expect(fake.calls.count == calls + 3)
            // Still failing after the retries: busy, and nothing recorded.
            fake.script(Array(repeating: .status(500), count: 4))
            calls = fake.calls.count
            let unavailable = await #expect(throws: CanopyError.self) { _ = try await submit() }
            #expect(unavailable?.code == .busy && fake.calls.count == calls + 4)
            // Other 4xx: the photos were refused, not retried.
            fake.script([.status(413)])
            calls = fake.calls.count
            let refused = await #expect(throws: CanopyError.self) { _ = try await submit() }
            #expect(refused?.code == .badRequest && fake.calls.count == calls + 1)
            // 401: the key is wrong, a configuration error, not retried; the key is never told.
            fake.script([.status(401)])
            calls = fake.calls.count
            let key = await #expect(throws: CanopyError.self) { _ = try await submit() }
            #expect(key?.code == .internal && key?.message.contains("API key") == true && fake.calls.count == calls + 1)
            for error in [unavailable, refused, key] { #expect(error?.message.contains(FakePlantNet.key) == false) }
        }
    }

    @Test func whenTheDailyQuotaIsUsedUpNoMoreCallsAreMadeUntilItResets() async throws {
        try await withStack(.plantnet, remaining: 2) { stack in
            _ = try await stack.submit([try Self.photo(8, seed: 1)])
            _ = try await stack.submit([try Self.photo(8, seed: 2)])
            let quota = try await stack.client.call(Identification.Quota.self, .init())
            #expect(quota.remaining == 0 && quota.resetsAt != nil)
            let exhausted = await #expect(throws: CanopyError.self) { _ = try await stack.submit([try Self.photo(8, seed: 3)]) }
            #expect(exhausted?.code == .busy && exhausted?.message.contains("resets at") == true)
            #expect(stack.plantNet?.calls.count == 2, "no call once the quota is used up")
            #expect(try stack.tools.quota().remaining == 0)
        }
    }

    @Test func hybridAsksPlantNetOnlyWhenTheReferencesAreNotSure() async throws {
        try await withStack(.hybrid, references: 6) { stack in
            let sure = try await stack.submit([try Self.photo(2, seed: 500)])
            #expect(sure.provider == .hybrid && sure.results.first?.scientificName == ReferenceMatchingTests.name(2))
            let askedBefore = stack.plantNet?.calls.count ?? 0
            // A plant of no loaded species: Pl@ntNet is asked, and its candidates come first (the
            // references' own, if any is near enough to name, after them).
            let unsure = try await stack.submit([try PlantScene.species(999).photo(seed: 1)])
            #expect(stack.plantNet?.calls.count == askedBefore + 1)
            #expect(unsure.results.first?.provider == .plantnet)
            // Asked for explicitly.
            let asked = try await stack.client.call(
                Identification.Submit.self, .init(photos: [.init(organ: .leaf)], data: [Data(try Self.photo(2, seed: 501))], askPlantNet: true),
                principal: "alice")
            #expect(asked.results.contains { $0.provider == .plantnet })
        }
    }
}
