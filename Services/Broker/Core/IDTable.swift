/// A hash table for the ids the broker hands out itself (waiters, flights): open addressing
/// with linear probing and a multiplicative hash, deletion by backward shift, growth at half
/// full and shrinking at an eighth (so its memory follows what it holds after a burst). It replaces `Dictionary<UInt64, Value>` on the broker's hot path, where SipHash's
/// seeding and finalizing showed in the profile. A fast, unkeyed hash is safe here because
/// no peer chooses these keys: ids count up from 1 (keys a peer sends, such as its
/// correlation ids, stay in `Dictionary`).
///
/// Not thread-safe; owned by the broker's loop like the rest of ``BrokerState``.
package struct IDTable<Value> {
    /// 0 marks an empty slot (ids start at 1).
    private var keys: [UInt64]
    private var values: [Value?]
    private var bits: Int
    /// Entries held.
    package private(set) var count = 0
    /// The table never shrinks below its starting size.
    private let minimumSlots: Int

    /// An empty table with room for `capacity` entries before it grows.
    package init(capacity: Int = 64) {
        bits = max(4, Int.bitWidth - (max(capacity, 8) * 2 - 1).leadingZeroBitCount)
        keys = Array(repeating: 0, count: 1 << bits)
        values = Array(repeating: nil, count: 1 << bits)
        minimumSlots = 1 << bits
    }

    /// Slots in the table now (it grows at half full and shrinks at an eighth).
    package var slots: Int { keys.count }

    private var mask: Int { (1 << bits) - 1 }

    private func home(_ id: UInt64) -> Int {
        Int(truncatingIfNeeded: (id &* 0x9E37_79B9_7F4A_7C15) >> UInt64(64 - bits))
    }

    /// The slot holding `id`, or `nil`.
    private func find(_ id: UInt64) -> Int? {
        var index = home(id)
        while keys[index] != 0 {
            if keys[index] == id { return index }
            index = (index + 1) & mask
        }
        return nil
    }

    package subscript(id: UInt64) -> Value? {
        get { find(id).flatMap { values[$0] } }
        set {
            guard let newValue else {
                removeValue(forKey: id)
                return
            }
            precondition(id != 0, "IDTable keys start at 1")
            if let index = find(id) {
                values[index] = newValue
                return
            }
            if (count + 1) * 2 > keys.count { grow() }
            var index = home(id)
            while keys[index] != 0 { index = (index + 1) & mask }
            keys[index] = id
            values[index] = newValue
            count += 1
        }
    }

    /// Every id held, in no particular order.
    package var ids: [UInt64] { keys.filter { $0 != 0 } }

    /// Removes `id`'s entry and returns its value, or `nil` when there was none.
    @discardableResult
    package mutating func removeValue(forKey id: UInt64) -> Value? {
        guard var hole = find(id) else { return nil }
        let removed = values[hole]
        keys[hole] = 0
        values[hole] = nil
        count -= 1
        // Backward shift: pull later entries of the same probe run into the hole, so every
        // entry stays reachable from its home slot without tombstones.
        var next = (hole + 1) & mask
        while keys[next] != 0 {
            let wanted = home(keys[next])
            // Move `next` into the hole unless its home lies cyclically in (hole, next].
            let inRange = hole <= next ? (hole < wanted && wanted <= next) : (hole < wanted || wanted <= next)
            if !inRange {
                keys[hole] = keys[next]
                values[hole] = values[next]
                keys[next] = 0
                values[next] = nil
                hole = next
            }
            next = (next + 1) & mask
        }
        // After a burst, give the slots back: an eighth full and larger than the start.
        if keys.count > minimumSlots, count * 8 < keys.count { resize(bits: bits - 1) }
        return removed
    }

    private mutating func grow() { resize(bits: bits + 1) }

    /// Rebuilds the table with `1 << bits` slots.
    private mutating func resize(bits newBits: Int) {
        let (oldKeys, oldValues) = (keys, values)
        bits = newBits
        keys = Array(repeating: 0, count: 1 << bits)
        values = Array(repeating: nil, count: 1 << bits)
        count = 0
        for index in oldKeys.indices where oldKeys[index] != 0 {
            self[oldKeys[index]] = oldValues[index]
        }
    }
}
