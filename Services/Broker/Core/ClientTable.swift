/// The requests held now by the client's name for them, (routing identity, correlation id),
/// to the waiter's id: a request is looked up once when it arrives (the same request again is
/// not run twice), entered when it becomes a waiter, and removed when it is answered. Its key
/// is hashed **once** per request, with `Hasher` (SipHash, seeded per process: the keys are
/// the peers' own, so an unkeyed hash would let a peer aim them at one bucket), and the hash is
/// kept with the waiter, so entering and removing hash nothing again (a `Dictionary` hashed
/// the key three times a request).
///
/// Open addressing with linear probing, deletion by backward shift, growth at half full and
/// shrinking at an eighth, like ``IDTable``. Owned by the broker's loop.
package struct ClientTable {
    private struct Entry {
        var hash: Int
        var id: UInt64 // 0: empty
        var client: [UInt8]
        var correlation: [UInt8]
    }

    private var entries: [Entry]
    private var bits: Int
    private let minimumBits: Int
    /// Entries held.
    package private(set) var count = 0

    package init(capacity: Int = 1_024) {
        bits = max(4, Int.bitWidth - (max(capacity, 8) * 2 - 1).leadingZeroBitCount)
        minimumBits = bits
        entries = Array(repeating: Entry(hash: 0, id: 0, client: [], correlation: []), count: 1 << bits)
    }

    /// The hash of a client's name for a request, computed once per request.
    package static func hash(client: [UInt8], correlation: [UInt8]) -> Int {
        var hasher = Hasher()
        hasher.combine(client.count)
        client.withUnsafeBytes { hasher.combine(bytes: $0) }
        correlation.withUnsafeBytes { hasher.combine(bytes: $0) }
        return hasher.finalize()
    }

    private var mask: Int { (1 << bits) - 1 }
    /// Slots in the table now.
    package var slots: Int { entries.count }
    private func home(_ hash: Int) -> Int { Int(truncatingIfNeeded: UInt(bitPattern: hash) >> UInt(Int.bitWidth - bits)) }

    /// The waiter held under (`client`, `correlation`), whose hash is `hash`.
    package func find(hash: Int, client: [UInt8], correlation: [UInt8]) -> UInt64? {
        var index = home(hash)
        while entries[index].id != 0 {
            if entries[index].hash == hash, entries[index].correlation == correlation, entries[index].client == client { return entries[index].id }
            index = (index + 1) & mask
        }
        return nil
    }

    /// Enters waiter `id` (not held yet: ``find(hash:client:correlation:)`` said so).
    package mutating func insert(hash: Int, client: [UInt8], correlation: [UInt8], id: UInt64) {
        precondition(id != 0, "waiter ids start at 1")
        if (count + 1) * 2 > entries.count { resize(bits: bits + 1) }
        var index = home(hash)
        while entries[index].id != 0 { index = (index + 1) & mask }
        entries[index] = Entry(hash: hash, id: id, client: client, correlation: correlation)
        count += 1
    }

    /// Removes waiter `id`, entered with `hash`; nothing when it is not there.
    package mutating func remove(hash: Int, id: UInt64) {
        var hole = home(hash)
        while entries[hole].id != id {
            guard entries[hole].id != 0 else { return }
            hole = (hole + 1) & mask
        }
        entries[hole] = Entry(hash: 0, id: 0, client: [], correlation: [])
        count -= 1
        // Backward shift: pull later entries of the probe run into the hole, so each stays
        // reachable from its home slot without tombstones.
        var next = (hole + 1) & mask
        while entries[next].id != 0 {
            let wanted = home(entries[next].hash)
            let inRange = hole <= next ? (hole < wanted && wanted <= next) : (hole < wanted || wanted <= next)
            if !inRange {
                entries.swapAt(hole, next)
                hole = next
            }
            next = (next + 1) & mask
        }
        if bits > minimumBits, count * 8 < entries.count { resize(bits: bits - 1) }
    }

    private mutating func resize(bits newBits: Int) {
        let old = entries
        bits = newBits
        entries = Array(repeating: Entry(hash: 0, id: 0, client: [], correlation: []), count: 1 << bits)
        count = 0
        for entry in old where entry.id != 0 {
            insert(hash: entry.hash, client: entry.client, correlation: entry.correlation, id: entry.id)
        }
    }
}
