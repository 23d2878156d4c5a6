import CanopyBus
import CanopyImaging
import CanopyMessages
import CanopyServiceKit
import Foundation
import Logging

/// What canopy-identify does, one method per operation. Every method takes the owner (the
/// request's principal); nothing is read, accepted or forgotten for anyone else.
///
/// It asks canopy-images to store and check photos (`images.put`) and for their smaller
/// sizes (`images.variant`), and canopy-care to add accepted plants (`plants.add`).
final class IdentificationLibrary: Sendable {
    /// The time it goes by (`--clock`).
    let clock: ServiceClock
    let store: any IdentificationStoring
    let provider: any IdentificationProvider
    /// The other services, over the bus.
    let bus: any IdentificationPeers
    let metrics: IdentificationMetrics

    init(
        store: any IdentificationStoring, provider: any IdentificationProvider, bus: any IdentificationPeers,
        metrics: IdentificationMetrics = IdentificationMetrics(),
        clock: ServiceClock = .system
    ) {
        self.clock = clock
        self.store = store
        self.provider = provider
        self.bus = bus
        self.metrics = metrics
    }

    // MARK: - Submit

    /// How long a submission being identified is held by the request that claimed it: longer
    /// than storing the photos and asking the provider take; a replica that dies holding one
    /// lets the next request take it over after this.
    static let claimSeconds: TimeInterval = 120

    /// Identifies 1 to 5 photos of one plant: stores the new ones through canopy-images,
    /// computes (or finds) each photo's features, asks the provider, records the answer. The
    /// same photos and organs again answer the recorded identification at once.
    func submit(_ request: Identification.Submit.Request, owner: String, now: Date? = nil) async throws -> Identification.Record {
        let now = now ?? clock.now()
        // The photos' ids: a stored photo's id, or the SHA-256 of the bytes (canopy-images'
        // id for them, so a submission is recognised before anything is stored).
        var attachments = request.data.makeIterator()
        var photos: [(organ: Identification.Organ, sha256: String, bytes: Data?)] = []
        for photo in request.photos {
            if let id = photo.photoID {
                photos.append((photo.organ, id, nil))
            } else {
                let bytes = attachments.next()! // validate() checked the count
                // Hashed here, on the handler's task: a few hundred microseconds even for a
                // 12 MP photo (SHA-256 in hardware), less than a hop to another thread costs.
                photos.append((photo.organ, Self.sha256(bytes), bytes))
            }
        }
        let key = Self.submissionKey(photos.map { ($0.sha256, $0.organ) })
        // The same photos again answer the recorded identification; the same photos at once
        // (two requests, on one replica or two) are identified once: the first claims the
        // submission, the others wait for its answer.
        // The photos go under a plant id of the submission's own: this one, or the one a
        // replica that died holding the claim stored them under.
        var plantID: String?
        while true {
            if let existing = try await store.identification(owner: owner, submissionKey: key) {
                if plantID != nil { try? store.releaseSubmission(owner: owner, key: key) }
                metrics.submission(repeated: true)
                return existing
            }
            if plantID != nil { break } // and nobody identified it before the claim: this request does
            let claimedAt = Date()
            plantID = try await offThePool { [store] in
                try store.claimSubmission(owner: owner, key: key, plantID: UUID().uuidString.lowercased(), now: claimedAt, until: claimedAt + Self.claimSeconds)
            }
            if plantID == nil { try await Task.sleep(for: .milliseconds(50)) }
        }
        defer { try? store.releaseSubmission(owner: owner, key: key) }
        metrics.submission(repeated: false)
        guard let plantID else { preconditionFailure("the loop ends claimed") }
        // A submission that fails leaves nothing behind: the photos it stored (under its own
        // plant id) and the features it computed go again.
        var storedAny = false
        var computed: [String] = []
        do {
            return try await identify(
                photos, request: request, key: key, plantID: plantID, owner: owner, now: now,
                storedAny: &storedAny, computed: &computed)
        } catch {
            if storedAny { _ = try? await bus.purge(plantID: plantID, owner: owner) }
            try? store.deleteFeatures(computed)
            throw error
        }
    }

