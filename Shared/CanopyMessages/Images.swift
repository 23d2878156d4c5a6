import Foundation

/// The operations of `canopy-images`: the image store, variants, palettes and the
/// per-plant index. Every operation but `images.stats` acts for the principal: one person
/// cannot read, list, warm or purge another person's images.
public enum Images {
    /// The service name.
    public static let service = "images"

    /// A ready-made size of a photo.
    public enum Variant: String, Codable, Sendable, CaseIterable {
        /// 150x150, cropped to fill, quality 70.
        case thumbnail
        /// Fits 800x600, quality 80.
        case gallery
        /// Full size, quality 90.
        case full
        /// Fits 400x400, quality 80: what palettes are computed from.
        case small
    }

    /// An output format.
    public enum Format: String, Codable, Sendable, CaseIterable {
        case jpeg
        case webp
    }

    /// A stored photo as its owner sees it.
    public struct Photo: Codable, Sendable, Equatable {
        /// SHA-256 of the original bytes, hex: the photo's id.
        public var sha256: String
        /// The plant it belongs to.
        public var plantID: String
        /// Size after auto-rotation.
        public var width: Int
        public var height: Int
        /// The format it arrived in (jpeg, png, webp, heif).
        public var format: String
        /// Bytes of the stored original (metadata stripped).
        public var bytes: Int
        /// When its owner added it to the plant.
        public var addedAt: Date

        /// Makes a photo record; every field is as named.
        public init(sha256: String, plantID: String, width: Int, height: Int, format: String, bytes: Int, addedAt: Date) {
            self.sha256 = sha256
            self.plantID = plantID
            self.width = width
            self.height = height
            self.format = format
            self.bytes = bytes
            self.addedAt = addedAt
        }
    }

    /// `images.put`: store a photo for a plant. The photo's bytes travel as the request's one
    /// attachment, not in the JSON.
    public enum Put: BusOperation {
        /// The principal's plant, and the photo's bytes (JPEG, PNG, WebP or HEIF). A plant holds at
        /// most 500 photos, and a person as many photos and bytes as the service allows (`tooLarge`).
        public struct Request: AttachmentCarrying, Sendable {
            public var plantID: String
            /// The photo's bytes (the attachment).
            public var data: Data
            enum CodingKeys: String, CodingKey { case plantID }
            public init(plantID: String, data: Data) {
                self.plantID = plantID
                self.data = data
            }
            public init(from decoder: any Decoder) throws {
                plantID = try decoder.container(keyedBy: CodingKeys.self).decode(String.self, forKey: .plantID)
                data = Data()
            }
            public var attachments: [Data] {
                get { [data] }
                set { data = newValue.first ?? Data() }
            }
            public static let attachmentCount = 1...1
        }
        /// The photo as stored: its SHA-256 id, its size after auto-rotation, its format and bytes.
        public typealias Reply = Photo
        public static let service = Images.service
        public static let name = "images.put"
        /// Content-addressed: storing the same photo again changes nothing.
        public static let idempotent = true
    }

    /// `images.fetch`: fetch a photo from a remote http(s) URL and store it like `images.put`.
    public enum Fetch: BusOperation {
        /// The principal's plant, and the http(s) URL of the photo; internal addresses are refused
        /// unless the operator allows the host.
        public struct Request: Codable, Sendable {
            public var plantID: String
            public var url: String
            public init(plantID: String, url: String) {
                self.plantID = plantID
                self.url = url
            }
        }
        /// The photo as stored, as `images.put` answers it.
        public typealias Reply = Photo
        public static let service = Images.service
        public static let name = "images.fetch"
        public static let idempotent = true
    }

