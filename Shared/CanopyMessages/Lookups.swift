import Foundation

/// Multi-key lookups: several keys of one kind, possibly for several people, in one bus
/// request. canopy-api gathers the lookups its callers make within a short window (for
/// example the 100 thumbnails and 100 next tasks of a collection screen, from many apps at
/// once) and sends them as one of these; each key names the person it is looked up for, and
/// the service checks that person's rights to that key alone, so each key's answer is its
/// own value or its own error, never another key's.
///
/// A request that carries a principal in its header (made for one person) may only name that
/// person in its keys; one made without (the edge, for several people) names each key's.
public enum Lookup {
    /// The most keys in one request (one reply carries at most 64 attachments).
    public static let maximumKeys = 64

    /// One key's answer: its value, or its own error.
    public struct Result<Value: Codable & Sendable & Equatable>: Codable, Sendable, Equatable {
        public var value: Value?
        public var error: CanopyError?

        public init(value: Value) {
            self.value = value
            self.error = nil
        }

        public init(error: CanopyError) {
            self.value = nil
            self.error = error
        }

        /// The value, or the key's error thrown.
        public func get() throws(CanopyError) -> Value {
            if let value { return value }
            throw error ?? CanopyError(.internal, "the service answered this key with neither a value nor an error")
        }
    }

    /// Checks the list of keys: 1 to ``maximumKeys``, each with a valid principal.
    static func validate<Key>(_ keys: [Key], principal: KeyPath<Key, String>) throws(CanopyError) {
        guard !keys.isEmpty else { throw CanopyError(.badRequest, "keys must name at least one key") }
        try Field.list(keys, "keys", maximumCount: maximumKeys) { key, name throws(CanopyError) in
            try Field.principal(key[keyPath: principal], "\(name).principal")
        }
    }
}

extension Images {
    /// `images.variants`: several whole variants (of photos of several people) in one call,
    /// each checked against its own key's principal.
    ///
    /// The reply holds one result per key, in order, and one attachment per key answered with
    /// a value, in the same order. Keys whose bytes would not fit in the reply (the bus's
    /// frame limit) are answered `tooLarge`: ask `images.variant` for those, which sends large
    /// variants in pieces.
    public enum GetVariants: BusOperation {
        /// One variant to look up: a photo (by SHA-256) of the person named, in a size and format.
        public struct Key: Codable, Sendable, Equatable, Hashable {
            /// The person the variant is looked up for.
            public var principal: String
            public var sha256: String
            public var variant: Variant
            public var format: Format
            public init(principal: String, sha256: String, variant: Variant, format: Format = .jpeg) {
                self.principal = principal
                self.sha256 = sha256
                self.variant = variant
                self.format = format
            }
        }
        /// 1 to 64 keys, each naming its person; in a request made for one person, a key naming
        /// another is refused.
        public struct Request: Codable, Sendable, Equatable, Validatable {
            public var keys: [Key]
            public init(keys: [Key]) { self.keys = keys }
            public func validate() throws(CanopyError) { try Lookup.validate(keys, principal: \.principal) }
        }
        /// A found variant, but for its bytes (the reply's attachments).
        public struct Found: Codable, Sendable, Equatable {
            public var width: Int
            public var height: Int
            /// `memory`, `disk`, `made` or `original`, as `images.variant` says.
            public var source: String
            public var bytes: Int
            public init(width: Int, height: Int, source: String, bytes: Int) {
                self.width = width
                self.height = height
                self.source = source
                self.bytes = bytes
            }
        }
        /// One result per key, and each found variant's bytes as an attachment; ``variants(for:)``
        /// pairs them up again.
        public struct Reply: AttachmentCarrying, Sendable, Equatable {
            /// One per key, in the request's order.
            public var results: [Lookup.Result<Found>]
            /// The bytes of each result with a value, in order.
            public var attachments: [Data]
            enum CodingKeys: String, CodingKey { case results }
            public init(results: [Lookup.Result<Found>], attachments: [Data]) {
                self.results = results
                self.attachments = attachments
            }
            public init(from decoder: any Decoder) throws {
                results = try decoder.container(keyedBy: CodingKeys.self).decode([Lookup.Result<Found>].self, forKey: .results)
                attachments = []
            }
            public static let attachmentCount = 0...Lookup.maximumKeys

            /// Each key's answer with its bytes: a whole variant, or the key's error.
            public func variants(for keys: [Key]) throws(CanopyError) -> [Result<GetVariant.Reply, CanopyError>] {
                guard results.count == keys.count, results.count(where: { $0.value != nil }) == attachments.count else {
                    throw CanopyError(
                        .internal, "images.variants answered \(results.count) results and \(attachments.count) attachments for \(keys.count) keys")
                }
                var next = attachments.makeIterator()
                return zip(keys, results).map { key, result in
                    guard let found = result.value else { return .failure(result.error ?? CanopyError(.internal, "a result without a value or an error")) }
                    let data = next.next()!
                    return .success(
                        GetVariant.Reply(
                            sha256: key.sha256, variant: key.variant, format: key.format, width: found.width,
                            height: found.height, data: data, source: found.source))
                }
            }
        }
        public static let service = Images.service
        public static let name = "images.variants"
        public static let access = Access.perKey
        public static let idempotent = true
    }
}

extension Care {
    /// `care.tasks.next`: the next task of several plants (of several people) in one call,
    /// each checked against its own key's principal: a plant that is not that person's is
    /// `notFound`, whoever else it belongs to.
    public enum NextTasks: BusOperation {
        /// One plant to look up, and the person it is looked up for.
        public struct Key: Codable, Sendable, Equatable, Hashable {
            /// The person the plant is looked up for.
            public var principal: String
            public var plantID: String
            public init(principal: String, plantID: String) {
                self.principal = principal
                self.plantID = plantID
            }
        }
        /// 1 to 64 keys, each naming its person and a plant id; in a request made for one person, a
        /// key naming another is refused.
        public struct Request: Codable, Sendable, Equatable, Validatable {
            public var keys: [Key]
            public init(keys: [Key]) { self.keys = keys }
            public func validate() throws(CanopyError) {
                try Lookup.validate(keys, principal: \.principal)
                for (index, key) in keys.enumerated() { try Field.identifier(key.plantID, "keys[\(index)].plantID", maximumBytes: Care.Limits.idBytes) }
            }
        }
        /// A plant's next task: the one that shows soonest; absent when it has none.
        public struct Next: Codable, Sendable, Equatable {
            public var task: Task?
            public init(task: Task?) { self.task = task }
        }
        /// One result per key: the plant's next task, or the key's own error.
        public struct Reply: Codable, Sendable, Equatable {
            /// One per key, in the request's order.
            public var results: [Lookup.Result<Next>]
            public init(results: [Lookup.Result<Next>]) { self.results = results }
        }
        public static let service = Care.service
        public static let name = "tasks.next"
        public static let access = Access.perKey
        public static let idempotent = true
    }
}
