import CanopyMessages
import CanopySamples
import Foundation
import Testing

@testable import CanopyIdentify
@testable import CanopyImaging

/// The reference matcher on made-up species and plants photographed as phones do
/// (``PlantScene``): photos in, features computed from the encoded JPEGs, as in service.
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

    /// Species `range` loaded with 3 reference photos each (shots 0–2).
    static func load(_ range: Range<Int>, into tools: IdentificationTools) throws {
        for index in range {
            let photos = try (0..<3).map { try PlantScene.species(index).photo(seed: $0) }
            try tools.addReferences(
                .init(scientificName: Self.name(index), commonNames: ["Test plant \(index)"], family: "Testaceae", gbifID: 1000 + index), photos: photos)
        }
    }

    /// The issue's target on photos whose background, light, leaf count, scale, angle, noise
    /// and occlusion all vary (``PlantScene``), reference and query shots drawn apart: the right
    /// species first for at least 80% of the photos and among the first three for at least 95%,
    /// in catalogues of 10 species.
    @Test func theRightSpeciesComesFirstAmongTenOnPhotosThatVaryAsPhonePhotosDo() async throws {
        var (first, firstThree, total) = (0, 0, 0)
        for set in [0..<10, 10..<20, 20..<30] {
            try await Self.withStore { _, tools in
                try Self.load(set, into: tools)
                #expect(try tools.references().count == 10)
                for index in set {
                    for seed in [10_000, 10_001] {
                        let candidates = try tools.match(photos: [try PlantScene.species(index).photo(seed: seed)], refusingFar: false)
                        total += 1
                        if candidates.first?.scientificName == Self.name(index) { first += 1 }
                        if candidates.prefix(3).contains(where: { $0.scientificName == Self.name(index) }) { firstThree += 1 }
                        #expect(candidates.map(\.rank) == Array(1...candidates.count))
                        #expect(candidates.allSatisfy { (0...1).contains($0.score) })
                        // Confidences share what "none of these" leaves.
                        #expect(candidates.map(\.score).reduce(0, +) <= 1.0001)
                        #expect(zip(candidates, candidates.dropFirst()).allSatisfy { $0.score >= $1.score })
                    }
                }
                let named = try tools.match(photos: [try PlantScene.species(set.lowerBound + 2).photo(seed: 10_000)], refusingFar: false)
                #expect(named.first?.scientificNameWithoutAuthor == "Plantae species\(set.lowerBound + 2)")
                #expect(named.first?.authorship == "Tester")
                #expect(named.first?.gbifID == 1000 + set.lowerBound + 2)
            }
        }
        #expect(Double(first) >= 0.8 * Double(total), "right species first for \(first) of \(total)")
        #expect(Double(firstThree) >= 0.95 * Double(total), "right species among the first three for \(firstThree) of \(total)")
    }

    @Test func twoPhotosOfOnePlantAreMeasuredTogether() async throws {
        try await Self.withStore { _, tools in
            try Self.load(40..<50, into: tools)
            var (one, two) = (0, 0)
            for index in 40..<50 {
                let (a, b) = (try PlantScene.species(index).photo(seed: 10_000), try PlantScene.species(index).photo(seed: 10_001))
                if try tools.match(photos: [a], refusingFar: false).first?.scientificName == Self.name(index) { one += 1 }
                let both = try tools.match(photos: [a, b], refusingFar: false)
                if both.first?.scientificName == Self.name(index) { two += 1 }
                #expect(both.map(\.score).reduce(0, +) <= 1.0001)
            }
            // Each species is at its photos' mean distance: a second photo corrects the first more often than it misleads.
            #expect(two >= one && two >= 8, "one photo: \(one) of 10 first, two: \(two)")
        }
    }

    @Test func aPhotoWithNoLoadedPlantInItHasNoGoodMatch() async throws {
        try await Self.withStore { _, tools in
            try Self.load(0..<10, into: tools)
            // A wall: a gradient with sensor noise, nothing in front of it.
            var random = SplitMix(seed: 3)
            var wall = [UInt8](repeating: 0, count: 320 * 240 * 3)
            for y in 0..<240 {
                for x in 0..<320 {
                    for (channel, base) in [180.0, 170.0, 160.0].enumerated() {
                        wall[(y * 320 + x) * 3 + channel] = UInt8(max(0, min(255, base - Double(y) * 0.2 + random.uniform(-4, 4))))
                    }
                }
            }
            let photo = try SyntheticPlant.jpeg(wall, width: 320, height: 240)
            #expect(try tools.match(photos: [photo]).isEmpty, "no good match")
            // Asked for anyway, the nearest come with little confidence.
            let anyway = try tools.match(photos: [photo], refusingFar: false)
            #expect(!anyway.isEmpty && anyway[0].score < 0.5)
            // A photo of a loaded species is named.
            #expect(try tools.match(photos: [try PlantScene.species(2).photo(seed: 10_000)]).first?.scientificName == Self.name(2))
        }
    }

    @Test func warmerCoolerBrighterOrDimmerLightLeavesThePlantsColourAlone() throws {
        let pixels = PlantScene.species(5).pixels(seed: 3)
        func lit(_ gains: [Double]) -> [UInt8] {
            pixels.enumerated().map { UInt8(max(0, min(255, (Double($1) * gains[$0 % 3]).rounded()))) }
        }
        let plain = PhotoFeatures.compute(pixels: pixels, width: 320, height: 240)
        let warmDim = PhotoFeatures.compute(pixels: lit([1.1, 0.85, 0.7]), width: 320, height: 240)
        let coolBright = PhotoFeatures.compute(pixels: lit([0.85, 1, 1.15]), width: 320, height: 240)
        let other = PhotoFeatures.compute(pixels: PlantScene.species(6).pixels(seed: 3), width: 320, height: 240)
        func colourDistance(_ a: PhotoFeatures, _ b: PhotoFeatures) -> Float { zip(a[.chromaticity], b[.chromaticity]).map { abs($0 - $1) }.reduce(0, +) }
        // Light changes the pixels a lot, the plant's colour descriptor little, far less than another species does.
        #expect(colourDistance(plain, warmDim) < 0.3 && colourDistance(plain, coolBright) < 0.3)
        #expect(colourDistance(plain, other) > 3 * max(colourDistance(plain, warmDim), colourDistance(plain, coolBright)))
        #expect(plain.distance(to: warmDim) < plain.distance(to: other) && plain.distance(to: coolBright) < plain.distance(to: other))
    }

    @Test func theMaskFindsThePlantAndFallsBackToTheCentreOnAnEmptyFrame() {
        let (width, height) = (320, 240)
        let scene = PlantScene.species(1).pixels(seed: 4, width: width, height: height)
        let mask = PlantMask(logRGB: scene.map { PlantDescriptors.logTable[Int($0)] }, width: width, height: height)
        let share = Double(mask.isPlant.filter { $0 }.count) / Double(width * height)
        #expect(!mask.isFallback && share > 0.05 && share < 0.6, "plant share \(share)")
        // The border is background, the centre (where the leaves meet) plant.
        #expect(!mask.isPlant[0] && !mask.isPlant[width * height - 1])
        let empty = [Float](repeating: PlantDescriptors.logTable[128], count: width * height * 3)
        let fallback = PlantMask(logRGB: empty, width: width, height: height)
        #expect(fallback.isFallback && fallback.isPlant[(height / 2) * width + width / 2] && !fallback.isPlant[0])
    }

    @Test func aNewPhotoOfOneOfTwentyPlantsFindsThatPlant() async throws {
        try await Self.withStore { store, _ in
            let owner = "alice"
            let plants = (0..<20).map { PlantScene.species(300 + $0) }
            for (index, plant) in plants.enumerated() {
                for seed in 0...2 {
                    let bytes = try plant.photo(seed: seed)
                    let sha256 = IdentificationLibrary.sha256(bytes)
                    try store.saveFeatures(try PhotoFeatures.compute(from: bytes), sha256: sha256)
                    let record = Identification.Record(
                        id: "i\(index)-\(seed)", owner: owner, createdAt: Date(), provider: .reference, organs: [.leaf],
                        photoIDs: [sha256], location: nil, exactLocation: false, results: [], plantID: "p\(index)")
                    _ = try store.insert(record, submissionKey: record.id)
                    try await store.accept(
                        record, plantID: "p\(index)",
                        candidate: .init(
                            rank: 1, score: 1, scientificName: "Plant \(index)", scientificNameWithoutAuthor: "Plant \(index)", provider: .reference))
                }
            }
            let provider = ReferenceProvider(store: store)
            var found = 0
            var outcomes: [String] = []
            for (index, plant) in plants.enumerated() {
                // Two new photos, as the app sends 1 to 5.
                let photos = try [10_000, 10_001].map { seed in
                    QueryPhoto(sha256: "q\(seed)", organ: .leaf, features: try PhotoFeatures.compute(from: try plant.photo(seed: seed)), gallery: { [] })
                }
                let query = ProviderQuery(owner: owner, photos: photos, askPlantNet: false)
                let candidates = try await provider.identify(query)
                if candidates.first?.plantID == "p\(index)" {
                    found += 1
                } else {
                    outcomes.append("p\(index): \(candidates.prefix(2).map { "\($0.plantID ?? "-") \($0.score)" })")
                }
                // Nobody else's plants.
                let stranger = ProviderQuery(owner: "bob", photos: query.photos, askPlantNet: false)
                #expect(try await provider.identify(stranger).allSatisfy { $0.plantID == nil })
            }
            #expect(found >= 16, "the right plant first for \(found) of 20 pairs of new photos; not for \(outcomes)")
        }
    }

    @Test func theIndexFindsWhatAFullScanFinds() throws {
        // Features in clusters (as photos of one species are), made up: the index is about
        // distances, whatever the features describe.
        var random = SplitMix(seed: 7)
        let centres = (0..<100).map { _ in (0..<PhotoFeatures.count).map { _ in Float(random.uniform(0, 0.2)) } }
        let items = (0..<2_000).map { index in
            PhotoFeatures(values: centres[index % centres.count].map { max(0, $0 + Float(random.uniform(-0.03, 0.03))) })
        }
        let index = ReferenceIndex(items)
        for _ in 0..<50 {
            let query = items[Int(random.next() % UInt64(items.count))]
            let found = index.nearest(to: query, count: 10)
            #expect(found.map(\.distance) == index.scanned(to: query, count: 10).map(\.distance))
            // The index's distances are the features' own (added up in another order).
            let scanned = items.map { query.distance(to: $0) }.sorted().prefix(10)
            #expect(zip(found, scanned).allSatisfy { abs($0.distance - $1) <= 1e-4 * max(1, $1) })
        }
    }

    @Test func aPersonKeepsAtMostTheLimitAndTheOldestNeverAcceptedMakeRoom() async throws {
        try await Self.withStore { store, _ in
            let limit = Identification.Limits.identificationsPerPerson
            // Filled in one SQL transaction of the SQLite store (the limit is thousands).
            try await #require(store as? SQLiteIdentificationStore).database.write { db in
                for index in 0..<limit {
                    try db.execute(
                        sql: """
                            INSERT INTO identifications (id, owner, submissionKey, createdAt, plantID, acceptedPlantID, record) VALUES (?, 'alice', ?, ?, ?, ?, x'')
                            """, arguments: ["i\(index)", "k\(index)", Double(index), "p\(index)", index == 0 ? "p0" : nil])
                }
            }
            func record(_ id: String, owner: String = "alice") -> Identification.Record {
                .init(
                    id: id, owner: owner, createdAt: Date(timeIntervalSince1970: 1e9), provider: .reference, organs: [.leaf], photoIDs: [],
                    location: nil, exactLocation: false, results: [], plantID: "p-\(id)")
            }
            let (_, dropped) = try store.insert(record("new"), submissionKey: "k-new")
            #expect(dropped == ["p1"], "the oldest never accepted (i0 was accepted and stays)")
            let count = try await #require(store as? SQLiteIdentificationStore).database.read { db in
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
