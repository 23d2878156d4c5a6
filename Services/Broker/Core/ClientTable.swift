/// An index from a key hashed once by its owner to the id of the record it names, the key
/// itself staying with the record: a look-up asks the owner whether the record of an entry with
/// the same hash has that key. Entries are two integers, so they move (the table's backward
/// shift, its growth) without reference counting. An ``OpenTable`` of ``HashedID`` entries;
/// owned by the broker's loop.
///
/// Two indexes are this table: ``ClientTable`` (the requests held by the client's name for
/// them) and the coalescable flights that still take joiners, by their key's digest
/// (``BrokerState/FlightTable``).
package struct HashIndex {
    package typealias Entry = HashedID

    private var table: OpenTable<Entry>

    package init(capacity: Int = 1_024) {
        table = OpenTable(capacity: capacity)
    }

    /// Entries held.
    package var count: Int { table.count }

    /// Slots in the table now.
    package var slots: Int { table.slots }

    /// The record held under a key whose hash is `hash`: the first entry with that hash whose
    /// record `isNamed` says carries the key.
    package func find(hash: Int, where isNamed: (UInt64) -> Bool) -> UInt64? {
        table.slot(hash: hash) { isNamed($0.id) }.map { table[slot: $0].id }
    }

    /// Enters record `id` under a key whose hash is `hash` (not held yet: ``find(hash:where:)``
    /// said so).
    package mutating func insert(hash: Int, id: UInt64) {
        precondition(id != 0, "ids start at 1")
        table.insert(Entry(hash: hash, id: id))
    }

    /// Removes record `id`, entered with `hash`; nothing when it is not there.
    package mutating func remove(hash: Int, id: UInt64) {
        guard let slot = table.slot(hash: hash, where: { $0.id == id }) else { return }
        table.remove(slot: slot)
    }
}

/// The requests held now by the client's name for them, (routing identity, correlation id),
/// to the waiter's id: a request is looked up once when it arrives (the same request again is
/// not run twice), entered when it becomes a waiter, and removed when it is answered. Its key
/// is hashed **once** per request, with `Hasher` (SipHash, seeded per process: the keys are
/// the peers' own, so an unkeyed hash would let a peer aim them at one bucket), and the hash is
/// kept with the waiter, so entering and removing hash nothing again.
package typealias ClientTable = HashIndex

extension HashIndex {
    /// The hash of a client's name for a request, computed once per request.
    package static func hash(client: [UInt8], correlation: [UInt8]) -> Int {
        var hasher = Hasher()
        hasher.combine(client.count)
        client.withUnsafeBytes { hasher.combine(bytes: $0) }
        correlation.withUnsafeBytes { hasher.combine(bytes: $0) }
        return hasher.finalize()
    }
}
