import CanopyImaging
import CanopyMessages
import Foundation

/// One photo of a query as providers see it.
struct QueryPhoto: Sendable {
    var sha256: String
    var organ: Identification.Organ
    /// Computed once per photo and stored.
    var features: PhotoFeatures
    /// The photo at the size identification services want (canopy-images' gallery variant:
    /// fits 800x600), fetched only when a provider needs the pixels themselves.
    var gallery: @Sendable () async throws -> [UInt8]
}

/// What a provider is asked.
struct ProviderQuery: Sendable {
    /// Whose photos these are: the reference matcher also compares against their plants.
    var owner: String
    var photos: [QueryPhoto]
    /// With the hybrid provider: ask Pl@ntNet whatever the reference matcher found.
    var askPlantNet: Bool
}

/// An identification provider: photos in, ranked candidates out (empty: nothing matched).
/// Chosen by configuration (`--provider`); see docs/IDENTIFICATION.md.
protocol IdentificationProvider: Sendable {
    /// The name recorded with each identification.
    var kind: Identification.Provider { get }
    /// Ranked candidates, best first, at most ``Identification/Limits/candidates``.
    func identify(_ query: ProviderQuery) async throws -> [Identification.Candidate]
}

extension [Identification.Candidate] {
    /// Sorted by score (ties by name, so the order is stable), cut to the limit and ranked 1, 2, ….
    func ranked() -> [Identification.Candidate] {
        sorted { ($0.score, $1.scientificName) > ($1.score, $0.scientificName) }
            .prefix(Identification.Limits.candidates)
            .enumerated()
            .map { index, candidate in
                var candidate = candidate
                candidate.rank = index + 1
                return candidate
            }
    }
}

/// `hybrid`: the reference matcher first; Pl@ntNet when its best score is below the
/// threshold, or when the request asks. Candidates of both are merged (the same species
/// once, with the higher score); the provider recorded is `hybrid`.
struct HybridProvider: IdentificationProvider {
    let reference: ReferenceProvider
    let plantNet: PlantNetProvider
    /// A best reference score at or above this is sure enough to skip Pl@ntNet.
    let threshold: Double

    var kind: Identification.Provider { .hybrid }

    func identify(_ query: ProviderQuery) async throws -> [Identification.Candidate] {
        let local = try await reference.identify(query)
        guard query.askPlantNet || (local.first?.score ?? 0) < threshold else { return local }
        let remote = try await plantNet.identify(query)
        var merged: [String: Identification.Candidate] = [:]
        for candidate in local + remote {
            // One's own plant stays apart from the species it is of.
            let key = candidate.plantID.map { "plant:\($0)" } ?? candidate.scientificNameWithoutAuthor.lowercased()
            if let existing = merged[key], existing.score >= candidate.score { continue }
            merged[key] = candidate
        }
        return Array(merged.values).ranked()
    }
}
