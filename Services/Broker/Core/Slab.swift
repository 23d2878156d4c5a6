/// A record's name in a ``Slab``: the slot it lies in and the slot's generation when it was put
/// there, in one integer (the generation above ``indexBits``, the slot below). When the record
/// is removed its slot's generation moves on, so a handle kept past that (a worker's late
/// reply, a deadline of a waiter answered since) is stale, and the slab says so, even once the
/// slot holds another record. Never 0 (generations of held records are odd), so 0 can mean
/// "none" where a handle is kept as an integer (on the wire, a flight's handle is the request id
/// a worker answers).
package struct SlabHandle: Hashable, Sendable, CustomStringConvertible {
    package let raw: UInt64

    /// Bits of the slot index: at most 16,777,216 records of a kind.
    package static let indexBits = 24
    package static let maximumSlots = 1 << indexBits
    /// The generations a handle can carry (40 bits). A slot whose generation reaches the last
    /// of them is retired for good rather than wrapping, so a handle is never given twice.
    package static let generationLimit: UInt64 = 1 << UInt64(64 - indexBits)

    package init(index: Int, generation: UInt64) {
        raw = generation << UInt64(Self.indexBits) | UInt64(index)
    }

    /// A handle as an integer kept elsewhere (0 and even generations: nil).
    package init?(raw: UInt64) {
        guard (raw >> UInt64(Self.indexBits)) & 1 == 1 else { return nil }
        self.raw = raw
    }

    package var index: Int { Int(truncatingIfNeeded: raw & UInt64(Self.maximumSlots - 1)) }
    package var generation: UInt64 { raw >> UInt64(Self.indexBits) }

    package var description: String { "#\(index).\(generation)" }
}

