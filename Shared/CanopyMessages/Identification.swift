import Foundation

/// The operations of `canopy-identify`: from a person's photos of a plant to ranked candidate
/// species, and from an accepted candidate to a plant in their collection. Every operation
/// but `identifications.quota` acts for the principal: nobody reads, accepts or forgets
/// another person's identifications.
public enum Identification {
    /// The service name.
    public static let service = "identify"

    /// What part of the plant a photo shows (Pl@ntNet's organs; `auto` lets the provider decide).
    public enum Organ: String, Codable, Sendable, CaseIterable {
        case leaf, flower, fruit, bark, auto
    }

    /// Who answered an identification.
    public enum Provider: String, Codable, Sendable, CaseIterable {
        /// The Pl@ntNet identification API.
        case plantnet
        /// Canopy's own matcher: labelled reference photos and the person's own plants.
        case reference
        /// The reference matcher first, Pl@ntNet when it is not sure enough.
        case hybrid
    }

    /// Where a photo was taken, in degrees (WGS 84).
    public struct Location: Codable, Sendable, Equatable {
        public var latitude: Double
        public var longitude: Double

        public init(latitude: Double, longitude: Double) {
            self.latitude = latitude
            self.longitude = longitude
        }

        /// Rounded to 0.01 degree: about 1 km north to south (and less east to west away from
        /// the equator), what identifications keep unless asked for the exact place.
        public var coarsened: Location {
            Location(latitude: (latitude * 100).rounded() / 100, longitude: (longitude * 100).rounded() / 100)
        }
    }

    /// One photo of a submission: stored bytes (the next attachment, in order) or the id of a
    /// photo the person already stored in canopy-images.
    public struct PhotoInput: Codable, Sendable, Equatable {
        /// What the photo shows.
        public var organ: Organ
        /// A photo id (SHA-256, 64 hexadecimal characters) from canopy-images; `nil` when the
        /// bytes travel as an attachment.
        public var photoID: String?

        public init(organ: Organ, photoID: String? = nil) {
            self.organ = organ
            self.photoID = photoID
        }
    }

    /// A candidate species (or one of the person's own plants), best first.
    public struct Candidate: Codable, Sendable, Equatable {
        /// 1 for the best.
        public var rank: Int
        /// 0 to 1. From Pl@ntNet: its score. From the reference matcher: a calibrated
        /// confidence, how often a candidate so scored is right (see docs/IDENTIFICATION.md).
        public var score: Double
        /// With authorship, e.g. "Monstera deliciosa Liebm.".
        public var scientificName: String
        /// Without authorship, e.g. "Monstera deliciosa".
        public var scientificNameWithoutAuthor: String
        /// The authorship, e.g. "Liebm.", or empty.
        public var authorship: String
        public var commonNames: [String]
        public var genus: String
        public var family: String
        /// The species' id in GBIF, when known.
        public var gbifID: Int?
        /// Set when the candidate is one of the person's own plants (the reference matcher's
        /// "which of my plants is this?").
        public var plantID: String?
        /// Which provider found it (in a hybrid identification, either).
        public var provider: Provider

        public init(
            rank: Int, score: Double, scientificName: String, scientificNameWithoutAuthor: String, authorship: String = "",
            commonNames: [String] = [], genus: String = "", family: String = "", gbifID: Int? = nil, plantID: String? = nil,
            provider: Provider
        ) {
            self.rank = rank
            self.score = score
            self.scientificName = scientificName
            self.scientificNameWithoutAuthor = scientificNameWithoutAuthor
            self.authorship = authorship
            self.commonNames = commonNames
            self.genus = genus
            self.family = family
            self.gbifID = gbifID
            self.plantID = plantID
            self.provider = provider
        }
    }

    /// An identification as its owner sees it.
    public struct Record: Codable, Sendable, Equatable {
        public var id: String
        /// The principal it belongs to.
        public var owner: String
        public var createdAt: Date
        public var provider: Provider
        /// One per photo, in the order submitted.
        public var organs: [Organ]
        /// The photos' ids in canopy-images, in the order submitted.
        public var photoIDs: [String]
        /// Coarsened to about 1 km unless `exactLocation`.
        public var location: Location?
        public var exactLocation: Bool
        /// Ranked candidates, best first; empty when nothing matched.
        public var results: [Candidate]
        /// The plant the photos are filed under in canopy-images, and the id the plant gets
        /// in canopy-care when the identification is accepted.
        public var plantID: String
        /// When it was accepted (a plant was added), and with which name.
        public var acceptedAt: Date?
        public var acceptedName: String?

