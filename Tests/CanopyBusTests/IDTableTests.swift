import CanopyBroker
import CanopyTesting
import Testing

/// The broker's id table behaves as a dictionary does, through growth and deletions.
struct IDTableTests {
    @Test func randomInsertsLookupsAndRemovalsAgreeWithADictionary() {
        var random = SeededRandom(seed: 7)
        var table = IDTable<Int>(capacity: 4)
        var model: [UInt64: Int] = [:]
        for step in 0..<200_000 {
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

    @Test func aTableGivesItsSlotsBackAfterABurst() {
        var table = IDTable<Int>(capacity: 64)
        let start = table.slots
        for id in 1...100_000 as ClosedRange<UInt64> { table[id] = Int(id) }
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
    @Test func insertsLookupsAndRemovalsAgreeWithADictionaryEvenWhenHashesCollide() {
        var random = SeededRandom(seed: 11)
        var table = ClientTable(capacity: 4)
        var model: [[UInt8]: (hash: Int, id: UInt64)] = [:] // key: client + [0xFF] + correlation
        var nextID: UInt64 = 1
        for step in 0..<100_000 {
            let client: [UInt8] = [UInt8(random.next() % 8)]
            let correlation: [UInt8] = [UInt8(random.next() % 64), UInt8(random.next() % 4)]
            let key = client + [0xFF] + correlation
            // A quarter of the keys share one hash: every probe run sees colliding entries.
            let hash = random.next() % 4 == 0 ? 42 : ClientTable.hash(client: client, correlation: correlation)
            if let held = model[key] {
                #expect(table.find(hash: held.hash, client: client, correlation: correlation) == held.id, "step \(step)")
                if random.next() % 2 == 0 {
                    table.remove(hash: held.hash, id: held.id)
                    model[key] = nil
                    #expect(table.find(hash: held.hash, client: client, correlation: correlation) == nil)
                }
            } else {
                #expect(table.find(hash: hash, client: client, correlation: correlation) == nil)
                table.insert(hash: hash, client: client, correlation: correlation, id: nextID)
                model[key] = (hash, nextID)
                nextID += 1
            }
            if step % 10_000 == 0 {
                #expect(table.count == model.count)
                #expect(model.allSatisfy { key, held in
                    table.find(hash: held.hash, client: [key[0]], correlation: Array(key[2...])) == held.id
                }, "every entry reachable after removals")
            }
        }
        table.remove(hash: 7, id: 999_999_999) // not there: nothing happens
        #expect(table.count == model.count)
    }

    @Test func theSameNameFromTwoClientsIsTwoKeysAndTheTableShrinksAfterABurst() {
        var table = ClientTable(capacity: 16)
        let start = table.slots
        let one = ClientTable.hash(client: [1], correlation: [7]), other = ClientTable.hash(client: [2], correlation: [7])
        table.insert(hash: one, client: [1], correlation: [7], id: 1)
        #expect(table.find(hash: other, client: [2], correlation: [7]) == nil)
        #expect(table.find(hash: one, client: [1], correlation: [7]) == 1)
        for id in 2...50_000 as ClosedRange<UInt64> {
            let correlation = withUnsafeBytes(of: id) { Array($0) }
            table.insert(hash: ClientTable.hash(client: [3], correlation: correlation), client: [3], correlation: correlation, id: id)
        }
        for id in 2...50_000 as ClosedRange<UInt64> {
            let correlation = withUnsafeBytes(of: id) { Array($0) }
            table.remove(hash: ClientTable.hash(client: [3], correlation: correlation), id: id)
        }
        #expect(table.count == 1 && table.slots <= 8 * start, "\(table.slots) slots")
        #expect(table.find(hash: one, client: [1], correlation: [7]) == 1)
    }
}
