import CVips
import CanopyBroker
import CanopyBus
import CanopyImaging
import CanopyMessages
import CanopyTesting
import Foundation
import Testing

@testable import CanopyImages

/// canopy-images on the bus, as other services use it: in process, and through the real
/// broker on tcp://127.0.0.1 where the broker's part is what is tested.
@Suite(.serialized)
struct ImageServiceTests {
    /// A bus with an image service on a fresh directory.
    func withImages(
        _ mode: BusMode = .inProcess, configuration: BrokerConfiguration = .testing,
        _ body: (TestBus, any BusCalling, URL) async throws -> Void
    ) async throws {
        let directory = Fixture.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        try await withTestBus(mode, configuration: configuration) { bus in
            try await bus.serve(ImageService(library: try ImageLibrary(directory: directory)), credit: 8)
            try await body(bus, try bus.client(), directory)
        }
    }

    @Test func aPhotoIsStoredOnceAndItsVariantsComeFromOneDecodeThenFromMemory() async throws {
        try await withImages { _, client, directory in
            let jpeg = Fixture.image { $0.gps = true }
            let photo = try await client.call(Images.Put.self, .init(plantID: "monstera", data: Data(jpeg)), principal: "alice")
            #expect(photo.sha256 == ImageLibrary.sha256(jpeg))
            #expect((photo.width, photo.height, photo.format) == (1200, 800, "jpeg"))

            let thumbnail = try await client.call(Images.GetVariant.self, .init(sha256: photo.sha256, variant: .thumbnail), principal: "alice")
            #expect(thumbnail.source == "made")
            #expect((thumbnail.width, thumbnail.height) == (150, 150))
            #expect(!Fixture.header([UInt8](thumbnail.data)).hasGPS)
            let gallery = try await client.call(Images.GetVariant.self, .init(sha256: photo.sha256, variant: .gallery), principal: "alice")
            #expect(gallery.source == "memory", "made by the same decode as the thumbnail")
            let again = try await client.call(Images.GetVariant.self, .init(sha256: photo.sha256, variant: .thumbnail), principal: "alice")
            #expect(again.source == "memory")
            #expect(again.data == thumbnail.data)
            let webp = try await client.call(Images.GetVariant.self, .init(sha256: photo.sha256, variant: .thumbnail, format: .webp), principal: "alice")
            #expect(ImageKind(sniffing: [UInt8](webp.data)) == .webp)

            // The stored original has no GPS either.
            let stored = try Data(contentsOf: directory.appendingPathComponent("originals").appendingPathComponent(photo.sha256))
            #expect(!Fixture.header([UInt8](stored)).hasGPS)
        }
    }

    @Test(arguments: Fixture.Kind.allCases)
    func everyKindOfPhotoComesOutUprightInSRGBWithoutMetadata(kind: Fixture.Kind) async throws {
        let name = kind.rawValue, bytes = kind.bytes, size = kind.size
        try await withImages { _, client, _ in
            let photo = try await client.call(Images.Put.self, .init(plantID: "p1", data: Data(bytes)), principal: "alice")
            #expect((photo.width, photo.height) == size, "\(name)")
            for variant in Images.Variant.allCases {
                let reply = try await client.call(Images.GetVariant.self, .init(sha256: photo.sha256, variant: variant), principal: "alice")
                let header = Fixture.header([UInt8](reply.data))
                #expect(header.interpretation == "srgb", "\(name) \(variant)")
                #expect(!header.hasEXIF && !header.hasGPS && !header.hasICC && !header.orientation, "\(name) \(variant)")
                #expect((header.width > header.height) == (size.0 > size.1) || variant == .thumbnail, "\(name) \(variant) is upright")
            }
        }
    }

    @Test func theSamePhotoStoredTwiceIsStoredOnce() async throws {
        try await withImages { _, client, directory in
            let jpeg = Fixture.jpeg
            _ = try await client.call(Images.Put.self, .init(plantID: "p1", data: Data(jpeg)), principal: "alice")
            _ = try await client.call(Images.Put.self, .init(plantID: "p2", data: Data(jpeg)), principal: "alice")
            _ = try await client.call(Images.Put.self, .init(plantID: "fern", data: Data(jpeg)), principal: "bob")
            let stats = try await client.call(Images.Stats.self, .init())
            #expect(stats.originals == 1)
            #expect(try FileManager.default.contentsOfDirectory(atPath: directory.appendingPathComponent("originals").path).count == 1)
            #expect(try await client.call(Images.List.self, .init(plantID: "p1"), principal: "alice").count == 1)
            #expect(try await client.call(Images.List.self, .init(plantID: "p2"), principal: "alice").count == 1)
        }
    }