/// Records of one kind in one preallocated array of plain values, named by ``SlabHandle``s:
/// the broker's flights and waiters. Putting one in takes a free slot (the most recently freed,
/// still in cache) and makes no object; finding one is an index and a generation compared, no
/// hash; taking one out frees its slot. The array doubles when full and goes back to its first
/// size when the slab empties (after a burst); a slot's generation outlives that, so a handle
/// never names a later record.
///
/// A class: the records are read and changed in place through ``subscript(valid:)`` (no copy
/// of a record, so no reference counting of what it holds), and the loop thread alone owns
/// it, like the rest of ``BrokerState``.
package final class Slab<Element> {
    /// The records, `capacity` of them; slot `i` is initialized when `generations[i]` is odd.
    @exclusivity(unchecked) private var elements: UnsafeMutablePointer<Element>
    /// Each slot's generation: odd while it holds a record, even while free. Kept for every
    /// slot the slab ever had (`slotsEver`), also those it gave up when it shrank, so a slot
    /// that comes back goes on from its own generation and its old handles stay stale.
    @exclusivity(unchecked) private var generations: UnsafeMutablePointer<UInt64>
    /// The free list: each free slot's successor (`Int32.max`: none); as long as `generations`.
    @exclusivity(unchecked) private var nextFree: UnsafeMutablePointer<Int32>
    @exclusivity(unchecked) private var freeHead: Int32 = .max
    @exclusivity(unchecked) package private(set) var capacity: Int
    /// Slots whose generations are kept: the most the slab ever had (12 bytes each).
    @exclusivity(unchecked) private var slotsEver = 0
    /// Records held.
    @exclusivity(unchecked) package private(set) var count = 0
    private let initialCapacity: Int
    private let maximumCount: Int
    /// A slot whose free generation reaches this is retired (see ``SlabHandle/generationLimit``).
    private let retiredGeneration: UInt64

    /// An empty slab with `capacity` slots, holding at most `maximumCount` records.
    /// `generationLimit` is ``SlabHandle/generationLimit`` but in tests.
    package init(capacity: Int, maximumCount: Int = SlabHandle.maximumSlots, generationLimit: UInt64 = SlabHandle.generationLimit) {
        initialCapacity = max(1, min(capacity, maximumCount))
        self.maximumCount = min(maximumCount, SlabHandle.maximumSlots)
        retiredGeneration = min(generationLimit, SlabHandle.generationLimit) - 2 // even: a free slot's
        self.capacity = 0
        elements = .allocate(capacity: 0)
        generations = .allocate(capacity: 0)
        nextFree = .allocate(capacity: 0)
        resize(to: initialCapacity)
    }

    deinit {
        for index in 0..<capacity where generations[index] & 1 == 1 {
            (elements + index).deinitialize(count: 1)
        }
        elements.deallocate()
        generations.deallocate()
        nextFree.deallocate()
    }

    /// Whether `handle` names a record held now (not removed since).
    @inline(__always)
    package func contains(_ handle: SlabHandle) -> Bool {
        let index = handle.index
        return index < capacity && generations[index] == handle.generation
    }

    /// Puts `element` in a free slot (the array doubles when there is none) and returns its
    /// handle; nil when the slab holds its most already.
    package func insert(_ element: consuming Element) -> SlabHandle? {
        while freeHead == .max { // (more than once only past retired slots: not in a broker's lifetime)
            guard capacity < maximumCount else { return nil }
            resize(to: min(maximumCount, capacity * 2))
        }
        let index = Int(freeHead)
        freeHead = nextFree[index]
        generations[index] += 1 // odd: held
        (elements + index).initialize(to: consume element) // moved, not copied and destroyed
        count += 1
        return SlabHandle(index: index, generation: generations[index])
    }

    /// The record `handle` names; it must be held (``contains(_:)``). Read and changed in place,
    /// through its address: no copy, and no coroutine (a `_read` or `_modify` accessor that is
    /// not inlined allocates its frame on the heap, one allocation an access).
    package subscript(valid handle: SlabHandle) -> Element {
        unsafeAddress { UnsafePointer(address(of: handle)) }
        unsafeMutableAddress { address(of: handle) }
    }

    /// Where the record `handle` names lies, until the slab next grows or shrinks (an insert, a
    /// remove or a discard); it must be held.
    @inline(__always)
    package func address(of handle: SlabHandle) -> UnsafeMutablePointer<Element> {
        precondition(contains(handle), "a stale slab handle")
        return elements + handle.index
    }

    /// A copy of the record `handle` names, or nil when it is stale.
    package subscript(handle: SlabHandle) -> Element? {
        contains(handle) ? elements[handle.index] : nil
    }

    /// Takes out the record `handle` names and returns it; nil (and nothing changes) when the
    /// handle is stale. The slot's generation moves on, so the handle stays stale for good.
    @discardableResult
    package func remove(_ handle: SlabHandle) -> Element? {
        guard contains(handle) else { return nil }
        let index = handle.index
        let element = (elements + index).move()
        free(index)
        return element
    }

    /// Ends the record `handle` names where it lies, without moving it out first (a flight is
    /// a few hundred bytes: moving it out only to drop it showed in the broker's profile);
    /// false (and nothing changes) when the handle is stale.
    @discardableResult
    package func discard(_ handle: SlabHandle) -> Bool {
        guard contains(handle) else { return false }
        (elements + handle.index).deinitialize(count: 1)
        free(handle.index)
        return true
    }

    /// Marks slot `index`, whose record was moved out or ended, free (or retired).
    private func free(_ index: Int) {
        generations[index] += 1 // even: free
        if generations[index] < retiredGeneration { // else retired: its handles would wrap
            nextFree[index] = freeHead
            freeHead = Int32(index)
        }
        count -= 1
        if count == 0, capacity > initialCapacity { resize(to: initialCapacity) }
    }

    /// The handles of every record held, in slot order.
    package var handles: [SlabHandle] {
        (0..<capacity).compactMap { generations[$0] & 1 == 1 ? SlabHandle(index: $0, generation: generations[$0]) : nil }
    }

    /// A new array of `newCapacity` records: growing keeps every record where it is; shrinking
    /// happens only when the slab is empty. The generations are never given up.
    private func resize(to newCapacity: Int) {
        precondition(newCapacity >= capacity || count == 0, "a slab shrinks only when empty")
        let newElements = UnsafeMutablePointer<Element>.allocate(capacity: newCapacity)
        for index in 0..<min(capacity, newCapacity) where generations[index] & 1 == 1 {
            (newElements + index).moveInitialize(from: elements + index, count: 1)
        }
        elements.deallocate()
        elements = newElements
        capacity = newCapacity
        if newCapacity > slotsEver { // slots never had before: generation 0
            let newGenerations = UnsafeMutablePointer<UInt64>.allocate(capacity: newCapacity)
            let newNextFree = UnsafeMutablePointer<Int32>.allocate(capacity: newCapacity)
            newGenerations.initialize(from: generations, count: slotsEver)
            (newGenerations + slotsEver).initialize(repeating: 0, count: newCapacity - slotsEver)
            newNextFree.initialize(repeating: .max, count: newCapacity)
            generations.deallocate()
            nextFree.deallocate()
            generations = newGenerations
            nextFree = newNextFree
            slotsEver = newCapacity
        }
        // The free list anew, lowest slot first, without the retired ones.
        freeHead = .max
        for index in stride(from: newCapacity - 1, through: 0, by: -1) where generations[index] & 1 == 0 && generations[index] < retiredGeneration {
            nextFree[index] = freeHead
            freeHead = Int32(index)
        }
    }
}