        public init(
            id: String, owner: String, createdAt: Date, provider: Provider, organs: [Organ], photoIDs: [String], location: Location?,
            exactLocation: Bool, results: [Candidate], plantID: String, acceptedAt: Date? = nil, acceptedName: String? = nil
        ) {
            self.id = id
            self.owner = owner
            self.createdAt = createdAt
            self.provider = provider
            self.organs = organs
            self.photoIDs = photoIDs
            self.location = location
            self.exactLocation = exactLocation
            self.results = results
            self.plantID = plantID
            self.acceptedAt = acceptedAt
            self.acceptedName = acceptedName
        }
    }

    /// `identifications.submit`: 1 to 5 photos of one plant, each as bytes (an attachment,
    /// stored through `images.put`, which checks and strips it) or as the id of a photo the
    /// person already stored. The same photos and organs again give the same identification
    /// without asking the provider again.
    public enum Submit: BusOperation {
        /// 1 to 5 photos (each a stored photo's id, or bytes of at most 25 MiB in the next
        /// attachment), where they were taken (kept exactly or coarsened), and, with the hybrid
        /// provider, whether to ask Pl@ntNet in any case.
        public struct Request: AttachmentCarrying, Sendable, Equatable {
            public var photos: [PhotoInput]
            public var location: Location?
            /// Keep the location as given instead of coarsened to about 1 km.
            public var exactLocation: Bool
            /// With the hybrid provider: ask Pl@ntNet whatever the reference matcher found.
            public var askPlantNet: Bool
            /// The photos' bytes, one per photo without a `photoID`, in order (attachments).
            public var data: [Data]

            enum CodingKeys: String, CodingKey { case photos, location, exactLocation, askPlantNet }

            public init(photos: [PhotoInput], data: [Data] = [], location: Location? = nil, exactLocation: Bool = false, askPlantNet: Bool = false) {
                self.photos = photos
                self.data = data
                self.location = location
                self.exactLocation = exactLocation
                self.askPlantNet = askPlantNet
            }

            public init(from decoder: any Decoder) throws {
                let container = try decoder.container(keyedBy: CodingKeys.self)
                photos = try container.decode([PhotoInput].self, forKey: .photos)
                location = try container.decodeIfPresent(Location.self, forKey: .location)
                exactLocation = try container.decodeIfPresent(Bool.self, forKey: .exactLocation) ?? false
                askPlantNet = try container.decodeIfPresent(Bool.self, forKey: .askPlantNet) ?? false
                data = []
            }

            public var attachments: [Data] {
                get { data }
                set { data = newValue }
            }

            /// More than ``Limits/photos`` still decode, so that validation names the limit.
            public static let attachmentCount = 0...(Limits.photos * 3)
        }

        /// The identification as recorded: its candidates, best first, and the plant id its photos
        /// are filed under.
        public typealias Reply = Record
        public static let service = Identification.service
        public static let name = "identifications.submit"
        /// The same photos and organs give the same identification, so concurrent identical
        /// submissions reach the provider once.
        public static let idempotent = true
        public static let coalescable = true
    }

    /// `identifications.accept`: add the identified plant to the person's collection (through
    /// canopy-care's `plants.add`, with the photos, the provider and the confidence), with the
    /// candidate of rank `rank` or a name the person typed. Accepting again answers the same
    /// plant.
    public enum Accept: BusOperation {
        /// The principal's identification, and either a candidate's `rank` or a typed `scientificName`
        /// (one of the two), with an optional nickname.
        public struct Request: Codable, Sendable, Equatable {
            public var id: String
            /// The chosen candidate's rank; `nil` with `scientificName`.
            public var rank: Int?
            /// A name the person typed instead of a candidate.
            public var scientificName: String?
            /// The plant's nickname, if any.
            public var customName: String?

            public init(id: String, rank: Int? = nil, scientificName: String? = nil, customName: String? = nil) {
                self.id = id
                self.rank = rank
                self.scientificName = scientificName
                self.customName = customName
            }
        }

        /// The identification, marked accepted, and the plant canopy-care holds for it.
        public struct Reply: Codable, Sendable, Equatable {
            public var identification: Record
            public var plant: Care.Plant

            public init(identification: Record, plant: Care.Plant) {
                self.identification = identification
                self.plant = plant
            }
        }

        public static let service = Identification.service
        public static let name = "identifications.accept"
        public static let idempotent = true
    }

    /// `identifications.get`.
    public enum Get: BusOperation {
        /// One of the principal's identifications; another person's is `notFound`.
        public struct Request: Codable, Sendable, Equatable {
            public var id: String
            public init(id: String) { self.id = id }
        }

