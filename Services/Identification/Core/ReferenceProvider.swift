import CanopyImaging
import CanopyMessages
import CanopyServiceKit
import Foundation
import Synchronization

/// `reference`: works offline with no account. It compares the query photos' features with
/// the operator's labelled reference photos (through a ``ReferenceIndex``) and with the photos
/// of the person's own accepted plants ("which of my plants is this?").
///
/// A species scores, for each query photo, the similarity of its nearest reference photo
/// among the ``neighbours`` nearest of all, and overall the mean over the query photos; one of
/// the person's plants scores the same way against that plant's photos. Scores are
/// similarities of appearance, 0 to 1, not probabilities (docs/IDENTIFICATION.md).
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

    /// The person's plants, each scored by the mean over the query photos of its best photo.
    static func ownPlants(_ photos: [(candidate: Identification.Candidate, features: PhotoFeatures)], for queries: [PhotoFeatures]) -> [Identification.Candidate] {
        guard !queries.isEmpty else { return [] }
        var best: [String: (candidate: Identification.Candidate, scores: [Double])] = [:]
        for photo in photos {
            guard let plantID = photo.candidate.plantID else { continue }
            let scores = queries.map { photo.features.similarity(to: $0) }
            if let existing = best[plantID] {
                best[plantID]!.scores = zip(existing.scores, scores).map { max($0, $1) }
            } else {
                best[plantID] = (photo.candidate, scores)
            }
        }
        return best.values.map { entry in
            var candidate = entry.candidate
            candidate.score = Self.rounded(entry.scores.reduce(0, +) / Double(queries.count))
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
    func candidates(for queries: [PhotoFeatures], neighbours: Int) -> [Identification.Candidate] {
        guard !queries.isEmpty else { return [] }
        var totals: [String: (species: ReferenceSpecies, sum: Double)] = [:]
        for query in queries {
            var best: [String: (ReferenceSpecies, Double)] = [:]
            for neighbour in index.nearest(to: query, count: neighbours) {
                let species = self.species[neighbour.item]
                let similarity = 1 - Double(neighbour.distance)
                if (best[species.scientificName]?.1 ?? -1) < similarity { best[species.scientificName] = (species, similarity) }
            }
            for (name, (species, similarity)) in best {
                totals[name, default: (species, 0)].sum += similarity
            }
        }
        return totals.values.map { entry in
            Identification.Candidate(
                rank: 0, score: ReferenceProvider.rounded(entry.sum / Double(queries.count)), scientificName: entry.species.scientificName,
                scientificNameWithoutAuthor: entry.species.withoutAuthor, authorship: entry.species.authorship, commonNames: entry.species.commonNames,
                genus: entry.species.genus, family: entry.species.family, gbifID: entry.species.gbifID, provider: .reference)
        }
    }
}