    /// Clears what submissions left when the replica identifying them went away (killed, or
    /// past ``claimSeconds``): the photos stored under a submission's plant id are purged
    /// unless its identification was recorded, and the claim goes. One that cannot be
    /// cleared now (canopy-images is away) is held for ``claimSeconds``, then tried again.
    /// Returns how many it cleared.
    @discardableResult
    func sweepAbandoned(now: Date? = nil, logger: Logger? = nil) async throws -> Int {
        let now = now ?? clock.now()
        let abandoned = try await offThePool { [store] in try store.takeAbandonedSubmissions(now: now, until: now + Self.claimSeconds, limit: 100) }
        var cleared = 0
        for submission in abandoned {
            do {
                if try await store.identification(owner: submission.owner, submissionKey: submission.key) == nil, let plantID = submission.plantID {
                    try await bus.purge(plantID: plantID, owner: submission.owner)
                }
                try store.releaseSubmission(owner: submission.owner, key: submission.key)
                cleared += 1
            } catch {
                logger?.warning("identify.submission.sweep.failed", metadata: ["error": "\(error)"])
            }
        }
        return cleared
    }

    /// The work of ``submit(_:owner:now:)`` once the submission is new: every photo stored
    /// (or its owner checked) and its features known, the provider asked, the record written.
    private func identify(
        _ photos: [(organ: Identification.Organ, sha256: String, bytes: Data?)], request: Identification.Submit.Request,
        key: String, plantID: String, owner: String, now: Date,
        storedAny: inout Bool, computed: inout [String]
    ) async throws -> Identification.Record {
        var query: [QueryPhoto] = []
        for (index, photo) in photos.enumerated() {
            let features: PhotoFeatures
            if let bytes = photo.bytes {
                // canopy-images checks the photo (format, size, that it decodes) and strips it.
                storedAny = true // from here on (a reply lost after the store counts too)
                _ = try await bus.put(bytes, plantID: plantID, owner: owner)
                features = try await self.features(photo.sha256, computed: &computed) { [UInt8](bytes) }
            } else {
                // Only its owner may name a stored photo: canopy-images answers no one else,
                // whether or not its features are known here already.
                do {
                    try await bus.requireOwnership(photo.sha256, owner: owner)
                } catch let error as CanopyError where error.code == .notFound {
                    throw CanopyError(.notFound, "photos[\(index)].photoID: no photo \(photo.sha256) among yours")
                }
                features = try await self.features(photo.sha256, computed: &computed) { [bus] in try await bus.variant(photo.sha256, .small, owner: owner) }
            }
            let (bus, sha256) = (self.bus, photo.sha256)
            query.append(
                QueryPhoto(
                    sha256: sha256, organ: photo.organ, features: features,
                    gallery: { try await bus.variant(sha256, .gallery, owner: owner) }))
        }
        if provider.kind != .plantnet { await computeMissingPlantFeatures(owner: owner) }
        let results = try await metrics.providerCall(provider.kind) {
            try await provider.identify(ProviderQuery(owner: owner, photos: query, askPlantNet: request.askPlantNet))
        }
        let record = Identification.Record(
            id: UUID().uuidString.lowercased(), owner: owner, createdAt: Date(timeIntervalSince1970: (now.timeIntervalSince1970 * 1000).rounded() / 1000),
            provider: provider.kind, organs: photos.map(\.organ), photoIDs: photos.map(\.sha256),
            location: request.exactLocation ? request.location : request.location?.coarsened, exactLocation: request.exactLocation,
            results: results, plantID: plantID)
        let (stored, dropped) = try await offThePool { [store] in try store.insert(record, submissionKey: key) }
        for plantID in dropped {
            // Best effort: a photo left behind is only storage, under a plant id nothing names.
            _ = try? await bus.purge(plantID: plantID, owner: owner)
        }
        return stored
    }

    /// Features of the person's plant photos that have none stored (their features were of the
    /// matcher's older format): computed again from canopy-images' `small` variant, at most
    /// ``missingFeaturesPerRequest`` a request, so "which of my plants is this?" knows every
    /// plant again after a few identifications. Best effort: a photo that cannot be read now
    /// is tried again next time.
    private func computeMissingPlantFeatures(owner: String) async {
        guard let missing = try? await offThePool({ [store] in try store.plantPhotosWithoutFeatures(owner: owner, limit: Self.missingFeaturesPerRequest) })
        else { return }
        for sha256 in missing {
            guard let bytes = try? await bus.variant(sha256, .small, owner: owner),
                let features = try? await offThePool({ try PhotoFeatures.compute(from: bytes) })
            else { continue }
            _ = try? await offThePool { [store] in try store.saveFeatures(features, sha256: sha256) }
            metrics.computedFeatures()
        }
    }

