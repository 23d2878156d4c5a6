/// A hash table for the ids the broker hands out itself (a worker's flights, by their
/// ``SlabHandle``): an ``OpenTable`` whose entries hash their id with a multiplicative hash. It
/// replaces `Dictionary<UInt64, Value>` on the broker's hot path, where SipHash's seeding and
/// finalizing showed in the profile. A fast, unkeyed hash is safe here because no peer chooses
/// these keys: the broker makes them (keys a peer sends, such as its correlation ids, are hashed
/// with `Hasher` in ``ClientTable``).
///
/// Not thread-safe; owned by the broker's loop like the rest of ``BrokerState``.
package struct IDTable<Value> {
    package struct Entry: OpenTableEntry {
        /// 0 marks an empty slot (ids start at 1).
        var id: UInt64
        var value: Value?

        package static var vacant: Entry { Entry(id: 0, value: nil) }
        package var isVacant: Bool { id == 0 }
        package var hash: Int { IDTable.hash(id) }
    }

    private var table: OpenTable<Entry>

    /// An empty table with room for `capacity` entries before it grows.
    package init(capacity: Int = 64) {
        table = OpenTable(capacity: capacity)
    }

    /// Entries held.
    package var count: Int { table.count }

    /// Slots in the table now (it grows at half full and shrinks at an eighth).
    package var slots: Int { table.slots }

    /// Fibonacci hashing: the top bits of the product are well mixed.
    static func hash(_ id: UInt64) -> Int { Int(bitPattern: UInt(truncatingIfNeeded: id &* 0x9E37_79B9_7F4A_7C15)) }

    private func slot(_ id: UInt64) -> Int? { table.slot(hash: Self.hash(id)) { $0.id == id } }

    package subscript(id: UInt64) -> Value? {
        get { slot(id).flatMap { table[slot: $0].value } }
        set {
            guard let newValue else {
                removeValue(forKey: id)
                return
            }
            precondition(id != 0, "IDTable keys start at 1")
            if let slot = slot(id) {
                table[slot: slot].value = newValue
            } else {
                table.insert(Entry(id: id, value: newValue))
            }
        }
    }

    /// Every id held, in no particular order.
    package var ids: [UInt64] { table.all.map(\.id) }

    /// Removes `id`'s entry and returns its value, or `nil` when there was none.
    @discardableResult
    package mutating func removeValue(forKey id: UInt64) -> Value? {
        guard let slot = slot(id) else { return nil }
        return table.remove(slot: slot).value
    }
}
