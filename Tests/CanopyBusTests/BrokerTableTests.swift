import CanopyBroker
import CanopyTesting
import Synchronization
import Testing

/// The broker's id table behaves as a dictionary does, through growth and deletions.
struct IDTableTests {
    @Test func randomInsertsLookupsAndRemovalsAgreeWithADictionary() async {
        var random = SeededRandom(seed: 7)
        var table = IDTable<Int>(capacity: 4)
        var model: [UInt64: Int] = [:]
        for step in 0..<200_000 {
            if step % 2_000 == 0 { await Task.yield() } // CPU-bound: leave the shared pool to live tests now and then
            // Mostly ids near the front of a moving window, as the broker's are; some far behind.
            let id = UInt64(step / 4 + 1) &- (random.next() % 64 == 0 ? random.next() % 5_000 : random.next() % 300)
            guard id > 0 else { continue }
            switch random.next() % 3 {
            case 0:
                table[id] = step
                model[id] = step
            case 1:
                #expect(table.removeValue(forKey: id) == model.removeValue(forKey: id))
            default:
                #expect(table[id] == model[id])
            }
            if step % 20_000 == 0 {
                #expect(table.count == model.count)
                #expect(model.allSatisfy { table[$0.key] == $0.value }, "every entry reachable after removals")
            }
        }
        #expect(table.count == model.count)
        #expect(model.allSatisfy { table[$0.key] == $0.value })
        table[12_345_678] = nil
        #expect(table[12_345_678] == nil)
    }

    @Test func aTableGivesItsSlotsBackAfterABurst() async {
        var table = IDTable<Int>(capacity: 64)
        let start = table.slots
        for id in 1...100_000 as ClosedRange<UInt64> {
            table[id] = Int(id)
            if id % 2_000 == 0 { await Task.yield() }
        }
        #expect(table.slots >= 200_000)
        for id in 1...99_990 as ClosedRange<UInt64> { table.removeValue(forKey: id) }
        #expect(table.count == 10)
        #expect(table.slots <= 8 * start, "back near its starting size: \(table.slots) slots")
        #expect((99_991...100_000 as ClosedRange<UInt64>).allSatisfy { table[$0] == Int($0) })
    }
}

/// The table of clients' requests behaves as a dictionary does, with its one hash per key
/// given from outside, through collisions, growth and deletions.
struct ClientTableTests {
    @Test func insertsLookupsAndRemovalsAgreeWithADictionaryEvenWhenHashesCollide() async {
        var random = SeededRandom(seed: 11)
        var table = ClientTable(capacity: 4)
        var model: [[UInt8]: (hash: Int, id: UInt64)] = [:] // key: client + [0xFF] + correlation
        var names: [UInt64: [UInt8]] = [:] // each waiter's name, as the broker keeps it with the waiter
        var nextID: UInt64 = 1
        for step in 0..<40_000 { // 2,048 possible keys: each is added and removed many times over
            if step % 2_000 == 0 { await Task.yield() }
            let client: [UInt8] = [UInt8(random.next() % 8)]
            let correlation: [UInt8] = [UInt8(random.next() % 64), UInt8(random.next() % 4)]
            let key = client + [0xFF] + correlation
            // A quarter of the keys share one hash: every probe run sees colliding entries.
            let hash = random.next() % 4 == 0 ? 42 : ClientTable.hash(client: client, correlation: correlation)
            if let held = model[key] {
                #expect(table.find(hash: held.hash) { names[$0] == key } == held.id, "step \(step)")
                if random.next() % 2 == 0 {
                    table.remove(hash: held.hash, id: held.id)
                    model[key] = nil
                    names[held.id] = nil
                    #expect(table.find(hash: held.hash) { names[$0] == key } == nil)
                }
            } else {
                #expect(table.find(hash: hash) { names[$0] == key } == nil)
                table.insert(hash: hash, id: nextID)
                model[key] = (hash, nextID)
                names[nextID] = key
                nextID += 1
            }
            if step % 10_000 == 0 {
                #expect(table.count == model.count)
                #expect(model.allSatisfy { key, held in table.find(hash: held.hash) { names[$0] == key } == held.id }, "every entry reachable after removals")
            }
        }
        table.remove(hash: 7, id: 999_999_999) // not there: nothing happens
        #expect(table.count == model.count)
    }

