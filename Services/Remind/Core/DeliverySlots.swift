import DequeModule

/// Which sends may be in flight: at most `total` at once, and a bound per destination (a
/// webhook's host, see ``NotificationChannel/destination(of:)``) that follows how it answers:
/// `perDestination` for one not heard from yet, `perQuickDestination` once its last answer
/// came quickly, `perSlowDestination` once it came slowly (or not at all). A send whose
/// destination is full waits for that destination without holding one of the total's slots,
/// so a slow or dead receiver, which anyone can register, holds back only its own deliveries,
/// while a busy receiver that answers quickly gets as many as it takes.
///
/// A pure value: the dispatcher keeps it under its lock and carries out what it answers.
struct DeliverySlots {
    /// A send to start: `reserved` is the destination whose slot it already holds (a send
    /// that waited for its destination), `nil` when it is yet to be admitted.
    struct Start: Equatable, Sendable {
        var id: Int64
        var reserved: String?
    }

    let total: Int
    let perDestination: Int
    let perQuickDestination: Int
    let perSlowDestination: Int
    /// How each destination answered last: quickly (true) or slowly (false). At most
    /// ``rememberedDestinations``; forgotten ones start again at `perDestination`.
    private var quick: [String: Bool] = [:]
    static let rememberedDestinations = 10_000
    /// Sends not yet started, in order.
    private(set) var ready = Deque<Int64>()
    /// Sends that waited for their destination and hold its slot now: they start first.
    private var resumed = Deque<Start>()
    /// Sends started and not yet finished (each holds one of ``total``).
    private(set) var inFlight = 0
    /// Sends admitted to each destination and not yet finished.
    private(set) var inFlightTo: [String: Int] = [:]
    /// Sends waiting for their destination, in order.
    private var waiting: [String: Deque<Int64>] = [:]

    /// - Parameters:
    ///   - total: sends in flight at once, at least 1.
    ///   - perDestination: sends in flight to a destination not heard from yet, at least 1.
    ///   - perQuickDestination: to one whose last answer came quickly.
    ///   - perSlowDestination: to one whose last answer came slowly or not at all.
    init(total: Int, perDestination: Int, perQuickDestination: Int? = nil, perSlowDestination: Int? = nil) {
        precondition(total >= 1 && perDestination >= 1, "delivery slots need at least one in all and one per destination")
        self.total = total
        self.perDestination = perDestination
        self.perQuickDestination = max(1, perQuickDestination ?? perDestination)
        self.perSlowDestination = max(1, perSlowDestination ?? perDestination)
    }

    /// The bound of `destination` now.
    func limit(of destination: String) -> Int {
        switch quick[destination] {
        case true?: perQuickDestination
        case false?: perSlowDestination
        case nil: perDestination
        }
    }

    /// Sends waiting for a destination, in all.
    var waitingCount: Int { waiting.values.reduce(0) { $0 + $1.count } }

    /// Adds sends to start, after those already waiting.
    mutating func enqueue(_ ids: some Sequence<Int64>) {
        ready.append(contentsOf: ids)
    }

    /// The sends to start now: each takes one of the total's slots until ``finish(destination:)``.
    mutating func start() -> [Start] {
        var starting: [Start] = []
        while inFlight < total {
            if let next = resumed.popFirst() {
                starting.append(next)
            } else if let id = ready.popFirst() {
                starting.append(Start(id: id, reserved: nil))
            } else {
                break
            }
            inFlight += 1
        }
        return starting
    }

    /// A started send whose destination is now known asks to go there: `true` when it may
    /// (it holds the destination's slot until it finishes), `false` when the destination is
    /// full: the send waits for it and gives its total slot back (call ``start()`` again).
    mutating func admit(_ id: Int64, to destination: String?) -> Bool {
        guard let destination else { return true }
        if inFlightTo[destination, default: 0] < limit(of: destination) {
            inFlightTo[destination, default: 0] += 1
            return true
        }
        waiting[destination, default: []].append(id)
        inFlight -= 1
        return false
    }

    /// A started send ended (delivered, failed, or no longer pending): its slots are free,
    /// the destination's bound follows how it answered (`quickly`: `nil` when it was not
    /// asked), and the sends waiting for it take the slots its bound now gives.
    mutating func finish(destination: String?, quickly: Bool? = nil) {
        inFlight -= 1
        guard let destination else { return }
        if let quickly {
            if quick[destination] == nil, quick.count >= Self.rememberedDestinations { quick.removeAll(keepingCapacity: true) }
            quick[destination] = quickly
        }
        inFlightTo[destination, default: 1] -= 1
        while inFlightTo[destination, default: 0] < limit(of: destination), var queue = waiting[destination], let next = queue.popFirst() {
            waiting[destination] = queue.isEmpty ? nil : queue
            inFlightTo[destination, default: 0] += 1
            resumed.append(Start(id: next, reserved: destination)) // it holds the destination's slot
        }
        if inFlightTo[destination] == 0 { inFlightTo[destination] = nil }
    }
}