        /// The identification as recorded.
        public typealias Reply = Record
        public static let service = Identification.service
        public static let name = "identifications.get"
        public static let idempotent = true
    }

    /// `identifications.history`: the person's identifications, or one plant's, newest first,
    /// a page at a time.
    public enum History: BusOperation {
        /// Whose identifications (a plant's, or all the principal's), how many, and from which cursor.
        public struct Request: Codable, Sendable, Equatable {
            /// Only this plant's (the identifications filed under it); `nil` for all.
            public var plantID: String?
            /// Page size, 1 to ``Limits/pageSize`` (default 20).
            public var limit: Int?
            /// The `next` cursor of the page before.
            public var after: String?

            public init(plantID: String? = nil, limit: Int? = nil, after: String? = nil) {
                self.plantID = plantID
                self.limit = limit
                self.after = after
            }
        }

        /// One page, newest first, and the cursor of the next page.
        public struct Reply: Codable, Sendable, Equatable {
            public var items: [Record]
            /// Pass as `after` for the next page; `nil` on the last.
            public var next: String?

            public init(items: [Record], next: String?) {
                self.items = items
                self.next = next
            }
        }

        public static let service = Identification.service
        public static let name = "identifications.history"
        public static let idempotent = true
    }

    /// `identifications.quota`: how much of Pl@ntNet's daily quota is left (for operators;
    /// the same for everyone).
    public enum Quota: BusOperation {
        /// Nothing: the quota is the service's, not a person's.
        public typealias Request = Empty

        /// The provider in use and Pl@ntNet's quota as last seen; no figures (`nil` and 0) when the
        /// service does not use Pl@ntNet.
        public struct Reply: Codable, Sendable, Equatable {
            /// The provider in use.
            public var provider: Provider
            /// Requests left today, as Pl@ntNet last said; `nil` before the first call.
            public var remaining: Int?
            /// The daily allowance configured (500 on the free plan).
            public var dailyLimit: Int
            /// When the count starts again (midnight UTC), once it ran out.
            public var resetsAt: Date?
            /// Calls made to Pl@ntNet since the service started.
            public var calls: Int

            public init(provider: Provider, remaining: Int?, dailyLimit: Int, resetsAt: Date?, calls: Int) {
                self.provider = provider
                self.remaining = remaining
                self.dailyLimit = dailyLimit
                self.resetsAt = resetsAt
                self.calls = calls
            }
        }

        public static let service = Identification.service
        public static let name = "identifications.quota"
        public static let access = Access.operator
        public static let idempotent = true
    }

    /// `account.forget`: canopy-care's follow-up when a person deletes their account: every
    /// identification of theirs, its photos' filing and features, and their submissions go.
    public enum ForgetPerson: BusOperation {
        /// Nothing: the person is the request's principal.
        public typealias Request = Empty
        /// Nothing; answered once everything of the person's is gone.
        public typealias Reply = Empty
        public static let service = Identification.service
        public static let name = "account.forget"
        public static let access = Access.service
        public static let erases = true
        public static let idempotent = true
    }

    /// `identifications.forget-plant`: forget the identifications of a deleted plant (called
    /// by canopy-care's outbox).
    public enum ForgetPlant: BusOperation {
        /// The deleted plant.
        public struct Request: Codable, Sendable, Equatable {
            public var plantID: String
            public init(plantID: String) { self.plantID = plantID }
        }

        /// Nothing.
        public typealias Reply = Empty
        public static let service = Identification.service
        public static let name = "identifications.forget-plant"
        public static let idempotent = true
        /// canopy-care's follow-up to a deleted plant; never a person's request.
        public static let access = Access.service
    }

    /// `references.add`: an operator adds reference photos of a species to the offline
    /// matcher's index, as `canopy-identify reference add` does on the store. Sent over the
    /// bus (`canopy demo` does), the change is captured with the traffic around it and
    /// replayed in its place.
    public enum AddReferences: BusOperation {
        /// The species (name, common names, family, GBIF id) and 1 to 20 photos of it as attachments.
        public struct Request: AttachmentCarrying, Sendable, Equatable {
            /// With authorship when known: "Monstera deliciosa Liebm.".
            public var scientificName: String
            public var commonNames: [String]
            public var family: String
            public var gbifID: Int?
            /// The photos (encoded images), as attachments.
            public var data: [Data]

            enum CodingKeys: String, CodingKey { case scientificName, commonNames, family, gbifID }

            public init(scientificName: String, commonNames: [String] = [], family: String = "", gbifID: Int? = nil, data: [Data]) {
                self.scientificName = scientificName
                self.commonNames = commonNames
                self.family = family
                self.gbifID = gbifID
                self.data = data
            }