    @Test func theSameNameFromTwoClientsIsTwoKeysAndTheTableShrinksAfterABurst() async {
        var table = ClientTable(capacity: 16)
        let start = table.slots
        let one = ClientTable.hash(client: [1], correlation: [7]), other = ClientTable.hash(client: [2], correlation: [7])
        #expect(one != other, "the client is part of the name")
        table.insert(hash: one, id: 1)
        #expect(table.find(hash: other) { _ in true } == nil)
        #expect(table.find(hash: one) { $0 == 1 } == 1)
        for id in 2...50_000 as ClosedRange<UInt64> {
            let correlation = withUnsafeBytes(of: id) { Array($0) }
            table.insert(hash: ClientTable.hash(client: [3], correlation: correlation), id: id)
            if id % 2_000 == 0 { await Task.yield() }
        }
        for id in 2...50_000 as ClosedRange<UInt64> {
            let correlation = withUnsafeBytes(of: id) { Array($0) }
            table.remove(hash: ClientTable.hash(client: [3], correlation: correlation), id: id)
        }
        #expect(table.count == 1 && table.slots <= 8 * start, "\(table.slots) slots")
        #expect(table.find(hash: one) { $0 == 1 } == 1)
    }
}

/// The broker's deadline queue gives the earliest deadline first, as a sorted list would,
/// whatever order deadlines come in and whatever is swept out.
struct DeadlineQueueTests {
    @Test func randomInsertsRemovalsAndSweepsAgreeWithASortedList() async {
        var random = SeededRandom(seed: 11)
        var queue = DeadlineQueue()
        var model: [BrokerState.Deadline] = [] // kept sorted by (key, waiter)
        let start = ContinuousClock.now
        var clock: UInt64 = 0
        var nextWaiter: UInt64 = 1
        for step in 0..<100_000 {
            if step % 2_000 == 0 { await Task.yield() }
            switch random.next() % 10 {
            case 0..<5: // a request: mostly the common timeout (in order), sometimes one of many others
                clock += random.next() % 3
                let timeout: UInt64 =
                    switch random.next() % 4 {
                    case 0: random.next() % 1_000
                    case 1: 1_000 + random.next() % 100_000
                    default: 30_000
                    }
                let key = clock + timeout
                let deadline = BrokerState.Deadline(at: start + .nanoseconds(Int64(key)), key: key, waiter: nextWaiter)
                nextWaiter += 1
                queue.insert(deadline, timeout: timeout)
                let index = model.firstIndex { ($0.key, $0.waiter) > (key, deadline.waiter) } ?? model.endIndex
                model.insert(deadline, at: index)
            case 5..<9:
                #expect(queue.min?.key == model.first?.key, "step \(step)")
                guard let first = model.first else { continue }
                #expect(queue.min?.waiter == first.waiter || queue.min?.key == first.key)
                // Equal keys may come out in either order: the one the queue gives is the one
                // it removes (the broker drops or expires exactly the deadline it looked at).
                if let given = queue.min {
                    let index = model.firstIndex { $0.waiter == given.waiter }
                    #expect(index != nil && given.key == first.key, "step \(step): \(given) is not held")
                    if let index { model.remove(at: index) }
                }
                queue.removeMin()
            default: // a sweep of answered ones
                if random.next() % 50 == 0 {
                    let gone = Set(model.filter { _ in random.next() % 3 == 0 }.map(\.waiter))
                    queue.removeAll { gone.contains($0.waiter) }
                    model.removeAll { gone.contains($0.waiter) }
                }
            }
            #expect(queue.count == model.count)
        }
        while let given = queue.min {
            #expect(given.key == model.first?.key)
            let held = model.count
            model.removeAll { $0.waiter == given.waiter }
            #expect(model.count == held - 1, "\(given) is not held")
            queue.removeMin()
        }
        #expect(model.isEmpty && queue.count == 0)
    }
}

/// A record that counts how many of its kind were ended.
private final class Tracked {
    static let ended = Mutex(0)
    deinit { Self.ended.withLock { $0 += 1 } }
}