    /// `images.variant`: a ready-made size of a photo, made on first request and cached.
    ///
    /// The variant's bytes travel as the reply's attachment. A variant larger than one frame
    /// on the bus may carry (a full-size photo of 20 MB on a broker that takes 16 MiB frames)
    /// travels in pieces: the reply holds the bytes from
    /// `offset` on, as many as fit, with `totalBytes` and `nextOffset`; the caller asks again
    /// from `nextOffset` until it is absent (`BusClient.wholeVariant` does this).
    public enum GetVariant: BusOperation {
        /// One of the principal's photos (another person's is `notFound`), the size and format wanted,
        /// and where in the variant's bytes to start.
        public struct Request: Codable, Sendable, Equatable {
            public var sha256: String
            public var variant: Variant
            public var format: Format
            /// The first byte wanted; 0 (the default) from the start.
            public var offset: Int
            enum CodingKeys: String, CodingKey { case sha256, variant, format, offset }
            public init(sha256: String, variant: Variant, format: Format = .jpeg, offset: Int = 0) {
                self.sha256 = sha256
                self.variant = variant
                self.format = format
                self.offset = offset
            }
        }
        /// The variant's size and source, and its bytes from `offset` on (the attachment), with where
        /// the next piece starts when they do not all fit.
        public struct Reply: AttachmentCarrying, Sendable, Equatable {
            public var sha256: String
            public var variant: Variant
            public var format: Format
            public var width: Int
            public var height: Int
            /// The variant's bytes from `offset` on: all of them, or one piece (the reply's one
            /// attachment, not in the JSON).
            public var data: Data
            /// Where it came from: `memory`, `disk`, `made`, or `original` (the full variant in
            /// the format the original is stored in: the stored original itself).
            public var source: String
            /// Where `data` starts in the variant.
            public var offset: Int
            /// The whole variant's size in bytes.
            public var totalBytes: Int
            /// Where the next piece starts; absent when `data` reaches the end.
            public var nextOffset: Int?
            public init(
                sha256: String, variant: Variant, format: Format, width: Int, height: Int, data: Data, source: String,
                offset: Int = 0, totalBytes: Int? = nil, nextOffset: Int? = nil
            ) {
                self.sha256 = sha256
                self.variant = variant
                self.format = format
                self.width = width
                self.height = height
                self.data = data
                self.source = source
                self.offset = offset
                self.totalBytes = totalBytes ?? data.count
                self.nextOffset = nextOffset
            }
            enum CodingKeys: String, CodingKey { case sha256, variant, format, width, height, source, offset, totalBytes, nextOffset }
            public init(from decoder: any Decoder) throws {
                let container = try decoder.container(keyedBy: CodingKeys.self)
                sha256 = try container.decode(String.self, forKey: .sha256)
                variant = try container.decode(Variant.self, forKey: .variant)
                format = try container.decode(Format.self, forKey: .format)
                width = try container.decode(Int.self, forKey: .width)
                height = try container.decode(Int.self, forKey: .height)
                source = try container.decode(String.self, forKey: .source)
                offset = try container.decode(Int.self, forKey: .offset)
                totalBytes = try container.decode(Int.self, forKey: .totalBytes)
                nextOffset = try container.decodeIfPresent(Int.self, forKey: .nextOffset)
                data = Data()
            }
            public var attachments: [Data] {
                get { [data] }
                set { data = newValue.first ?? Data() }
            }
            public static let attachmentCount = 1...1
        }
        public static let service = Images.service
        public static let name = "images.variant"
        public static let idempotent = true
        public static let coalescable = true
    }

    /// One colour of a palette.
    public struct Swatch: Codable, Sendable, Equatable {
        /// vibrant, muted, darkVibrant, darkMuted, lightVibrant, lightMuted, or other.
        public var role: String
        /// `#rrggbb`.
        public var hex: String
        /// Share of the photo's pixels near this colour, 0 to 1.
        public var population: Double
        /// OKLab lightness, a, b.
        public var oklab: [Double]
        public init(role: String, hex: String, population: Double, oklab: [Double]) {
            self.role = role
            self.hex = hex
            self.population = population
            self.oklab = oklab
        }
    }

    /// `images.palette`: the dominant colours of a photo, by role.
    public enum Palette: BusOperation {
        /// One of the principal's photos, by SHA-256; another person's is `notFound`.
        public struct Request: Codable, Sendable, Equatable {
            public var sha256: String
            public init(sha256: String) { self.sha256 = sha256 }
        }
        /// The photo's colours by role, most populous first, and whether they were cached.
        public struct Reply: Codable, Sendable, Equatable {
            public var sha256: String
            /// Most populous first: the first is the dominant colour.
            public var swatches: [Swatch]
            /// Whether it came from the palette cache.
            public var cached: Bool
            public init(sha256: String, swatches: [Swatch], cached: Bool) {
                self.sha256 = sha256
                self.swatches = swatches
                self.cached = cached
            }
        }
        public static let service = Images.service
        public static let name = "images.palette"
        public static let idempotent = true
        public static let coalescable = true
    }

    /// `images.list`: the photos of one of the principal's plants, newest first.
    public enum List: BusOperation {
        /// One of the principal's plants.
        public struct Request: Codable, Sendable {
            public var plantID: String
            public init(plantID: String) { self.plantID = plantID }
        }
        /// The plant's photos, newest first; none for a plant without photos.
        public typealias Reply = [Photo]
        public static let service = Images.service
        public static let name = "images.list"
        public static let idempotent = true
    }

    /// `account.forget`: canopy-care's follow-up when a person deletes their account: every
    /// photo of theirs is purged as a deleted plant's are.
    public enum ForgetPerson: BusOperation {
        /// Nothing: the person is the request's principal.
        public typealias Request = Empty
        /// Nothing; answered once every photo of theirs is purged.
        public typealias Reply = Empty
        public static let service = Images.service
        public static let name = "account.forget"
        public static let access = Access.service
        public static let erases = true
        public static let idempotent = true
    }

