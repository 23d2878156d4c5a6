/// The requests held now by the client's name for them, (routing identity, correlation id),
/// to the waiter's id: a request is looked up once when it arrives (the same request again is
/// not run twice), entered when it becomes a waiter, and removed when it is answered. Its key
/// is hashed **once** per request, with `Hasher` (SipHash, seeded per process: the keys are
/// the peers' own, so an unkeyed hash would let a peer aim them at one bucket), and the hash is
/// kept with the waiter, so entering and removing hash nothing again. An ``OpenTable`` of
/// these entries. Owned by the broker's loop.
package struct ClientTable {
    package struct Entry: OpenTableEntry {
        package var hash: Int
        var id: UInt64 // 0: empty
        var client: [UInt8]
        var correlation: [UInt8]

        package static var vacant: Entry { Entry(hash: 0, id: 0, client: [], correlation: []) }
        package var isVacant: Bool { id == 0 }
    }

    private var table: OpenTable<Entry>

    package init(capacity: Int = 1_024) {
        table = OpenTable(capacity: capacity)
    }

    /// Entries held.
    package var count: Int { table.count }

    /// Slots in the table now.
    package var slots: Int { table.slots }

    /// The hash of a client's name for a request, computed once per request.
    package static func hash(client: [UInt8], correlation: [UInt8]) -> Int {
        var hasher = Hasher()
        hasher.combine(client.count)
        client.withUnsafeBytes { hasher.combine(bytes: $0) }
        correlation.withUnsafeBytes { hasher.combine(bytes: $0) }
        return hasher.finalize()
    }

    /// The waiter held under (`client`, `correlation`), whose hash is `hash`.
    package func find(hash: Int, client: [UInt8], correlation: [UInt8]) -> UInt64? {
        table.slot(hash: hash) { $0.correlation == correlation && $0.client == client }.map { table[slot: $0].id }
    }

    /// Enters waiter `id` (not held yet: ``find(hash:client:correlation:)`` said so).
    package mutating func insert(hash: Int, client: [UInt8], correlation: [UInt8], id: UInt64) {
        precondition(id != 0, "waiter ids start at 1")
        table.insert(Entry(hash: hash, id: id, client: client, correlation: correlation))
    }

    /// Removes waiter `id`, entered with `hash`; nothing when it is not there.
    package mutating func remove(hash: Int, id: UInt64) {
        guard let slot = table.slot(hash: hash, where: { $0.id == id }) else { return }
        table.remove(slot: slot)
    }
}