/// The broker's slabs behave as a dictionary by handle does, and a handle once removed never
/// names a record again: not after its slot is reused, not after the slab shrank and grew.
struct SlabTests {
    @Test func randomInsertsReadsAndRemovalsAgreeWithAModelAndOldHandlesStayStale() async {
        var random = SeededRandom(seed: 23)
        let slab = Slab<[Int]>(capacity: 4, maximumCount: 5_000)
        var model: [SlabHandle: [Int]] = [:]
        var live: [SlabHandle] = []
        var stale: [SlabHandle] = []
        for step in 0..<150_000 {
            if step % 2_000 == 0 { await Task.yield() }
            // Bursts that fill the slab, then drain it to empty (where it shrinks).
            let filling = (step / 10_000) % 2 == 0
            switch random.next() % 8 {
            case 0..<4 where filling, 0 where !filling:
                if let handle = slab.insert([step]) {
                    #expect(model[handle] == nil, "a handle is never given twice")
                    #expect(!stale.contains(handle))
                    model[handle] = [step]
                    live.append(handle)
                } else {
                    #expect(model.count == 5_000, "refused only when full")
                }
            case 4, 5, 1..<4:
                guard !live.isEmpty else { continue }
                let handle = live.remove(at: Int(random.next() % UInt64(live.count)))
                if step % 2 == 0 {
                    #expect(slab.remove(handle) == model.removeValue(forKey: handle))
                } else { // ended in place
                    #expect(slab.discard(handle))
                    model[handle] = nil
                }
                stale.append(handle)
                if stale.count > 2_000 { stale.removeFirst(1_000) }
            case 6:
                guard !stale.isEmpty else { continue }
                let handle = stale[Int(random.next() % UInt64(stale.count))]
                #expect(!slab.contains(handle) && slab[handle] == nil, "step \(step): \(handle) names nothing any more")
                #expect(slab.remove(handle) == nil)
                #expect(!slab.discard(handle))
            default:
                guard !live.isEmpty else { continue }
                let handle = live[Int(random.next() % UInt64(live.count))]
                slab[valid: handle].append(step) // changed in place
                model[handle]!.append(step)
                #expect(slab[handle] == model[handle])
            }
            if step % 10_000 == 9_999 {
                #expect(slab.count == model.count)
                #expect(model.allSatisfy { slab[$0.key] == $0.value })
                #expect(stale.allSatisfy { !slab.contains($0) })
                #expect(Set(slab.handles) == Set(model.keys))
            }
        }
    }

    @Test func aRecordDiscardedInPlaceIsEndedOnceAndItsSlotReused() throws {
        let slab = Slab<Tracked>(capacity: 2)
        let first = try #require(slab.insert(Tracked()))
        #expect(slab.discard(first))
        #expect(Tracked.ended.withLock { $0 } == 1, "ended where it lay")
        #expect(!slab.discard(first) && slab.count == 0, "a stale handle ends nothing")
        let second = try #require(slab.insert(Tracked()))
        #expect(second.index == first.index && second != first, "the slot is reused under a new generation")
        #expect(slab.remove(second) != nil)
        #expect(Tracked.ended.withLock { $0 } == 2)
    }

    @Test func aSlotWhoseGenerationsRunOutIsRetiredNotWrapped() throws {
        let slab = Slab<Int>(capacity: 2, generationLimit: 8) // a slot holds at most 3 records in turn
        var given: Set<SlabHandle> = []
        for value in 0..<40 {
            let handle = try #require(slab.insert(value))
            #expect(given.insert(handle).inserted, "a handle is never given twice")
            #expect(handle.generation < 8)
            slab.remove(handle)
        }
        #expect(Set(given.map(\.index)).count >= 13, "40 records over slots of 3 uses each")
        #expect(given.allSatisfy { !slab.contains($0) })
    }

    @Test func aSlabGoesBackToItsFirstSizeWhenEmptyAndItsOldHandlesStayStale() throws {
        let slab = Slab<Int>(capacity: 8)
        let handles = (0..<1_000).compactMap { slab.insert($0) }
        #expect(slab.capacity >= 1_000)
        for handle in handles { slab.remove(handle) }
        #expect(slab.capacity == 8 && slab.count == 0)
        let again = (0..<1_000).compactMap { slab.insert($0) }
        #expect(Set(again).isDisjoint(with: handles), "slots made anew start above every generation they had")
        #expect(handles.allSatisfy { !slab.contains($0) })
        #expect(SlabHandle(raw: 0) == nil, "0 names nothing")
        let handle = try #require(again.first)
        #expect(SlabHandle(raw: handle.raw) == handle)
    }
}
