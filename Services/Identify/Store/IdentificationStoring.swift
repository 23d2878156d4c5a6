import CanopyImaging
import CanopyMessages
import Foundation

/// What canopy-identify keeps, as the operations its rules need: no SQL outside the types that
/// implement it: ``SQLiteIdentificationStore`` (SQLite, the embedded default) and
/// ``PostgresIdentificationStore`` (PostgreSQL, which replicas share).
/// Every operation is a transaction of its own; every one on a person's data names the owner.
protocol IdentificationStoring: Sendable {
    /// Clears what an erasure (a person's account deleted) left beyond its deleted rows: the
    /// write-ahead log's copies of them (SQLite, at once), the dead rows (PostgreSQL, a
    /// `VACUUM` soon after).
    func eraseResidue()

    // MARK: Identifications

    func identification(owner: String, id: String) async throws -> Identification.Record?
    /// The identification of these photos, if the person submitted them before.
    func identification(owner: String, submissionKey: String) async throws -> Identification.Record?
    /// Makes the caller the one identifying this submission, its photos stored under
    /// `plantID`, until `until`, its release, or the end of the store's process; nil while
    /// another holds it. Answers the plant id to store the photos under: `plantID`, or, when
    /// it takes over a claim whose holder is gone or whose time passed, that claim's (the
    /// photos the holder stored count again, and none is left under a plant id nothing names).
    func claimSubmission(owner: String, key: String, plantID: String, now: Date, until: Date) throws -> String?
    /// Lets go of a submission this store claimed (identified, or failed).
    func releaseSubmission(owner: String, key: String) throws
    /// Takes over, until `until`, up to `limit` claims nobody holds any more: their holder is
    /// gone (a replica killed mid-submission) or their time passed. For
    /// ``IdentificationLibrary/sweepAbandoned(now:)``, which clears what each left.
    func takeAbandonedSubmissions(now: Date, until: Date, limit: Int) throws -> [AbandonedSubmission]
    /// Records a new identification; when the same submission was recorded meanwhile (two at
    /// once), that one stands and is returned. A person keeps at most
    /// ``Identification/Limits/identificationsPerPerson``: past that, their oldest
    /// identifications that were never accepted make room, and their plant ids come back in
    /// `dropped` (their photos are then purged from canopy-images).
    func insert(_ record: Identification.Record, submissionKey: String) throws -> (record: Identification.Record, dropped: [String])
    /// Marks an identification accepted as `plantID` and files its photos under that plant,
    /// for matching the person's later photos against their own plants.
    func accept(_ record: Identification.Record, plantID: String, candidate: Identification.Candidate) async throws
    /// A page of `owner`'s identifications (or one plant's), newest first, after `cursor`.
    func history(owner: String, plantID: String?, limit: Int, after cursor: (createdAt: Double, id: String)?) throws -> [Identification.Record]
    /// Forgets a deleted plant's identifications and its photos' filing; how many went.
    func forget(owner: String, plantID: String) throws -> Int
    /// Every plant id `owner`'s identifications and filed photos name.
    func plantIDs(owner: String) throws -> [String]
    /// Drops `owner`'s submission claims.
    func forgetSubmissions(owner: String) throws

    // MARK: Photo features

    /// Stored features of the photos among `sha256s` that have them.
    func features(_ sha256s: [String]) throws -> [String: PhotoFeatures]
    func saveFeatures(_ features: PhotoFeatures, sha256: String) throws
    /// Forgets the features of these photos (a failed submission's).
    func deleteFeatures(_ sha256s: [String]) throws
    /// The person's accepted plants' photos with their features: what "which of my plants is
    /// this?" compares against.
    func plantPhotos(owner: String) throws -> [(candidate: Identification.Candidate, features: PhotoFeatures)]
    /// Up to `limit` of the person's plant photos whose features are not stored (or were of an
    /// older format): the ones ``plantPhotos(owner:)`` leaves out until they are computed again.
    func plantPhotosWithoutFeatures(owner: String, limit: Int) throws -> [String]

    // MARK: References (the operator's labelled photos)

    /// Bumped by every change to the references: a running service reloads its index when
    /// the number it built from is no longer current.
    func referenceGeneration() throws -> Int
    /// Adds reference photos of a species (created, or updated with the names given).
    func addReferences(_ species: ReferenceSpecies, photos: [(sha256: String, features: PhotoFeatures)], now: Date) throws
    /// Removes a species and its reference photos; `false` when there was none by that name.
    func removeReferences(scientificName: String) throws -> Bool
    /// Every species with its number of reference photos the matcher can use (those whose
    /// features are of the current format), by name.
    func referenceSpecies() throws -> [(species: ReferenceSpecies, photos: Int)]
    /// Every reference photo's species and features, and the generation they are of.
    func referenceSet() throws -> (generation: Int, entries: [(species: ReferenceSpecies, features: PhotoFeatures)])

    // MARK: A provider's daily quota

    func quota(provider: String) throws -> ProviderQuota
    func saveQuota(_ state: ProviderQuota, provider: String, now: Date) throws
}

/// A labelled species as the operator loaded it.
struct ReferenceSpecies: Sendable, Equatable {
    var scientificName: String
    var withoutAuthor: String
    var authorship: String
    var genus: String
    var family: String
    var commonNames: [String]
    var gbifID: Int?
}

/// What a provider (Pl@ntNet) last said of its daily quota.
struct ProviderQuota: Sendable, Equatable {
    var remaining: Int?
    var resetsAt: Date?
}

extension IdentificationStoring {
    func addReferences(_ species: ReferenceSpecies, photos: [(sha256: String, features: PhotoFeatures)]) throws {
        try addReferences(species, photos: photos, now: Date())
    }

    func saveQuota(_ state: ProviderQuota, provider: String) throws {
        try saveQuota(state, provider: provider, now: Date())
    }
}

/// A submission whose claimant went away mid-way (``IdentificationStoring/takeAbandonedSubmissions(now:until:limit:)``):
/// whose it was, its key, and the plant id its photos were stored under.
struct AbandonedSubmission: Sendable, Equatable {
    var owner: String
    var key: String
    var plantID: String?
}
