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
    /// A hold in force.
    struct Hold {
        /// Requests held, in arrival order, with when they came.
        var held = Deque<(intake: Intake, at: ContinuousClock.Instant)>()
        var heldBytes = 0
        /// Client requests in the air when the hold began, not yet answered.
        var draining: Set<UInt64>
        /// The `capture.start` answered once ``draining`` is empty; nil once answered.
        var waiting: (client: [UInt8], correlation: [UInt8])?
        /// Until then the requests in the air may take to be answered; the hold fails then.
        let drainDeadline: ContinuousClock.Instant
        /// How long the caller has after the cut to pin its snapshot.
        let limit: Duration
        /// When the hold ends by itself: `limit` after the cut.
        var releaseAt: ContinuousClock.Instant
        /// A `capture.start`'s (whose capture stops when no cut could be made), not a
        /// `broker.hold`'s (a backup's, which leaves a running capture alone).
        var forCapture: Bool
    }

    /// The longest hold a caller may ask for.
    public static let maximumHold: Duration = .seconds(60)

    /// Whether `header` is of a request a service made while serving another (never held).
    static func isDerived(_ header: RequestHeader) -> Bool { header.flags & RequestHeader.Flag.derived != 0 }

    /// Begins holding new client requests; the caller (`client`, `correlation`) is answered
    /// with ``CaptureControl/cut`` once the requests in the air are answered, or with
    /// ``CaptureControl/holdFailed(_:stopCapture:)`` when they are not within `limit`.
    mutating func beginHold(limit: Duration, client: [UInt8], correlation: [UInt8], forCapture: Bool = true, now: ContinuousClock.Instant,
                            into out: inout [Directive]) {
        let limit = min(max(limit, .milliseconds(1)), Self.maximumHold)
        let inTheAir = flights.ids.filter { id in flights[id].map { !Self.isDerived($0.header) } ?? false }
        hold = Hold(draining: Set(inTheAir), waiting: (client, correlation), drainDeadline: now + limit, limit: limit, releaseAt: now + limit,
                    forCapture: forCapture)
        checkHold(now: now, into: &out)
    }

    /// Holds `intake` when a hold is in force and it is a client's own request; false when it
    /// goes on as usual.
    mutating func holds(_ intake: Intake, now: ContinuousClock.Instant, into out: inout [Directive]) -> Bool {
        guard hold != nil, !Self.isDerived(intake.header) else { return false }
        let bytes = intake.payload.byteCount + Self.waiterBytes(intake)
        guard heldBytes + hold!.heldBytes + bytes <= configuration.maximumHeldBytes else {
            rejected += 1
            send(CanopyError(.busy, "the broker holds requests while a snapshot is taken, and holds \(hold!.heldBytes) bytes of them already; retry in a moment"),
                 to: intake, into: &out)
            return true
        }
        hold!.held.append((intake, now))
        hold!.heldBytes += bytes
        return true
    }

    /// A flight ended: one fewer to wait for before the cut.
    mutating func noteClosedForHold(_ flight: Flight) {
        guard hold != nil, !hold!.draining.isEmpty else { return }
        hold!.draining.remove(flight.id)
    }

    /// A held request its client cancelled: dropped unanswered, as a queued one would be.
    mutating func cancelHeld(client: [UInt8], correlation: [UInt8]) -> Bool {
        guard let index = hold?.held.firstIndex(where: { $0.intake.client == client && $0.intake.correlation == correlation }) else { return false }
        let removed = hold!.held.remove(at: index)
        hold!.heldBytes -= removed.intake.payload.byteCount + Self.waiterBytes(removed.intake)
        return true
    }

    /// Answers the waiting `capture.start` once drained, fails it past its deadline, and ends
    /// a hold that reached its limit.
    mutating func checkHold(now: ContinuousClock.Instant, into out: inout [Directive]) {
        guard let current = hold else { return }
        if let waiting = current.waiting {
            if current.draining.isEmpty {
                hold!.waiting = nil
                hold!.releaseAt = now + current.limit
                out.append(.captureControl(.cut, client: waiting.client, correlation: waiting.correlation))
            } else if now >= current.drainDeadline {
                let error = CanopyError(.timeout, "\(current.draining.count) request(s) in the air were not answered within the hold's limit, so no cut could be made; no snapshot was taken (try again when the stack is less busy, or with a longer hold)")
                releaseHold(snapshot: nil, failing: error, now: now, into: &out)
            }
            return
        }
        if now >= current.releaseAt {
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
        if let waiting = current.waiting {
            let error = failing ?? CanopyError(.conflict, "the capture was stopped before the requests in the air were answered; no snapshot was taken")
            out.append(.captureControl(.holdFailed(error, stopCapture: failing != nil && current.forCapture), client: waiting.client, correlation: waiting.correlation))
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

    /// The mark record: the snapshot is consistent with the capture up to here (every request
    /// recorded after it came after the cut).
    func capturedMark(snapshot: String?, held: Int) -> CaptureEvent {
        let body = (try? codec.encode(CaptureMark(snapshot: snapshot, held: held))) ?? []
        return CaptureEvent(record: CaptureRecord(kind: .mark, time: 0, client: "", service: Broker.service, operation: "mark", correlation: [],
                                                  header: RequestHeader(timeoutMilliseconds: 0), body: body), clientIdentity: [])
    }
}
