/// How a worker of several brokers shares its credit between them, as a pure value: what
/// each broker was granted (its READY's credit, then CREDIT messages) and what each holds.
///
/// The invariant: for every broker, the larger of its grant and what it holds, and at least 1
/// (a broker that is down keeps one in reserve, so that its READY, which must carry at least
/// 1, never takes more than there is), summed over the brokers, is at most ``total``. So the
/// worker never holds more than its credit, whatever the brokers do with what they were
/// granted, and a grant cut takes effect as the broker's requests finish.
///
/// The brokers that are up share the rest evenly (the first ones one more when it does not
/// divide); a grant is cut at once when a broker comes up, and raised as room frees.
public struct CreditShare: Sendable, Equatable {
    /// The worker's credit.
    public let total: Int
    /// Per broker: its grant (0 while it is down), what it holds, whether it is up.
    public private(set) var granted: [Int]
    public private(set) var held: [Int]
    public private(set) var up: [Bool]

    /// - Parameters:
    ///   - total: the worker's credit, at least `brokers`.
    ///   - brokers: how many brokers it serves.
    public init(total: Int, brokers: Int) {
        precondition(brokers >= 1 && total >= brokers, "a credit of \(total) cannot be shared by \(brokers) brokers (at least one each)")
        self.total = total
        granted = Array(repeating: 0, count: brokers)
        held = Array(repeating: 0, count: brokers)
        up = Array(repeating: false, count: brokers)
    }

    /// A change of grant to tell a broker: the READY's credit when it has just come up, else a CREDIT.
    public struct Grant: Equatable, Sendable {
        public var broker: Int
        public var credit: Int

        public init(broker: Int, credit: Int) {
            self.broker = broker
            self.credit = credit
        }
    }

    /// What is in use at `broker`: its grant or what it holds, and at least its reserve of 1.
    private func used(_ broker: Int) -> Int { max(granted[broker], held[broker], 1) }

    /// Broker `broker` is reached and its READY goes out now: the returned grants include its
    /// own (its READY's credit, at least 1) and the others' changes.
    public mutating func brokerUp(_ broker: Int) -> [Grant] {
        up[broker] = true
        granted[broker] = 1 // its reserve
        let changes = rebalance()
        return [Grant(broker: broker, credit: granted[broker])] + changes.filter { $0.broker != broker }
    }

    /// Broker `broker` is lost: its grant goes to the others as its requests finish.
    public mutating func brokerDown(_ broker: Int) -> [Grant] {
        up[broker] = false
        granted[broker] = 0
        return rebalance()
    }

    /// Broker `broker` handed the worker a request.
    public mutating func started(_ broker: Int) {
        held[broker] += 1
    }

    /// A request of broker `broker` finished (answered, or abandoned when the broker was lost).
    public mutating func finished(_ broker: Int) -> [Grant] {
        held[broker] = max(0, held[broker] - 1)
        return rebalance()
    }

    /// Each up broker's fair share of what the brokers that are down do not keep.
    private func targets() -> [Int] {
        let upBrokers = up.indices.filter { up[$0] }
        guard !upBrokers.isEmpty else { return Array(repeating: 0, count: up.count) }
        let kept = up.indices.filter { !up[$0] }.reduce(0) { $0 + used($1) }
        let shared = max(upBrokers.count, total - kept)
        var targets = Array(repeating: 0, count: up.count)
        for (position, broker) in upBrokers.enumerated() {
            targets[broker] = shared / upBrokers.count + (position < shared % upBrokers.count ? 1 : 0)
        }
        return targets
    }

    /// Cuts grants over their share, then raises those under it as far as the room allows.
    private mutating func rebalance() -> [Grant] {
        let before = granted
        let targets = targets()
        for broker in up.indices where up[broker] && granted[broker] > targets[broker] {
            granted[broker] = max(1, targets[broker])
        }
        var room = total - up.indices.reduce(0) { $0 + used($1) }
        for broker in up.indices where up[broker] && granted[broker] < targets[broker] && room > 0 {
            // Raising the grant uses room only beyond what the broker already holds.
            let raise = min(targets[broker] - granted[broker], room + max(0, held[broker] - granted[broker]))
            let newUse = max(granted[broker] + raise, held[broker], 1)
            room -= newUse - used(broker)
            granted[broker] += raise
        }
        return up.indices.filter { up[$0] && granted[$0] != before[$0] }.map { Grant(broker: $0, credit: granted[$0]) }
    }
}
