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
