import Testing

@testable import CanopyRemind

/// The delivery slots as pure values: a bound in all and per destination, and a full
/// destination never holding a slot that others could use.
struct DeliverySlotsTests {
    @Test func startsAtMostTheTotalAndMoreAsSendsFinish() {
        var slots = DeliverySlots(total: 3, perDestination: 2)
        slots.enqueue([1, 2, 3, 4, 5])
        do {
            let started = slots.start()
            #expect(started.map(\.id) == [1, 2, 3])
        }
        do {
            let started = slots.start()
            #expect(started.isEmpty, "the total is in flight")
        }
        for id: Int64 in [1, 2, 3] {
            let admitted = slots.admit(id, to: nil)
            #expect(admitted)
        }
        slots.finish(destination: nil)
        do {
            let started = slots.start()
            #expect(started == [.init(id: 4, reserved: nil)])
        }
        #expect(slots.inFlight == 3)
    }

    @Test func aFullDestinationParksItsSendsAndFreesTheirSlotsForOthers() {
        var slots = DeliverySlots(total: 3, perDestination: 2)
        slots.enqueue([1, 2, 3, 4])
        do {
            let started = slots.start()
            #expect(started.map(\.id) == [1, 2, 3])
        }
        do {
            let admitted = slots.admit(1, to: "webhook:slow.example")
            #expect(admitted)
        }
        do {
            let admitted = slots.admit(2, to: "webhook:slow.example")
            #expect(admitted)
        }
        do {
            let admitted = slots.admit(3, to: "webhook:slow.example")
            #expect(!admitted, "a third to the same host waits")
        }
        #expect(slots.inFlight == 2 && slots.waitingCount == 1)
        // Its slot went to the next send, for another host.
        do {
            let started = slots.start()
            #expect(started.map(\.id) == [4])
        }
        do {
            let admitted = slots.admit(4, to: "webhook:fast.example")
            #expect(admitted)
        }
        slots.finish(destination: "webhook:fast.example")
        do {
            let started = slots.start()
            #expect(started.isEmpty, "nothing else is ready; the parked one waits for its own host")
        }
        // The slow host answers one: the parked send takes its destination slot, and starts first.
        slots.finish(destination: "webhook:slow.example")
        do {
            let started = slots.start()
            #expect(started == [.init(id: 3, reserved: "webhook:slow.example")])
        }
        #expect(slots.inFlightTo["webhook:slow.example"] == 2 && slots.waitingCount == 0)
        slots.finish(destination: "webhook:slow.example")
        slots.finish(destination: "webhook:slow.example")
        #expect(slots.inFlightTo.isEmpty && slots.inFlight == 0)
    }

    @Test func aDestinationsBoundFollowsHowItAnswers() {
        var slots = DeliverySlots(total: 64, perDestination: 4, perQuickDestination: 32, perSlowDestination: 2)
        let host = "webhook:busy.example"
        slots.enqueue((0..<100).map { Int64($0) })
        var started = slots.start()
        #expect(started.count == 64)
        let admitted = started.filter { slots.admit($0.id, to: host) }
        #expect(admitted.count == 4, "a host not heard from yet gets 4")
        // It answers quickly: the sends waiting for it take the slots its bound now gives.
        slots.finish(destination: host, quickly: true)
        started = slots.start()
        #expect(slots.limit(of: host) == 32)
        #expect(started.filter { $0.reserved == host }.count == 29, "32 in flight now: 3 still out and 29 that waited")
        // Then it answers slowly: no new sends go until it is under its slow bound.
        for _ in 0..<30 { slots.finish(destination: host, quickly: false) }
        #expect(slots.limit(of: host) == 2 && slots.inFlightTo[host] == 2, "\(String(describing: slots.inFlightTo[host]))")
    }

    @Test func tenDeadHostsHoldAtMostTheirShareAndEveryoneElseFlows() {
        var slots = DeliverySlots(total: 64, perDestination: 4)
        // 10 hosts that never answer, 20 sends each, queued before 100 others' sends.
        let dead = (0..<200).map { Int64($0) }
        slots.enqueue(dead)
        slots.enqueue((1_000..<1_100).map { Int64($0) })
        var started = slots.start()
        var delivered: [Int64] = []
        while !started.isEmpty {
            var next: [DeliverySlots.Start] = []
            for start in started {
                if start.id < 1_000 {
                    _ = slots.admit(start.id, to: "webhook:dead\(start.id % 10).example") // admitted ones never finish
                } else {
                    let admitted = slots.admit(start.id, to: "webhook:alive\(start.id % 7).example")
                    #expect(admitted)
                    delivered.append(start.id)
                    slots.finish(destination: "webhook:alive\(start.id % 7).example")
                }
                next += slots.start()
            }
            started = next
        }
        #expect(delivered.count == 100, "every other send went while the dead hosts hold their 40")
        #expect(slots.inFlight == 40 && slots.waitingCount == 160)
    }
}
