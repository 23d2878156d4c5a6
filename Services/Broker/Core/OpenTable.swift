/// An entry of an ``OpenTable``: what a slot holds, and the hash its home slot comes from.
package protocol OpenTableEntry {
    /// What an empty slot holds.
    static var vacant: Self { get }
    /// Whether the slot holds nothing.
    var isVacant: Bool { get }
    /// The entry's hash: its top bits pick the home slot, so they must be well mixed.
    var hash: Int { get }
}

/// An ``OpenTable`` entry: a key's hash, computed once by the key's owner, and the id of the
/// record holding the key (``HashIndex``).
package struct HashedID: OpenTableEntry {
    package var hash: Int
    /// 0 marks an empty slot (ids start at 1).
    package var id: UInt64

    package static var vacant: HashedID { HashedID(hash: 0, id: 0) }
    package var isVacant: Bool { id == 0 }
}

/// The one hash table of the broker's hot path: open addressing with linear probing, deletion
/// by backward shift (no tombstones), growth at half full and shrinking at an eighth (never
/// below its starting size, so its memory follows what it holds after a burst). Entries are
/// plain values in one array; a key is hashed once by its owner and kept in its entry, so
/// finding, entering and removing hash nothing again. ``IDTable`` (ids the broker hands out),
/// ``ClientTable`` (clients' names for their requests) and the coalescable flights' index are
/// this table with their entries.
///
/// Not thread-safe; owned by the broker's loop like the rest of ``BrokerState``.
package struct OpenTable<Entry: OpenTableEntry> {
    private var entries: [Entry]
    private var bits: Int
    private let minimumBits: Int
    /// Entries held.
    package private(set) var count = 0

    /// An empty table with room for `capacity` entries before it grows.
    package init(capacity: Int) {
        bits = max(4, Int.bitWidth - (max(capacity, 8) * 2 - 1).leadingZeroBitCount)
        minimumBits = bits
        entries = Array(repeating: .vacant, count: 1 << bits)
    }

    /// Slots in the table now.
    package var slots: Int { entries.count }

    private var mask: Int { (1 << bits) - 1 }

    private func home(_ hash: Int) -> Int { Int(truncatingIfNeeded: UInt(bitPattern: hash) >> UInt(Int.bitWidth - bits)) }

    /// The slot of the entry with `hash` that `matches`, or nil.
    package func slot(hash: Int, where matches: (Entry) -> Bool) -> Int? {
        var index = home(hash)
        while !entries[index].isVacant {
            if entries[index].hash == hash, matches(entries[index]) { return index }
            index = (index + 1) & mask
        }
        return nil
    }

    /// The entry in `slot` (from ``slot(hash:where:)``); set it to change its value in place
    /// (its hash must stay the same).
    package subscript(slot slot: Int) -> Entry {
        get { entries[slot] }
        _modify { yield &entries[slot] }
    }

    /// Enters `entry`, which the table does not hold yet.
    package mutating func insert(_ entry: Entry) {
        if (count + 1) * 2 > entries.count { resize(bits: bits + 1) }
        var index = home(entry.hash)
        while !entries[index].isVacant { index = (index + 1) & mask }
        entries[index] = entry
        count += 1
    }

    /// Removes the entry in `slot` and returns it.
    @discardableResult
    package mutating func remove(slot: Int) -> Entry {
        var hole = slot
        let removed = entries[hole]
        entries[hole] = .vacant
        count -= 1
        // Backward shift: pull later entries of the probe run into the hole, so each stays
        // reachable from its home slot without tombstones.
        var next = (hole + 1) & mask
        while !entries[next].isVacant {
            let wanted = home(entries[next].hash)
            // Move `next` into the hole unless its home lies cyclically in (hole, next].
            let inRange = hole <= next ? (hole < wanted && wanted <= next) : (hole < wanted || wanted <= next)
            if !inRange {
                entries.swapAt(hole, next)
                hole = next
            }
            next = (next + 1) & mask
        }
        if bits > minimumBits, count * 8 < entries.count { resize(bits: bits - 1) }
        return removed
    }

    /// Every entry held, in no particular order.
    package var all: [Entry] { entries.filter { !$0.isVacant } }

    /// Rebuilds the table with `1 << bits` slots.
    private mutating func resize(bits newBits: Int) {
        let old = entries
        bits = newBits
        entries = Array(repeating: .vacant, count: 1 << bits)
        count = 0
        for entry in old where !entry.isVacant { insert(entry) }
    }
}