    /// `images.purge`: forget a plant's photos (or, with `sha256`, one of them); originals
    /// nobody else holds are deleted with their variants and palettes, from memory and disk.
    public enum Purge: BusOperation {
        /// The principal's plant, and optionally the one photo of it to forget.
        public struct Request: Codable, Sendable {
            public var plantID: String
            /// Only this photo of the plant; all of them when absent.
            public var sha256: String?
            public init(plantID: String, sha256: String? = nil) {
                self.plantID = plantID
                self.sha256 = sha256
            }
        }
        /// Only what concerns the caller: how many of *their* photos were removed. Whether
        /// the original was deleted too depends on whether someone else holds the same bytes,
        /// which is not the caller's to know.
        public struct Reply: Codable, Sendable, Equatable {
            public var photos: Int
            public init(photos: Int) {
                self.photos = photos
            }
        }
        public static let service = Images.service
        public static let name = "images.purge"
        public static let idempotent = true
        /// canopy-care's follow-up to a deleted plant, canopy-identify's to a failed identification; never a person's request.
        public static let access = Access.service
    }

    /// `images.warm`: make variants ahead of time, with bounded concurrency.
    public enum Warm: BusOperation {
        /// At most 1,000 of the principal's photos (one not theirs is `notFound`), the variants to
        /// make (default thumbnail and gallery), and the format.
        public struct Request: Codable, Sendable {
            public var sha256s: [String]
            public var variants: [Variant]
            public var format: Format
            public init(sha256s: [String], variants: [Variant] = [.thumbnail, .gallery], format: Format = .jpeg) {
                self.sha256s = sha256s
                self.variants = variants
                self.format = format
            }
        }
        /// How many variants were made now, and how many were cached already.
        public struct Reply: Codable, Sendable, Equatable {
            public var made: Int
            public var alreadyCached: Int
            public init(made: Int, alreadyCached: Int) {
                self.made = made
                self.alreadyCached = alreadyCached
            }
        }
        public static let service = Images.service
        public static let name = "images.warm"
        public static let idempotent = true
    }

    /// One cache tier's figures.
    public struct TierStatistics: Codable, Sendable, Equatable {
        public var entries: Int
        public var bytes: Int
        public var limitBytes: Int
        public var hits: UInt64
        public var misses: UInt64
        public var evictions: UInt64
        public var hitRatio: Double
        public init(entries: Int, bytes: Int, limitBytes: Int, hits: UInt64, misses: UInt64, evictions: UInt64) {
            self.entries = entries
            self.bytes = bytes
            self.limitBytes = limitBytes
            self.hits = hits
            self.misses = misses
            self.evictions = evictions
            self.hitRatio = hits + misses == 0 ? 0 : Double(hits) / Double(hits + misses)
        }
    }

    /// `images.stats`: the caches and the store.
    public enum Stats: BusOperation {
        /// Nothing: the figures are the whole service's, not a person's.
        public typealias Request = Empty
        /// The memory and disk tiers' figures, the originals stored (count and bytes), the palettes
        /// stored, and the memory pressure now.
        public struct Reply: Codable, Sendable, Equatable {
            public var memory: TierStatistics
            public var disk: TierStatistics
            public var originals: Int
            public var originalBytes: Int
            public var palettes: Int
            /// normal, warning, urgent or critical.
            public var memoryPressure: String
            public init(memory: TierStatistics, disk: TierStatistics, originals: Int, originalBytes: Int, palettes: Int, memoryPressure: String) {
                self.memory = memory
                self.disk = disk
                self.originals = originals
                self.originalBytes = originalBytes
                self.palettes = palettes
                self.memoryPressure = memoryPressure
            }
        }
        public static let service = Images.service
        public static let name = "images.stats"
        public static let access = Access.operator
        public static let idempotent = true
    }
}

extension Images.GetVariant.Request {
    /// `format` defaults to JPEG, `offset` to 0.
    public init(from decoder: any Decoder) throws {
        let values = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            sha256: try values.decode(String.self, forKey: .sha256), variant: try values.decode(Images.Variant.self, forKey: .variant),
            format: try values.decodeIfPresent(Images.Format.self, forKey: .format) ?? .jpeg,
            offset: try values.decodeIfPresent(Int.self, forKey: .offset) ?? 0)
    }

    /// Encodes `offset` only when it is not 0, so a whole-variant request keeps the bytes it
    /// always had (and coalesces with requests from older callers).
    public func encode(to encoder: any Encoder) throws {
        var values = encoder.container(keyedBy: CodingKeys.self)
        try values.encode(sha256, forKey: .sha256)
        try values.encode(variant, forKey: .variant)
        try values.encode(format, forKey: .format)
        if offset != 0 { try values.encode(offset, forKey: .offset) }
    }
}

extension Images.GetVariant.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.integer(offset, "offset", 0...Int(Int32.max))
    }
}

extension Images.Warm.Request {
    /// `variants` default to thumbnail and gallery, `format` to JPEG.
    public init(from decoder: any Decoder) throws {
        let values = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            sha256s: try values.decode([String].self, forKey: .sha256s),
            variants: try values.decodeIfPresent([Images.Variant].self, forKey: .variants) ?? [.thumbnail, .gallery],
            format: try values.decodeIfPresent(Images.Format.self, forKey: .format) ?? .jpeg)
    }
}