            public init(from decoder: any Decoder) throws {
                let container = try decoder.container(keyedBy: CodingKeys.self)
                scientificName = try container.decode(String.self, forKey: .scientificName)
                commonNames = try container.decodeIfPresent([String].self, forKey: .commonNames) ?? []
                family = try container.decodeIfPresent(String.self, forKey: .family) ?? ""
                gbifID = try container.decodeIfPresent(Int.self, forKey: .gbifID)
                data = []
            }

            public var attachments: [Data] {
                get { data }
                set { data = newValue }
            }

            public static let attachmentCount = 1...Limits.referencePhotos
        }

        /// The species, and how many reference photos it has now.
        public struct Reply: Codable, Sendable, Equatable {
            public var scientificName: String
            /// Reference photos the species has now.
            public var photos: Int

            public init(scientificName: String, photos: Int) {
                self.scientificName = scientificName
                self.photos = photos
            }
        }

        public static let service = Identification.service
        public static let name = "references.add"
        public static let access = Access.operator
    }

    /// Field limits, in bytes or counts.
    public enum Limits {
        /// Reference photos in one `references.add`.
        public static let referencePhotos = 20
        /// Photos per submission.
        public static let photos = 5
        /// Bytes of one photo.
        public static let photoBytes = 25 * 1024 * 1024
        /// Bytes of an identification's id: every id's limit (``Care/Limits/idBytes``, the API
        /// document's `Identifier`).
        public static let idBytes = Care.Limits.idBytes
        /// Largest page of `identifications.history`.
        public static let pageSize = 100
        /// Candidates kept per identification.
        public static let candidates = 10
        /// Identifications one person keeps; past it, the oldest never accepted make room.
        public static let identificationsPerPerson = 10_000
    }
}

extension Identification.Submit.Request: Validatable {
    public func validate() throws(CanopyError) {
        guard !photos.isEmpty else { throw CanopyError(.badRequest, "photos is empty; send 1 to \(Identification.Limits.photos) photos of the same plant") }
        guard photos.count <= Identification.Limits.photos else {
            throw CanopyError(
                .tooLarge, "photos has \(photos.count) items; one identification takes at most \(Identification.Limits.photos) photos of one plant")
        }
        for (index, photo) in photos.enumerated() {
            if let id = photo.photoID, id.utf8.count != 64 || !id.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) }) {
                throw CanopyError(.badRequest, "photos[\(index)].photoID is not a photo id (64 lower-case hexadecimal characters)")
            }
        }
        let byBytes = photos.filter { $0.photoID == nil }.count
        guard byBytes == data.count else {
            throw CanopyError(.badRequest, "\(byBytes) photo(s) have no photoID, so \(byBytes) attachment(s) must carry their bytes; got \(data.count)")
        }
        for (index, bytes) in data.enumerated() {
            guard !bytes.isEmpty else { throw CanopyError(.badRequest, "attachment \(index) is empty; it must be a JPEG, PNG, WebP or HEIF photo") }
            guard bytes.count <= Identification.Limits.photoBytes else {
                throw CanopyError(.tooLarge, "attachment \(index) is \(bytes.count) bytes; a photo may be at most \(Identification.Limits.photoBytes) bytes")
            }
        }
        if let location {
            try Field.number(location.latitude, "location.latitude", -90...90)
            try Field.number(location.longitude, "location.longitude", -180...180)
        }
    }
}

extension Identification.Accept.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.identifier(id, "id", maximumBytes: Identification.Limits.idBytes)
        try Field.integer(rank, "rank", 1...Identification.Limits.candidates)
        try Field.text(scientificName, "scientificName", maximumBytes: Care.Limits.scientificNameBytes)
        try Field.text(customName, "customName", maximumBytes: Care.Limits.nameBytes)
        guard (rank == nil) != (scientificName == nil) else {
            throw CanopyError(.badRequest, "give either rank (a candidate) or scientificName (a name you typed), not both or neither")
        }
        if let scientificName, scientificName.allSatisfy(\.isWhitespace) {
            throw CanopyError(.badRequest, "scientificName must not be empty")
        }
    }
}

extension Identification.Get.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.identifier(id, "id", maximumBytes: Identification.Limits.idBytes)
    }
}

extension Identification.History.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.identifier(plantID, "plantID", maximumBytes: Care.Limits.idBytes)
        try Field.integer(limit, "limit", 1...Identification.Limits.pageSize)
        try Field.text(after, "after", maximumBytes: 200)
    }
}

extension Identification.ForgetPlant.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.identifier(plantID, "plantID", maximumBytes: Care.Limits.idBytes)
    }
}
