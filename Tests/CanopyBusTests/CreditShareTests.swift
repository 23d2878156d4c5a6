import CanopyBus
import Testing

/// A worker's credit shared between brokers (``CreditShare``), without sockets.
struct CreditShareTests {
    typealias Grant = CreditShare.Grant

    @Test func aBrokerAloneGetsAllButTheOthersReservesAndTheNextComesUpWithoutOvercommitting() {
        var share = CreditShare(total: 8, brokers: 2)
        #expect(share.brokerUp(0) == [Grant(broker: 0, credit: 7)], "one kept in reserve for the broker that is down")
        for _ in 0..<7 { share.started(0) }
        // Broker 1 comes up while broker 0 holds 7: its READY carries its reserve, broker 0 is
        // cut to its half at once, and broker 1 grows only as broker 0's requests finish.
        #expect(share.brokerUp(1) == [Grant(broker: 1, credit: 1), Grant(broker: 0, credit: 4)])
        #expect(share.finished(0) == [Grant(broker: 1, credit: 2)])
        #expect(share.finished(0) == [Grant(broker: 1, credit: 3)])
        #expect(share.finished(0) == [Grant(broker: 1, credit: 4)])
        #expect(share.finished(0).isEmpty && share.granted == [4, 4])
        // Broker 1 is lost holding 2: broker 0 gets its share back as they finish.
        share.started(1)
        share.started(1)
        #expect(share.brokerDown(1) == [Grant(broker: 0, credit: 6)])
        #expect(share.finished(1) == [Grant(broker: 0, credit: 7)])
        #expect(share.finished(1).isEmpty, "the last one back is broker 1's reserve")
    }

    @Test func whateverHappensTheWorkerNeverHoldsMoreThanItsCredit() {
        var generator = SystemRandomNumberGenerator()
        for total in [3, 4, 8, 16] {
            for brokers in 1...3 where brokers <= total {
                var share = CreditShare(total: total, brokers: brokers)
                var grants = Array(repeating: 0, count: brokers) // what each broker was last told
                func apply(_ changes: [Grant]) { for change in changes { grants[change.broker] = change.credit } }
                for _ in 0..<5_000 {
                    let broker = Int.random(in: 0..<brokers, using: &generator)
                    switch Int.random(in: 0..<10, using: &generator) {
                    case 0:
                        apply(share.up[broker] ? share.brokerDown(broker) : share.brokerUp(broker))
                        if !share.up[broker] { grants[broker] = 0 }
                    case 1...4:
                        // A broker hands out a request only within what it was told.
                        if share.up[broker] && share.held[broker] < grants[broker] { share.started(broker) }
                    default:
                        if share.held[broker] > 0 { apply(share.finished(broker)) }
                    }
                    #expect(share.held.reduce(0, +) <= total)
                    #expect(zip(share.granted, share.held).map { max($0, $1, 1) }.reduce(0, +) <= total)
                    #expect(grants == share.granted)
                }
                // With everything finished, the brokers that are up share the credit evenly.
                for broker in 0..<brokers { while share.held[broker] > 0 { apply(share.finished(broker)) } }
                let up = share.up.filter { $0 }.count
                if up > 0 {
                    let fair = (total - (brokers - up)) / up
                    #expect(share.granted.enumerated().allSatisfy { !share.up[$0.offset] || $0.element >= fair }, "\(share.granted) with \(up) up of \(total)")
                }
            }
        }
    }
}
