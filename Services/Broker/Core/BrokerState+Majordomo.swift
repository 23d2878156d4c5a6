import CanopyMessages
import CanopyWire

// Majordomo (7/MDP) peers routed like Canopy's: a client's request admitted as any other
// (read by ``BrokerState/MajordomoBridge``), a worker's READY, replies and heartbeats.

extension BrokerState {
    /// A Majordomo (7/MDP) message: `["", "MDPC01" | "MDPW01", ...]`.
    mutating func receiveMajordomo(_ frames: [[UInt8]], from peer: [UInt8], key: String?, now: ContinuousClock.Instant, into out: inout [Directive]) {
        let message: MajordomoMessage
        do {
            message = try MajordomoMessage(frames: frames)
        } catch {
            // A Majordomo client's error must name a valid service, and a worker gets no errors.
            return dropMalformed("malformed Majordomo message: \(error.reason.rawValue)", peer: peer, into: &out)
        }
        if case .reply = message {
            // An oversized reply still answers its callers; majordomoWorker checks it.
        } else if let oversized = frames.first(where: { $0.count > configuration.maximumFrameBytes }) {
            rejected += 1
            out.append(.log("frame over the size limit", peer: peer))
            if case .client(let service, _) = message {
                out.append(.sendMajordomo(to: peer, .client(service: service, body: MajordomoBridge.errorBody(tooLarge(oversized.count), codec: codec))))
            }
            return
        }
        if case .client(let service, let body) = message {
            // Its identity kept once, as a Canopy client's is: the loop's receive buffer stays its own.
            majordomoClient(service: service, body: body, from: clientNames.intern(peer, now: now), now: now, into: &out)
        } else {
            majordomoWorker(message, from: PeerKey(peer), key: key, now: now, into: &out)
        }
    }

    private mutating func majordomoClient(service: [UInt8], body: [[UInt8]], from client: [UInt8], now: ContinuousClock.Instant, into out: inout [Directive]) {
        let workers = self.workers
        switch MajordomoBridge.clientRequest(
            service: service, body: body, from: client, dialect: { workers.service($0)?.dialect },
            hasWorkers: { workers.service($0)?.workers.isEmpty == false }, codec: codec)
        {
        case .intake(let intake):
            admit(intake, now: now, into: &out)
        case .answer(let frames, let refused):
            if refused { rejected += 1 }
            out.append(.sendMajordomo(to: client, .client(service: service, body: frames)))
        }
    }

    private mutating func majordomoWorker(
        _ message: MajordomoMessage, from peer: PeerKey, key: String?, now: ContinuousClock.Instant, into out: inout [Directive]
    ) {
        // A worker's messages must come with the key it registered with (an identity is not proof).
        let known = workers[peer].flatMap { $0.dialect == .majordomo && !keys.impersonates($0, key: key) ? $0 : nil }
        switch message {
        case .ready(let service):
            func refuse(_ reason: String) {
                out.append(.log("worker refused: \(reason)", peer: peer.bytes))
                out.append(.sendMajordomo(to: peer.bytes, .disconnect))
            }
            guard let name = KeyPolicy.serviceName(service) else { return refuse("invalid or reserved Majordomo service name") }
            if let reason = keys.unauthorizedWorker(key, service: name) { return refuse(reason) }
            let coalesced = configuration.majordomoCoalescedServices.contains(name)
            if let reason = register(
                peer, dialect: .majordomo, service: name, operations: [:],
                majordomoDescriptor: MajordomoBridge.workerDescriptor(coalesced: coalesced),
                credit: 1, key: key, now: now, into: &out)
            {
                refuse(reason)
            }
        case .reply(let client, let body):
            guard let worker = known else { return out.append(.sendMajordomo(to: peer.bytes, .disconnect)) }
            worker.expiry = now + workerExpiry
            guard let id = Wire.uint64(client) else {
                return dropMalformed("malformed Majordomo reply", peer: peer.bytes, into: &out)
            }
            if let oversized = body.first(where: { $0.count > configuration.maximumFrameBytes }) {
                rejected += 1
                out.append(.log("worker reply over the size limit", peer: peer.bytes))
                return complete(id, by: worker, .failure(oversizedReply(oversized.count, flight: id)), now: now, into: &out)
            }
            complete(id, by: worker, .reply(Payload(frames: body), fromMajordomo: true), now: now, into: &out)
        case .heartbeat:
            guard let worker = known else { return out.append(.sendMajordomo(to: peer.bytes, .disconnect)) }
            worker.expiry = now + workerExpiry
        case .disconnect:
            if known != nil { workerGone(peer, now: now, into: &out) }
        case .request, .client:
            dropMalformed("Majordomo REQUEST is sent by the broker, not to it", peer: peer.bytes, into: &out)
        }
    }
}