    static let missingFeaturesPerRequest = 8

    /// A photo's features: stored ones, or computed from the bytes `load` gives and stored.
    /// Those it computed are added to `computed`.
    private func features(_ sha256: String, computed: inout [String], load: @Sendable () async throws -> [UInt8]) async throws -> PhotoFeatures {
        if let known = try await offThePool({ [store] in try store.features([sha256])[sha256] }) { return known }
        let bytes = try await load()
        let features = try await offThePool { try PhotoFeatures.compute(from: bytes) }
        try await offThePool { [store] in try store.saveFeatures(features, sha256: sha256) }
        computed.append(sha256)
        metrics.computedFeatures()
        return features
    }

    /// A photo's id: SHA-256 of its bytes, lower-case hexadecimal (canopy-images' photo id).
    static func sha256<Bytes: DataProtocol>(_ bytes: Bytes) -> String {
        PhotoID.of(bytes)
    }

    /// The same photos with the same organs, in any order, give the same key.
    static func submissionKey(_ photos: [(sha256: String, organ: Identification.Organ)]) -> String {
        let text = photos.map { "\($0.sha256):\($0.organ.rawValue)" }.sorted().joined(separator: "\n")
        return sha256(Array(text.utf8))
    }

    // MARK: - Accept

    /// Adds the identified plant to the person's collection through canopy-care, with the
    /// photos, the provider and the confidence. The plant's id is the identification's
    /// ``Identification/Record/plantID``, so accepting again (or a retry after a lost reply)
    /// answers the same plant. A candidate that is one of the person's plants adds nothing:
    /// it answers that plant, and files the photos under it.
    func accept(_ request: Identification.Accept.Request, owner: String, now: Date? = nil) async throws -> Identification.Accept.Reply {
        let now = now ?? clock.now()
        guard var record = try await store.identification(owner: owner, id: request.id) else {
            throw CanopyError(.notFound, "no identification \(request.id) among yours; identifications.history lists them")
        }
        let candidate: Identification.Candidate
        if let rank = request.rank {
            guard let chosen = record.results.first(where: { $0.rank == rank }) else {
                throw CanopyError(.badRequest, "identification \(record.id) has \(record.results.count) candidate(s); rank \(rank) is not one of them")
            }
            candidate = chosen
        } else {
            let name = request.scientificName!.trimmingCharacters(in: .whitespaces)
            candidate = Identification.Candidate(rank: 0, score: 1, scientificName: name, scientificNameWithoutAuthor: name, provider: record.provider)
        }
        let plant: Care.Plant
        if let existing = candidate.plantID {
            plant = try await bus.plant(existing, owner: owner)
        } else {
            var new = Care.Plant(
                id: record.plantID, scientificName: candidate.scientificNameWithoutAuthor, commonNames: candidate.commonNames,
                family: candidate.family, genus: candidate.genus, customName: request.customName, imageIDs: record.photoIDs,
                identificationSource: request.rank == nil ? .manual : Care.Source(record.provider),
                identificationConfidence: request.rank == nil ? nil : candidate.score, dateIdentified: record.createdAt)
            if new.commonNames.count > Care.Limits.commonNames { new.commonNames = Array(new.commonNames.prefix(Care.Limits.commonNames)) }
            plant = try await bus.addPlant(new, owner: owner)
        }
        if record.acceptedAt == nil {
            record.acceptedAt = now
            record.acceptedName = candidate.scientificNameWithoutAuthor
            try await store.accept(record, plantID: plant.id, candidate: candidate)
        }
        return Identification.Accept.Reply(identification: record, plant: plant)
    }

    // MARK: - Reading and forgetting

    func get(_ id: String, owner: String) async throws -> Identification.Record {
        guard let record = try await store.identification(owner: owner, id: id) else {
            throw CanopyError(.notFound, "no identification \(id) among yours; identifications.history lists them")
        }
        return record
    }

