import CanopyCapture
import CanopyMessages
import CanopyWire
import Collections

// The hold a snapshot is taken in: `broker.capture.start` with `holdMilliseconds`.
//
// A capture that carries the stack's starting state needs a cut that both sides agree on:
// every request before it has done all it does in the stores, and no request after it has
// begun. So the broker holds every new request from clients (not the ones services make
// while serving: a request in the air may need them to finish), waits until the requests
// in the air when the hold began are answered, and answers the `capture.start` then. The
// snapshot is taken while requests stay held; `broker.capture.release` writes a mark record
// naming it and lets the held requests go on, each captured as it goes. A hold ends by
// itself at its limit, so a caller that dies mid-snapshot never stops the stack for long.

extension BrokerState {
    /// A hold in force: the requests it holds and what it waits for. Its own bookkeeping only;
    /// the router admits the held requests when it ends.
    struct Hold {
        /// Requests held, in arrival order, with when they came.
        private(set) var held = Deque<(intake: Intake, at: ContinuousClock.Instant)>()
        private(set) var heldBytes = 0
        /// Client requests in the air when the hold began, not yet answered.
        private(set) var draining: Set<UInt64>
        /// The `capture.start` answered once ``draining`` is empty; nil once answered.
        private(set) var waiting: (client: [UInt8], correlation: [UInt8])?
        /// Until then the requests in the air may take to be answered; the hold fails then.
        let drainDeadline: ContinuousClock.Instant
        /// How long the caller has after the cut to pin its snapshot.
        let limit: Duration
        /// When the hold ends by itself: `limit` after the cut.
        private(set) var releaseAt: ContinuousClock.Instant
        /// A `capture.start`'s (whose capture stops when no cut could be made), not a
        /// `broker.hold`'s (a backup's, which leaves a running capture alone).
        let forCapture: Bool

        /// A hold of at most `limit` (within 1 ms and ``BrokerState/maximumHold``) that waits for
        /// the flights `inTheAir`, for the caller (`client`, `correlation`).
        init(inTheAir: [UInt64], limit: Duration, client: [UInt8], correlation: [UInt8], forCapture: Bool, now: ContinuousClock.Instant) {
            let limit = min(max(limit, .milliseconds(1)), BrokerState.maximumHold)
            draining = Set(inTheAir)
            waiting = (client, correlation)
            drainDeadline = now + limit
            self.limit = limit
            releaseAt = now + limit
            self.forCapture = forCapture
        }

        /// When ``check(now:)`` next has something to do.
        var nextWakeup: ContinuousClock.Instant { waiting == nil ? releaseAt : drainDeadline }

        /// Holds `intake` (costing `bytes`) unless the held bytes would pass `budget`.
        mutating func take(_ intake: Intake, bytes: Int, budget: Int, now: ContinuousClock.Instant) -> Bool {
            guard heldBytes + bytes <= budget else { return false }
            held.append((intake, now))
            heldBytes += bytes
            return true
        }

        /// A flight ended: one fewer to wait for before the cut.
        mutating func flightClosed(_ id: UInt64) {
            if !draining.isEmpty { draining.remove(id) }
        }

        /// Drops a held request its client cancelled; false when none was held under that id.
        mutating func cancel(client: [UInt8], correlation: [UInt8]) -> Bool {
            guard let index = held.firstIndex(where: { $0.intake.client == client && $0.intake.correlation == correlation }) else { return false }
            let removed = held.remove(at: index)
            heldBytes -= removed.intake.payload.byteCount + BrokerState.waiterBytes(removed.intake)
            return true
        }

        /// What is due at `now`.
        enum Due {
            case nothing
            /// The requests in the air are answered: answer the caller (the cut); the hold
            /// goes on until ``releaseAt``.
            case cut(client: [UInt8], correlation: [UInt8])
            /// They were not answered within the limit: the hold fails with this error.
            case failed(CanopyError)
            /// The cut's limit passed without `capture.release`: the hold ends.
            case expired
        }

        mutating func check(now: ContinuousClock.Instant) -> Due {
            if let waiting {
                if draining.isEmpty {
                    self.waiting = nil
                    releaseAt = now + limit
                    return .cut(client: waiting.client, correlation: waiting.correlation)
                }
                if now >= drainDeadline {
                    return .failed(
                        CanopyError(
                            .timeout,
                            "\(draining.count) request(s) in the air were not answered within the hold's limit, so no cut could be made; no snapshot was taken (try again when the stack is less busy, or with a longer hold)"
                        ))
                }
                return .nothing
            }
            return now >= releaseAt ? .expired : .nothing
        }
    }