    @Test func nobodyReadsListsWarmsOrPurgesAnotherPersonsPhotos() async throws {
        try await withImages { bus, client, _ in
            let photo = try await client.call(Images.Put.self, .init(plantID: "monstera", data: Data(Fixture.jpeg)), principal: "alice")
            for call in [
                { _ = try await client.call(Images.GetVariant.self, .init(sha256: photo.sha256, variant: .thumbnail), principal: "bob") },
                { _ = try await client.call(Images.Palette.self, .init(sha256: photo.sha256), principal: "bob") },
                { _ = try await client.call(Images.Warm.self, .init(sha256s: [photo.sha256]), principal: "bob") },
            ] as [() async throws -> Void] {
                let error = await #expect(throws: CanopyError.self) { try await call() }
                #expect(error?.code == .notFound)
            }
            #expect(try await client.call(Images.List.self, .init(plantID: "monstera"), principal: "bob").isEmpty)
            let purge = try await bus.client(asService: true).call(Images.Purge.self, .init(plantID: "monstera"), principal: "bob")
            #expect(purge == .init(photos: 0))
            #expect(try await client.call(Images.List.self, .init(plantID: "monstera"), principal: "alice").map(\.sha256) == [photo.sha256])
            let anonymous = await #expect(throws: CanopyError.self) {
                _ = try await client.call(Images.List.self, .init(plantID: "monstera"))
            }
            #expect(anonymous?.code == .unauthorized)
        }
    }

    @Test func purgingAPlantRemovesWhatNobodyElseHoldsFromEveryTier() async throws {
        try await withImages { bus, client, directory in
            let shared = Fixture.jpeg
            let own = Fixture.png
            let sharedPhoto = try await client.call(Images.Put.self, .init(plantID: "monstera", data: Data(shared)), principal: "alice")
            let ownPhoto = try await client.call(Images.Put.self, .init(plantID: "monstera", data: Data(own)), principal: "alice")
            _ = try await client.call(Images.Put.self, .init(plantID: "fern", data: Data(shared)), principal: "bob")
            for sha in [sharedPhoto.sha256, ownPhoto.sha256] {
                _ = try await client.call(Images.GetVariant.self, .init(sha256: sha, variant: .thumbnail), principal: "alice")
                _ = try await client.call(Images.Palette.self, .init(sha256: sha), principal: "alice")
            }
            let variants = directory.appendingPathComponent("variants")
            #expect(try FileManager.default.contentsOfDirectory(atPath: variants.path).count == 6)

            let purge = try await bus.client(asService: true).call(Images.Purge.self, .init(plantID: "monstera"), principal: "alice")
            #expect(purge == .init(photos: 2))
            let left = try FileManager.default.contentsOfDirectory(atPath: variants.path)
            #expect(left.count == 3 && left.allSatisfy { $0.hasPrefix(sharedPhoto.sha256) })
            #expect(try await client.call(Images.List.self, .init(plantID: "monstera"), principal: "alice").isEmpty)
            let stats = try await client.call(Images.Stats.self, .init())
            #expect(stats.originals == 1 && stats.palettes == 1)
            #expect(stats.memory.entries == 3)
            // Bob's copy still serves.
            #expect(try await client.call(Images.GetVariant.self, .init(sha256: sharedPhoto.sha256, variant: .thumbnail), principal: "bob").source == "memory")
        }
    }

    @Test func onePhotoOfAPlantCanBeRemovedAlone() async throws {
        try await withImages { bus, client, directory in
            let keep = try await client.call(Images.Put.self, .init(plantID: "fern", data: Data(Fixture.jpeg)), principal: "alice")
            let drop = try await client.call(Images.Put.self, .init(plantID: "fern", data: Data(Fixture.png)), principal: "alice")
            for sha in [keep.sha256, drop.sha256] {
                _ = try await client.call(Images.GetVariant.self, .init(sha256: sha, variant: .thumbnail), principal: "alice")
            }
            // Someone else naming the photo changes nothing.
            #expect(
                try await bus.client(asService: true).call(Images.Purge.self, .init(plantID: "fern", sha256: drop.sha256), principal: "bob") == .init(photos: 0)
            )
            let removed = try await bus.client(asService: true).call(Images.Purge.self, .init(plantID: "fern", sha256: drop.sha256), principal: "alice")
            #expect(removed == .init(photos: 1))
            #expect(try await client.call(Images.List.self, .init(plantID: "fern"), principal: "alice").map(\.sha256) == [keep.sha256])
            let variants = try FileManager.default.contentsOfDirectory(atPath: directory.appendingPathComponent("variants").path)
            #expect(variants.count == 3 && variants.allSatisfy { $0.hasPrefix(keep.sha256) })
            let error = await #expect(throws: CanopyError.self) {
                _ = try await client.call(Images.GetVariant.self, .init(sha256: drop.sha256, variant: .thumbnail), principal: "alice")
            }
            #expect(error?.code == .notFound)
            #expect(try await client.call(Images.GetVariant.self, .init(sha256: keep.sha256, variant: .thumbnail), principal: "alice").source == "memory")
        }
    }

    @Test func onePersonsPhotosAreBoundedInCountAndBytesAndOthersAreNot() async throws {
        let directory = Fixture.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        var configuration = ImageLibrary.Configuration()
        configuration.photosPerPerson = 3
        let library = try ImageLibrary(directory: directory, configuration: configuration)
        for plant in ["p1", "p2", "p3"] { _ = try await library.put(Fixture.jpeg, owner: "alice", plantID: plant) }
        let error = await #expect(throws: CanopyError.self) { _ = try await library.put(Fixture.jpeg, owner: "alice", plantID: "p4") }
        #expect(error?.code == .tooLarge && error?.message.contains("at most 3 photos") == true)
        #expect(try library.store.usage(owner: "alice").photos == 3)
        _ = try await library.put(Fixture.jpeg, owner: "bob", plantID: "p1") // someone else's count is their own

        // What one stored photo counts (its original as kept), then room for exactly two.
        let stored = try library.store.usage(owner: "bob").bytes
        configuration.photosPerPerson = 100
        configuration.bytesPerPerson = stored + Fixture.jpeg.count
        let bytesBound = try ImageLibrary(directory: directory.appendingPathComponent("bytes"), configuration: configuration)
        for plant in ["p1", "p2"] { _ = try await bytesBound.put(Fixture.jpeg, owner: "alice", plantID: plant) }
        await #expect(throws: CanopyError.self) { _ = try await bytesBound.put(Fixture.jpeg, owner: "alice", plantID: "p3") }
        #expect(try bytesBound.store.usage(owner: "alice").photos == 2)
    }

    @Test func variantsFinishedAfterTheirPhotoWasPurgedAreNotKept() async throws {
        let directory = Fixture.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let library = try ImageLibrary(directory: directory)
        let photo = try await library.put(Fixture.jpeg, owner: "alice", plantID: "p1")
        let made = try library.processor.make([.thumbnail, .gallery, .small], format: .jpeg, from: try library.store.original(photo.sha256))
        try await library.keep(made, of: photo.sha256) // still held: kept
        #expect(await library.cache.statistics().memory.entries == 3)
        _ = try await library.purge(owner: "alice", plantID: "p1")
        try await library.keep(made, of: photo.sha256) // a decode that ends after the purge
        let (memory, disk) = await library.cache.statistics()
        #expect(memory.entries == 0 && disk.entries == 0)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.appendingPathComponent("variants").path).isEmpty)
    }

    @Test func badImagesAreRefusedWithAClearErrorAndNothingIsStored() async throws {
        try await withImages { _, client, directory in
            let svg = Array(#"<svg xmlns="http://www.w3.org/2000/svg"/>"#.utf8)
            let truncated = Array(Fixture.jpeg.prefix(3_000))
            let bomb = Fixture.pngClaiming(width: 20_000, height: 20_000)
            for (bytes, code) in [(svg, CanopyError.Code.badRequest), (truncated, .badRequest), (bomb, .tooLarge), ([], .badRequest)] {
                let error = await #expect(throws: CanopyError.self) {
                    _ = try await client.call(Images.Put.self, .init(plantID: "p1", data: Data(bytes)), principal: "alice")
                }
                #expect(error?.code == code)
            }
            let stats = try await client.call(Images.Stats.self, .init())
            #expect(stats.originals == 0)
            #expect(try FileManager.default.contentsOfDirectory(atPath: directory.appendingPathComponent("originals").path).isEmpty)
            #expect(try await client.call(Images.List.self, .init(plantID: "p1"), principal: "alice").isEmpty)
            let notAnID = await #expect(throws: CanopyError.self) {
                _ = try await client.call(Images.GetVariant.self, .init(sha256: "../../etc/passwd", variant: .thumbnail), principal: "alice")
            }
            #expect(notAnID?.code == .badRequest)
        }
    }

    @Test func palettesAreComputedOnceThenCached() async throws {
        try await withImages { _, client, _ in
            let photo = try await client.call(Images.Put.self, .init(plantID: "p1", data: Data(Fixture.jpeg)), principal: "alice")
            let first = try await client.call(Images.Palette.self, .init(sha256: photo.sha256), principal: "alice")
            #expect(!first.cached)
            #expect(!first.swatches.isEmpty)
            #expect(first.swatches.allSatisfy { $0.hex.count == 7 && $0.population > 0 })
            let second = try await client.call(Images.Palette.self, .init(sha256: photo.sha256), principal: "alice")
            #expect(second.cached)
            #expect(second.swatches == first.swatches)
            // The decode behind the palette made the small variants as well.
            for variant in [Images.Variant.thumbnail, .gallery, .small] {
                #expect(try await client.call(Images.GetVariant.self, .init(sha256: photo.sha256, variant: variant), principal: "alice").source == "memory")
            }
        }
    }

    @Test func theFullVariantIsTheStoredOriginalWithoutADecode() async throws {
        try await withImages { _, client, directory in
            let photo = try await client.call(Images.Put.self, .init(plantID: "p1", data: Data(Fixture.image { $0.gps = true })), principal: "alice")
            let stored = try Data(contentsOf: directory.appendingPathComponent("originals").appendingPathComponent(photo.sha256))
            let full = try await client.call(Images.GetVariant.self, .init(sha256: photo.sha256, variant: .full), principal: "alice")
            #expect(full.source == "original")
            #expect(full.data == stored)
            #expect((full.width, full.height) == (photo.width, photo.height))
            let header = Fixture.header([UInt8](full.data))
            #expect((header.width, header.height) == (1200, 800) && !header.hasGPS && !header.hasEXIF)
            // Nothing went into the cache tiers for it.
            let stats = try await client.call(Images.Stats.self, .init())
            #expect(stats.memory.entries == 0 && stats.disk.entries == 0)
            #expect(stats.memory.hits + stats.memory.misses == 0)
            // In the other format it is made, once, and cached.
            let webp = try await client.call(Images.GetVariant.self, .init(sha256: photo.sha256, variant: .full, format: .webp), principal: "alice")
            #expect(webp.source == "made" && ImageKind(sniffing: [UInt8](webp.data)) == .webp)
            #expect((webp.width, webp.height) == (1200, 800))
            #expect(
                try await client.call(Images.GetVariant.self, .init(sha256: photo.sha256, variant: .full, format: .webp), principal: "alice").source == "memory"
            )
            // Somebody else cannot have it.
            let error = await #expect(throws: CanopyError.self) {
                _ = try await client.call(Images.GetVariant.self, .init(sha256: photo.sha256, variant: .full), principal: "bob")
            }
            #expect(error?.code == .notFound)
        }
    }

    @Test func warmingMakesVariantsAheadOfTime() async throws {
        try await withImages { _, client, _ in
            var shas: [String] = []
            for width in [600, 700, 900] {
                shas.append(
                    try await client.call(Images.Put.self, .init(plantID: "p1", data: Data(Fixture.image { $0.width = width })), principal: "alice").sha256)
            }
            let warmed = try await client.call(Images.Warm.self, .init(sha256s: shas, variants: [.thumbnail, .gallery]), principal: "alice")
            #expect(warmed == .init(made: 6, alreadyCached: 0))
            let again = try await client.call(Images.Warm.self, .init(sha256s: shas, variants: [.thumbnail, .gallery]), principal: "alice")
            #expect(again == .init(made: 0, alreadyCached: 6))
            for sha in shas {
                #expect(try await client.call(Images.GetVariant.self, .init(sha256: sha, variant: .gallery), principal: "alice").source == "memory")
            }
            // Small is ready too (one decode made all three); full JPEG is the stored original;
            // full WebP is made.
            let more = try await client.call(Images.Warm.self, .init(sha256s: shas, variants: [.small, .full, .thumbnail]), principal: "alice")
            #expect(more == .init(made: 0, alreadyCached: 9))
            // each photo once
            let webp = try await client.call(Images.Warm.self, .init(sha256s: shas + shas, variants: [.full, .small], format: .webp), principal: "alice")
            #expect(webp == .init(made: 6, alreadyCached: 0))
        }
    }

    @Test func identicalConcurrentVariantRequestsAreCoalescedAtTheBroker() async throws {
        try await withImages(.live) { _, client, _ in
            let photo = try await client.call(
                Images.Put.self,
                .init(
                    plantID: "p1",
                    data: Data(
                        Fixture.image {
                            $0.width = 3000
                            $0.height = 2000
                        })), principal: "alice")
            let request = Images.GetVariant.Request(sha256: photo.sha256, variant: .full)
            let replies = try await withThrowingTaskGroup(of: Images.GetVariant.Reply.self) { group in
                for _ in 0..<20 { group.addTask { try await client.call(Images.GetVariant.self, request, principal: "alice") } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(replies.count == 20)
            #expect(Set(replies.map(\.data)).count == 1)
            let stats = try await client.call(Broker.Stats.self, .init())
            let variant = try #require(stats.operations.first { $0.operation == Images.GetVariant.name })
            #expect(variant.workerCalls < 20)
            #expect(variant.coalesced == 20 - variant.workerCalls)
        }
    }

    @Test func aPurgeReplyDoesNotTellWhetherSomeoneElseHoldsThePhoto() async throws {
        // Handler level: what the reply says is the handler's business, not the bus's.
        let directory = Fixture.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let images = InProcessBus(serving: ImageService(library: try ImageLibrary(directory: directory)))
        let shared = Fixture.jpeg
        _ = try await images.call(Images.Put.self, .init(plantID: "monstera", data: Data(shared)), principal: "alice")
        _ = try await images.call(Images.Put.self, .init(plantID: "probe", data: Data(shared)), principal: "mallory")
        _ = try await images.call(Images.Put.self, .init(plantID: "own", data: Data(Fixture.png)), principal: "mallory")
        // A purge is a service's (canopy-care's follow-up for mallory's deleted plant).
        let care = images.timingOut(after: .seconds(30), asService: true)
        let held = try await care.call(
            service: Images.Purge.service, operation: Images.Purge.name, body: try MessageCodec().encode(Images.Purge.Request(plantID: "probe")),
            principal: "mallory"
        ).body
        let alone = try await care.call(
            service: Images.Purge.service, operation: Images.Purge.name, body: try MessageCodec().encode(Images.Purge.Request(plantID: "own")),
            principal: "mallory"
        ).body
        #expect(held == alone, "the same answer whether or not alice holds the bytes")
        #expect(String(decoding: held, as: UTF8.self) == #"{"photos":1}"#)
    }

    @Test func severalVariantsInOneRequestEachForItsOwnPersonWithinOneReply() async throws {
        let directory = Fixture.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let library = try ImageLibrary(directory: directory)
        let photo = try await library.put(Fixture.jpeg, owner: "alice", plantID: "fern")
        let thumbnail = try await library.variant(.init(sha256: photo.sha256, variant: .thumbnail), owner: "alice")
        let keys: [Images.GetVariants.Key] = [
            .init(principal: "alice", sha256: photo.sha256, variant: .thumbnail),
            .init(principal: "bob", sha256: photo.sha256, variant: .thumbnail), // not Bob's
            .init(principal: "alice", sha256: photo.sha256, variant: .gallery), // does not fit after the thumbnail
        ]
        // A reply with room for the thumbnail's bytes and little more.
        let context = RequestContext(
            principal: nil, deadline: .now + .seconds(30), logger: .init(label: "test"),
            maximumReplyBytes: max(1_024, thumbnail.data.count + 16))
        let reply = await library.variants(keys, context: context)
        #expect(reply.results.count == 3 && reply.attachments == [thumbnail.data])
        #expect(reply.results[0].value?.bytes == thumbnail.data.count)
        #expect(reply.results[1].error?.code == .notFound && reply.results[1].value == nil)
        #expect(reply.results[2].error?.code == .tooLarge, "asked for alone, in pieces if need be")
        // Made for one person, a request may name only that person.
        let alice = RequestContext(principal: "alice", deadline: .now + .seconds(30), logger: .init(label: "test"))
        let mixed = await library.variants(Array(keys.prefix(2)), context: alice)
        #expect(mixed.results[0].value != nil && mixed.results[1].error?.code == .unauthorized)
    }

    @Test func aVariantLargerThanOneReplyTravelsInPiecesAndArrivesWhole() async throws {
        let directory = Fixture.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let library = try ImageLibrary(directory: directory)
        let photo = try await library.put(Fixture.jpeg, owner: "alice", plantID: "fern")
        let whole = try await library.variant(.init(sha256: photo.sha256, variant: .full), owner: "alice", replyBytes: 16 * 1024 * 1024)
        #expect(whole.nextOffset == nil && whole.totalBytes == whole.data.count)
        let replyBytes = 16 * 1024
        var assembled = Data(), offset = 0, pieces = 0
        while true {
            let piece = try await library.variant(.init(sha256: photo.sha256, variant: .full, offset: offset), owner: "alice", replyBytes: replyBytes)
            #expect(try MessageCodec().encode(piece).count <= replyBytes, "each piece fits the frame limit")
            #expect(piece.offset == offset && piece.totalBytes == whole.data.count)
            assembled.append(piece.data)
            pieces += 1
            guard let next = piece.nextOffset else { break }
            offset = next
        }
        #expect(pieces > 1)
        #expect(assembled == whole.data)
        let past = await #expect(throws: CanopyError.self) {
            try await library.variant(.init(sha256: photo.sha256, variant: .full, offset: whole.data.count + 1), owner: "alice", replyBytes: replyBytes)
        }
        #expect(past?.code == .badRequest)
    }

    @Test(arguments: BusMode.allCases) func aFullVariantOverTheFrameLimitIsFetchedWholeOverTheBus(_ mode: BusMode) async throws {
        // Uploaded small (quality 20), stored at quality 90: the stored original, which is the
        // full variant, is larger than one reply may be on this broker.
        var configuration = BrokerConfiguration.testing
        configuration.maximumFrameBytes = 128 * 1024
        try await withImages(mode, configuration: configuration) { _, client, _ in
            let upload = Fixture.image {
                $0.width = 2400
                $0.height = 1600
                $0.quality = 20
            }
            let photo = try await client.call(Images.Put.self, .init(plantID: "fern", data: Data(upload)), principal: "alice")
            try #require(
                photo.bytes > ImageLibrary.pieceBytes(replyBytes: configuration.maximumFrameBytes), "the stored photo (\(photo.bytes) bytes) must need pieces")
            let first = try await client.call(Images.GetVariant.self, .init(sha256: photo.sha256, variant: .full), principal: "alice")
            #expect(first.nextOffset != nil && first.totalBytes == photo.bytes)
            var fetched: Set<Data> = []
            for _ in 0..<3 { // more than once: nothing wedges
                let whole = try await client.wholeVariant(.init(sha256: photo.sha256, variant: .full), principal: "alice")
                #expect(whole.data.count == photo.bytes)
                #expect(whole.data.prefix(first.data.count) == first.data)
                fetched.insert(whole.data)
            }
            #expect(fetched.count == 1)
            let header = Fixture.header([UInt8](try #require(fetched.first)))
            #expect((header.width, header.height) == (2400, 1600), "the pieces make one whole photo")
        }
    }
}