    func history(_ request: Identification.History.Request, owner: String) throws -> Identification.History.Reply {
        let limit = request.limit ?? 20
        var cursor: (Double, String)?
        if let after = request.after {
            let parts = after.split(separator: "/", maxSplits: 1)
            // Whole milliseconds (a record's time is whole milliseconds when it is made, and the
            // store keeps it so; the time a record comes back with from its JSON may be a hair
            // off, which would repeat or skip it); cursors of seconds from before still work.
            let createdAt = parts.count == 2 ? Int64(parts[0]).map { Double($0) / 1000 } ?? Double(parts[0]) : nil
            guard parts.count == 2, let createdAt, createdAt.isFinite else {
                throw CanopyError(.badRequest, "after is not a cursor from identifications.history; pass its next field as given")
            }
            cursor = (createdAt, String(parts[1]))
        }
        let page = try store.history(owner: owner, plantID: request.plantID, limit: limit + 1, after: cursor)
        let items = Array(page.prefix(limit))
        let next = page.count > limit ? items.last.map { "\(Int64(($0.createdAt.timeIntervalSince1970 * 1000).rounded()))/\($0.id)" } : nil
        return Identification.History.Reply(items: items, next: next)
    }

    func forget(plantID: String, owner: String) throws {
        try store.forget(owner: owner, plantID: plantID)
    }

    /// Forgets a person who deleted their account: each plant's identifications as a deleted
    /// plant's are forgotten, then their submissions.
    func forget(owner: String) throws {
        for plantID in try store.plantIDs(owner: owner) { _ = try store.forget(owner: owner, plantID: plantID) }
        try store.forgetSubmissions(owner: owner)
        store.eraseResidue()
    }
}

extension Care.Source {
    /// How canopy-care records a plant an identification provider named.
    init(_ provider: Identification.Provider) {
        switch provider {
        case .plantnet: self = .plantnet
        case .reference: self = .reference
        case .hybrid: self = .hybrid
        }
    }
}

/// The other services canopy-identify asks: canopy-images and canopy-care, over the bus
/// (``BusPeers``).
protocol IdentificationPeers: Sendable {
    /// Stores a photo for a plant (`images.put`); canopy-images checks and strips it.
    func put(_ bytes: Data, plantID: String, owner: String) async throws -> Images.Photo
    /// Throws `notFound` unless `owner` stored the photo (canopy-images answers only its owner).
    func requireOwnership(_ sha256: String, owner: String) async throws
    /// A variant's bytes (`images.variant`, JPEG).
    func variant(_ sha256: String, _ variant: Images.Variant, owner: String) async throws -> [UInt8]
    /// Drops a plant's photos (`images.purge`).
    func purge(plantID: String, owner: String) async throws
    /// Adds a plant (`plants.add`).
    func addPlant(_ plant: Care.Plant, owner: String) async throws -> Care.Plant
    /// One of the person's plants (`plants.get`).
    func plant(_ id: String, owner: String) async throws -> Care.Plant
}

/// ``IdentificationPeers`` over the bus.
struct BusPeers: IdentificationPeers {
    let client: any BusCalling

    func put(_ bytes: Data, plantID: String, owner: String) async throws -> Images.Photo {
        try await client.call(Images.Put.self, .init(plantID: plantID, data: bytes), principal: owner, timeout: .seconds(60))
    }

    func requireOwnership(_ sha256: String, owner: String) async throws {
        // The smallest thing canopy-images serves only to a photo's owner.
        _ = try await client.call(Images.GetVariant.self, .init(sha256: sha256, variant: .thumbnail), principal: owner)
    }

    func variant(_ sha256: String, _ variant: Images.Variant, owner: String) async throws -> [UInt8] {
        [UInt8](try await client.wholeVariant(.init(sha256: sha256, variant: variant, format: .jpeg), principal: owner, timeout: .seconds(60)).data)
    }

    func purge(plantID: String, owner: String) async throws {
        _ = try await client.call(Images.Purge.self, .init(plantID: plantID), principal: owner)
    }

    func addPlant(_ plant: Care.Plant, owner: String) async throws -> Care.Plant {
        try await client.call(Care.AddPlant.self, plant, principal: owner)
    }

    func plant(_ id: String, owner: String) async throws -> Care.Plant {
        try await client.call(Care.GetPlant.self, .init(id: id), principal: owner)
    }
}