    /// The longest hold a caller may ask for.
    public static let maximumHold: Duration = .seconds(60)

    /// Whether `header` is of a request a service made while serving another (never held).
    static func isDerived(_ header: RequestHeader) -> Bool { header.flags & RequestHeader.Flag.derived != 0 }

    /// Begins holding new client requests; the caller (`client`, `correlation`) is answered
    /// with ``CaptureControl/cut`` once the requests in the air are answered, or with
    /// ``CaptureControl/holdFailed(_:stopCapture:)`` when they are not within `limit`.
    mutating func beginHold(
        limit: Duration, client: [UInt8], correlation: [UInt8], forCapture: Bool = true, now: ContinuousClock.Instant,
        into out: inout [Directive]
    ) {
        let inTheAir = flights.ids.filter { !Self.isDerived(flights[$0].header) }.map(\.raw)
        hold = Hold(inTheAir: inTheAir, limit: limit, client: client, correlation: correlation, forCapture: forCapture, now: now)
        holding = true
        checkHold(now: now, into: &out)
    }

    /// Holds `intake` when a hold is in force and it is a client's own request; false when it
    /// goes on as usual.
    mutating func holds(_ intake: Intake, now: ContinuousClock.Instant, into out: inout [Directive]) -> Bool {
        guard holding, !Self.isDerived(intake.header) else { return false }
        let bytes = intake.payload.byteCount + Self.waiterBytes(intake)
        if !hold!.take(intake, bytes: bytes, budget: configuration.maximumHeldBytes - flights.heldBytes, now: now) {
            rejected += 1
            send(
                CanopyError(
                    .busy, "the broker holds requests while a snapshot is taken, and holds \(hold!.heldBytes) bytes of them already; retry in a moment"),
                to: intake, into: &out)
        }
        return true
    }

    /// Answers the waiting `capture.start` once drained, fails it past its deadline, and ends
    /// a hold that reached its limit.
    mutating func checkHold(now: ContinuousClock.Instant, into out: inout [Directive]) {
        switch hold?.check(now: now) ?? .nothing {
        case .nothing: break
        case .cut(let client, let correlation): out.append(.captureControl(.cut, client: client, correlation: correlation))
        case .failed(let error): releaseHold(snapshot: nil, failing: error, now: now, into: &out)
        case .expired:
            out.append(.log("a hold for a snapshot reached its limit and ended without capture.release", peer: []))
            releaseHold(snapshot: nil, now: now, into: &out)
        }
    }

    /// Ends the hold: the mark record (naming `snapshot`, once a cut was made), then every held
    /// request admitted in its order. False when no hold is in force.
    /// Before the cut, its `capture.start` is answered with `failing` (the capture stopped
    /// with it: without a cut it would carry no snapshot), or told the capture was stopped.
    @discardableResult
    mutating func releaseHold(snapshot: String?, failing: CanopyError? = nil, now: ContinuousClock.Instant, into out: inout [Directive]) -> Bool {
        guard let current = hold else { return false }
        hold = nil
        holding = false
        if let waiting = current.waiting {
            let error = failing ?? CanopyError(.conflict, "the capture was stopped before the requests in the air were answered; no snapshot was taken")
            out.append(
                .captureControl(.holdFailed(error, stopCapture: failing != nil && current.forCapture), client: waiting.client, correlation: waiting.correlation)
            )
        } else if capturing {
            out.append(.capture(capturedMark(snapshot: snapshot, held: current.held.count)))
        }
        for (intake, at) in current.held {
            let timeout = intake.header.timeoutMilliseconds == 0 ? configuration.defaultTimeout : .milliseconds(Int64(intake.header.timeoutMilliseconds))
            if now - at >= timeout {
                // Held past its deadline: answered as a request that waited too long in a queue.
                if capturing { out.append(.capture(capturedRequest(intake))) }
                send(Self.timeout(intake.serviceName), to: intake, into: &out)
            } else {
                admit(intake, now: now, into: &out)
            }
        }
        return true
    }
}
