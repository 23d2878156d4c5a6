/// A least-recently-used cache bounded by total cost (bytes) and entry count. Pure and
/// O(1) per operation: a dictionary into a doubly linked list kept in arrays.
///
/// Not thread-safe; its owner (an actor) serialises access.
struct LRUCache<Key: Hashable, Value> {
    private struct Node {
        var key: Key
        var value: Value
        var cost: Int
        var newer: Int?
        var older: Int?
    }

    /// Most total cost held.
    private(set) var costLimit: Int
    /// Most entries held.
    let countLimit: Int
    private var nodes: [Node?] = []
    private var free: [Int] = []
    private var index: [Key: Int] = [:]
    private var newest: Int?
    private var oldest: Int?
    /// Total cost held now.
    private(set) var totalCost = 0
    /// Entries evicted to make room (not removals asked for).
    private(set) var evictions: UInt64 = 0

    /// - Parameters:
    ///   - costLimit: most total cost (bytes) held.
    ///   - countLimit: most entries held.
    init(costLimit: Int, countLimit: Int = .max) {
        self.costLimit = costLimit
        self.countLimit = countLimit
    }

    var count: Int { index.count }

    /// The value, now the most recently used.
    mutating func value(for key: Key) -> Value? {
        guard let slot = index[key] else { return nil }
        moveToFront(slot)
        return nodes[slot]!.value
    }

    /// Whether the key is held, without touching its recency.
    func contains(_ key: Key) -> Bool { index[key] != nil }

    /// Adds or replaces an entry, then evicts the least recently used until within limits.
    /// An entry costing more than the whole limit is not kept. Returns what was evicted.
    @discardableResult
    mutating func insert(_ value: Value, for key: Key, cost: Int) -> [(key: Key, value: Value)] {
        if index[key] != nil { remove(key) }
        guard cost <= costLimit, countLimit > 0 else { return [] }
        let node = Node(key: key, value: value, cost: cost, newer: nil, older: newest)
        let slot: Int
        if let reused = free.popLast() {
            nodes[reused] = node
            slot = reused
        } else {
            nodes.append(node)
            slot = nodes.count - 1
        }
        if let previous = newest { nodes[previous]!.newer = slot }
        newest = slot
        if oldest == nil { oldest = slot }
        index[key] = slot
        totalCost += cost
        return evict(toCost: costLimit, count: countLimit)
    }

    /// Removes an entry; returns its value.
    @discardableResult
    mutating func remove(_ key: Key) -> Value? {
        guard let slot = index.removeValue(forKey: key) else { return nil }
        let node = unlink(slot)
        return node.value
    }

    /// Evicts least recently used entries until the total cost is at most `cost` and the
    /// count at most `count`; returns them.
    @discardableResult
    mutating func evict(toCost cost: Int, count: Int = .max) -> [(key: Key, value: Value)] {
        var evicted: [(key: Key, value: Value)] = []
        while totalCost > cost || index.count > count, let slot = oldest {
            let node = unlink(slot)
            index[node.key] = nil
            evictions += 1
            evicted.append((node.key, node.value))
        }
        return evicted
    }

    /// Removes every entry for which `predicate` holds; returns how many.
    @discardableResult
    mutating func removeAll(where predicate: (Key, Value) -> Bool) -> Int {
        let doomed = index.compactMap { key, slot in predicate(key, nodes[slot]!.value) ? key : nil }
        doomed.forEach { remove($0) }
        return doomed.count
    }

    /// Keys from least to most recently used.
    var keysOldestFirst: [Key] {
        var keys: [Key] = []
        var cursor = oldest
        while let slot = cursor {
            keys.append(nodes[slot]!.key)
            cursor = nodes[slot]!.newer
        }
        return keys
    }

    private mutating func unlink(_ slot: Int) -> Node {
        let node = nodes[slot]!
        if let newer = node.newer { nodes[newer]!.older = node.older } else { newest = node.older }
        if let older = node.older { nodes[older]!.newer = node.newer } else { oldest = node.newer }
        nodes[slot] = nil
        free.append(slot)
        totalCost -= node.cost
        return node
    }

    private mutating func moveToFront(_ slot: Int) {
        guard newest != slot else { return }
        let node = nodes[slot]!
        // Unlink without freeing.
        if let newer = node.newer { nodes[newer]!.older = node.older }
        if let older = node.older { nodes[older]!.newer = node.newer } else { oldest = node.newer }
        nodes[slot]!.older = newest
        nodes[slot]!.newer = nil
        if let previous = newest { nodes[previous]!.newer = slot }
        newest = slot
    }
}
