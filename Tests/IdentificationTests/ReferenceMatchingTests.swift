import CanopyImaging
import CanopyMessages
import CanopySamples
import Foundation
import Testing
@testable import Identification

/// The reference matcher on made-up species and plants (``SyntheticPlant``): photos in,
/// features computed from the encoded JPEGs, as in service.
struct ReferenceMatchingTests {
    /// A store in a fresh directory, removed afterwards.
    static func withStore<T>(_ body: (any IdentificationStoring, IdentificationTools) async throws -> T) async throws -> T {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-identify-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("identify.sqlite").path
        let tools = try IdentificationTools(databasePath: path)
        return try await body(tools.store, tools)
    }

    static func name(_ index: Int) -> String { "Plantae species\(index) Tester" }

    @Test func theRightSpeciesComesFirstAmongTwelve() async throws {
        try await Self.withStore { _, tools in
            for index in 0..<12 {
                let photos = try (1...4).map { try SyntheticPlant.species(index).photo(seed: $0) }
                try tools.addReferences(.init(scientificName: Self.name(index), commonNames: ["Test plant \(index)"], family: "Testaceae", gbifID: 1000 + index), photos: photos)
            }
            #expect(try tools.references().count == 12)
            for index in 0..<12 {
                let candidates = try tools.match(photos: [try SyntheticPlant.species(index).photo(seed: 100 + index)])
                #expect(candidates.first?.scientificName == Self.name(index), "species \(index): \(candidates.prefix(3).map { "\($0.scientificName) \($0.score)" })")
                #expect(candidates.first?.scientificNameWithoutAuthor == "Plantae species\(index)")
                #expect(candidates.first?.authorship == "Tester")
                #expect(candidates.first?.gbifID == 1000 + index)
                #expect(candidates.map(\.rank) == Array(1...candidates.count))
                #expect(candidates.allSatisfy { (0...1).contains($0.score) })
            }
        }
    }

    @Test func twoPhotosOfOnePlantScoreTogether() async throws {
        try await Self.withStore { _, tools in
            for index in 0..<6 {
                try tools.addReferences(.init(scientificName: Self.name(index)), photos: try (1...3).map { try SyntheticPlant.species(index).photo(seed: $0) })
            }
            let one = try tools.match(photos: [try SyntheticPlant.species(4).photo(seed: 50)])
            let two = try tools.match(photos: [try SyntheticPlant.species(4).photo(seed: 50), try SyntheticPlant.species(4).photo(seed: 51)])
            #expect(one.first?.scientificName == Self.name(4) && two.first?.scientificName == Self.name(4))
            // The second photo agrees, so the best stays far ahead of the rest.
            #expect(two[0].score - two[1].score > 0.05)
        }
    }

    @Test func aNewPhotoOfOneOfTwentyPlantsFindsThatPlant() async throws {
        try await Self.withStore { store, _ in
            let owner = "alice"
            let plants = (0..<20).map { SyntheticPlant.species(200 + $0) }
            for (index, plant) in plants.enumerated() {
                for seed in 1...2 {
                    let bytes = try plant.photo(seed: seed)
                    let sha256 = IdentificationLibrary.sha256(bytes)
                    try store.saveFeatures(try PhotoFeatures.compute(from: bytes), sha256: sha256)
                    let record = Identification.Record(id: "i\(index)-\(seed)", owner: owner, createdAt: Date(), provider: .reference, organs: [.leaf],
                                                       photoIDs: [sha256], location: nil, exactLocation: false, results: [], plantID: "p\(index)")
                    _ = try store.insert(record, submissionKey: record.id)
                    try await store.accept(record, plantID: "p\(index)",
                                           candidate: .init(rank: 1, score: 1, scientificName: "Plant \(index)", scientificNameWithoutAuthor: "Plant \(index)", provider: .reference))
                }
            }
            let provider = ReferenceProvider(store: store)
            for (index, plant) in plants.enumerated() {
                let features = try PhotoFeatures.compute(from: try plant.photo(seed: 77))
                let query = ProviderQuery(owner: owner, photos: [QueryPhoto(sha256: "q", organ: .leaf, features: features, gallery: { [] })], askPlantNet: false)
                let candidates = try await provider.identify(query)
                #expect(candidates.first?.plantID == "p\(index)", "plant \(index): \(candidates.prefix(3).map { "\($0.plantID ?? "-") \($0.score)" })")
                // Nobody else's plants.
                let stranger = ProviderQuery(owner: "bob", photos: query.photos, askPlantNet: false)
                #expect(try await provider.identify(stranger).allSatisfy { $0.plantID == nil })
            }
        }
    }

    @Test func theIndexFindsWhatAFullScanFinds() throws {
        var random = SplitMix(seed: 7)
        let items = (0..<2_000).map { index in
            PhotoFeatures.compute(pixels: SyntheticPlant.species(index % 300).pixels(seed: index, width: 48, height: 48), width: 48, height: 48)
        }
        let index = ReferenceIndex(items)
        for _ in 0..<50 {
            let query = items[Int(random.next() % UInt64(items.count))]
            let found = index.nearest(to: query, count: 10).map(\.distance)
            let scanned = items.map { query.distance(to: $0) }.sorted().prefix(10)
            #expect(found == Array(scanned))
        }
    }

    @Test func aPersonKeepsAtMostTheLimitAndTheOldestNeverAcceptedMakeRoom() async throws {
        try await Self.withStore { store, _ in
            let limit = Identification.Limits.identificationsPerPerson
            // Filled in one SQL transaction of the SQLite store (the limit is thousands).
            try await #require(store as? IdentificationStore).database.write { db in
                for index in 0..<limit {
                    try db.execute(sql: """
                        INSERT INTO identifications (id, owner, submissionKey, createdAt, plantID, acceptedPlantID, record) VALUES (?, 'alice', ?, ?, ?, ?, x'')
                        """, arguments: ["i\(index)", "k\(index)", Double(index), "p\(index)", index == 0 ? "p0" : nil])
                }
            }
            func record(_ id: String, owner: String = "alice") -> Identification.Record {
                .init(id: id, owner: owner, createdAt: Date(timeIntervalSince1970: 1e9), provider: .reference, organs: [.leaf], photoIDs: [],
                      location: nil, exactLocation: false, results: [], plantID: "p-\(id)")
            }
            let (_, dropped) = try store.insert(record("new"), submissionKey: "k-new")
            #expect(dropped == ["p1"], "the oldest never accepted (i0 was accepted and stays)")
            let count = try await #require(store as? IdentificationStore).database.read { db in
                try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM identifications WHERE owner = 'alice'")
            }
            #expect(count == limit)
            #expect(try store.insert(record("b1", owner: "bob"), submissionKey: "k-b").dropped.isEmpty, "someone else's count is their own")
        }
    }

    @Test func brokenPhotosAreRefusedWithATypedError() throws {
        let photo = try SyntheticPlant.species(1).photo(seed: 1)
        for bad in [[UInt8](), Array("not a photo".utf8), Array(photo.prefix(photo.count / 3))] {
            let error = #expect(throws: CanopyError.self) { _ = try PhotoFeatures.compute(from: bad) }
            #expect(error?.code == .badRequest)
        }
    }
}
