import CanopyImaging
import CanopyMessages
import CanopyServiceKit
import Foundation
import Synchronization

/// `reference`: works offline with no account. It compares the query photos' features with
/// the operator's labelled reference photos (through a ``ReferenceIndex``) and with the photos
/// of the person's own accepted plants ("which of my plants is this?").
///
/// A species' distance is, for each query photo, the distance to its nearest reference photo
/// among the ``neighbours`` nearest of all, averaged over the query photos; one of the person's
/// plants is measured the same way against that plant's photos. Scores are calibrated
/// confidences (``FeatureModel/confidences(_:)``): the species among the species, the plants
/// among the person's plants. When even the nearest is further than
/// ``FeatureModel/noMatchBeyond`` there is no good match, and no candidate of that kind is
/// named (docs/IDENTIFICATION.md).
final class ReferenceProvider: IdentificationProvider {
    let store: any IdentificationStoring
    /// How many nearest reference photos each query photo looks at.
    let neighbours: Int
    /// The index of the reference generation it was built from; rebuilt when the operator
    /// changed the references (the CLI bumps the generation).
    private let loaded = Mutex<Loaded?>(nil)

    struct Loaded: Sendable {
        var generation: Int
        var index: ReferenceIndex
        var species: [ReferenceSpecies]
    }

    var kind: Identification.Provider { .reference }

    init(store: any IdentificationStoring, neighbours: Int = 32) {
        self.store = store
        self.neighbours = neighbours
    }

    func identify(_ query: ProviderQuery) async throws -> [Identification.Candidate] {
        let (features, owner) = (query.photos.map(\.features), query.owner)
        // Off the cooperative pool: the store's reads (a round trip each on PostgreSQL) and
        // the search through every reference photo.
        return try await offThePool { [self] in
            var candidates = try references().candidates(for: features, neighbours: neighbours)
            candidates += Self.ownPlants(try store.plantPhotos(owner: owner), for: features)
            return candidates.ranked()
        }
    }

    /// The current index: the one loaded, unless the references changed since.
    func references() throws -> Loaded {
        let generation = try store.referenceGeneration()
        if let current = loaded.withLock({ $0 }), current.generation == generation { return current }
        let set = try store.referenceSet()
        let fresh = Loaded(generation: set.generation, index: ReferenceIndex(set.entries.map(\.features)), species: set.entries.map(\.species))
        loaded.withLock { $0 = fresh }
        return fresh
    }

    /// The person's plants, each at the mean over the query photos of its nearest photo.
    static func ownPlants(_ photos: [(candidate: Identification.Candidate, features: PhotoFeatures)], for queries: [PhotoFeatures]) -> [Identification
        .Candidate]
    {
        guard !queries.isEmpty else { return [] }
        var nearest: [String: (candidate: Identification.Candidate, distances: [Float])] = [:]
        for photo in photos {
            guard let plantID = photo.candidate.plantID else { continue }
            let distances = queries.map { photo.features.distance(to: $0) }
            if let existing = nearest[plantID] {
                nearest[plantID]!.distances = zip(existing.distances, distances).map { min($0, $1) }
            } else {
                nearest[plantID] = (photo.candidate, distances)
            }
        }
        return scored(nearest.values.map { ($0.candidate, $0.distances.reduce(0, +) / Float(queries.count)) })
    }

    /// Candidates at their distances, scored by confidence; none when even the nearest is
    /// further than ``FeatureModel/noMatchBeyond`` (no good match).
    static func scored(_ candidates: [(candidate: Identification.Candidate, distance: Float)], refusingFar: Bool = true) -> [Identification.Candidate] {
        guard let nearest = candidates.map(\.distance).min(), !refusingFar || nearest <= FeatureModel.noMatchBeyond else { return [] }
        let confidences = FeatureModel.confidences(candidates.map(\.distance))
        return zip(candidates, confidences).compactMap { entry, confidence in
            let score = rounded(confidence)
            guard score > 0 else { return nil }
            var candidate = entry.candidate
            candidate.score = score
            candidate.provider = .reference
            return candidate
        }
    }

    /// Scores kept to 4 decimals, so the same photos always give the same bytes.
    static func rounded(_ score: Double) -> Double {
        (min(1, max(0, score)) * 10_000).rounded() / 10_000
    }
}

extension ReferenceProvider.Loaded {
    /// Species candidates for the query photos.
    func candidates(for queries: [PhotoFeatures], neighbours: Int, refusingFar: Bool = true) -> [Identification.Candidate] {
        guard !queries.isEmpty else { return [] }
        // Per query photo, each species' nearest photo among the neighbours; a species none of
        // whose photos is among one query's neighbours is at least as far as the farthest.
        var nearest: [[String: Float]] = []
        var farthest: [Float] = []
        var species: [String: ReferenceSpecies] = [:]
        for query in queries {
            var best: [String: Float] = [:]
            let found = index.nearest(to: query, count: neighbours)
            for neighbour in found {
                let entry = self.species[neighbour.item]
                species[entry.scientificName] = entry
                best[entry.scientificName] = min(best[entry.scientificName] ?? .infinity, neighbour.distance)
            }
            nearest.append(best)
            farthest.append(found.last?.distance ?? .infinity)
        }
        let measured = species.values.map { entry in
            let total = zip(nearest, farthest).reduce(Float(0)) { $0 + ($1.0[entry.scientificName] ?? $1.1) }
            return (
                Identification.Candidate(
                    rank: 0, score: 0, scientificName: entry.scientificName,
                    scientificNameWithoutAuthor: entry.withoutAuthor, authorship: entry.authorship, commonNames: entry.commonNames,
                    genus: entry.genus, family: entry.family, gbifID: entry.gbifID, provider: .reference), total / Float(queries.count)
            )
        }
        return ReferenceProvider.scored(measured, refusingFar: refusingFar)
    }
}
