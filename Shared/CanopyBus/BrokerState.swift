import CanopyMessages
import Collections
import Histogram

/// The broker's routing logic as a pure value: messages and clock ticks go in, frames to
/// send come out. It owns no socket and reads no clock; the time is always an argument,
/// so tests drive it without sockets or sleeps. ``BrokerServer`` is the IO shell.
///
/// Routing: requests go by service name to a worker of that service that declared the
/// operation and has credit, round robin; otherwise they wait in a bounded per-service
/// queue. Each request has a deadline. A dead worker's idempotent requests are sent once
/// more to another worker; its other requests are answered `workerLost`.
public struct BrokerState {
    /// Something the IO shell must do.
    public enum Directive: Equatable, Sendable {
        /// Send `frames` to the peer with routing identity `to`.
        case send(to: [UInt8], frames: [[UInt8]])
        /// A message was dropped or refused; the shell writes one log line.
        case log(String, peer: [UInt8])
    }

    /// A request the broker holds, queued or at a worker.
    struct Pending {
        let id: UInt64
        let client: [UInt8]
        let correlation: [UInt8]
        let service: ServiceEntry
        let operation: String
        let header: RequestHeader
        let body: [UInt8]
        let receivedAt: ContinuousClock.Instant
        let deadline: ContinuousClock.Instant
        var idempotent = false // from the worker's declaration, set at dispatch
        var worker: Worker?
        var dispatches = 0
    }

    /// A client's request, as the client names it. Hashes its bytes in bulk: `[UInt8]`'s own
    /// hashing goes byte by byte and showed at the top of the broker's profile.
    struct ClientKey: Hashable {
        let client: [UInt8]
        let correlation: [UInt8]

        func hash(into hasher: inout Hasher) {
            client.withUnsafeBytes { hasher.combine(bytes: $0) }
            correlation.withUnsafeBytes { hasher.combine(bytes: $0) }
        }
    }

    /// A peer's routing identity as a dictionary key, hashed in bulk.
    struct PeerKey: Hashable {
        let bytes: [UInt8]

        init(_ bytes: [UInt8]) { self.bytes = bytes }

        func hash(into hasher: inout Hasher) {
            bytes.withUnsafeBytes { hasher.combine(bytes: $0) }
        }
    }

    // Workers and services are reference types inside the state: one dictionary lookup per
    // message, then changes in place (copy-on-write copies of these showed in the profile).
    // The state as a whole is owned by one loop and never copied.

    /// A connected worker.
    final class Worker {
        let identity: PeerKey
        let service: ServiceEntry
        let operations: [String: OperationDescriptor]
        let credit: Int
        var held: Set<UInt64> = []
        var expiry: ContinuousClock.Instant
        var draining = false

        init(identity: PeerKey, service: ServiceEntry, operations: [String: OperationDescriptor], credit: Int, expiry: ContinuousClock.Instant) {
            self.identity = identity
            self.service = service
            self.operations = operations
            self.credit = credit
            self.expiry = expiry
        }

        var available: Int { draining ? 0 : credit - held.count }
    }

    /// A service: its workers in round-robin order, its queue and its counters.
    final class ServiceEntry {
        let name: String
        var workers: [Worker] = []
        var cursor = 0
        var queue: Deque<UInt64> = []
        var inFlight = 0
        var served: UInt64 = 0
        var errors: UInt64 = 0
        var latencyMicros = Histogram<UInt64>(highestTrackableValue: 3_600_000_000, numberOfSignificantValueDigits: .two)

        init(name: String) { self.name = name }

        /// The next worker in round-robin order that has credit and serves `operation`.
        func freeWorker(for operation: String) -> Worker? {
            let count = workers.count
            for step in 0..<count {
                let index = (cursor + step) % count
                let worker = workers[index]
                if worker.available > 0, worker.operations[operation] != nil {
                    cursor = (index + 1) % count
                    return worker
                }
            }
            return nil
        }

        /// The flags of `operation` as the service's workers declared them.
        func describe(_ operation: String) -> OperationDescriptor? {
            for worker in workers {
                if let descriptor = worker.operations[operation] { return descriptor }
            }
            return nil
        }

        /// Every operation any of its workers declared.
        var operations: [OperationDescriptor] {
            var table: [String: OperationDescriptor] = [:]
            for worker in workers {
                table.merge(worker.operations) { first, _ in first }
            }
            return table.values.sorted { $0.name < $1.name }
        }
    }

    struct Deadline: Comparable {
        let at: ContinuousClock.Instant
        let request: UInt64
        static func < (lhs: Self, rhs: Self) -> Bool { lhs.at < rhs.at }
    }

    /// The settings in force.
    public let configuration: BrokerConfiguration
    private let startedAt: ContinuousClock.Instant
    private var services: [String: ServiceEntry] = [:]
    private var workers: [PeerKey: Worker] = [:]
    private var requests: [UInt64: Pending] = [:]
    private var byClient: [ClientKey: UInt64] = [:]
    private var deadlines = Heap<Deadline>()
    private var nextRequestID: UInt64 = 1
    private var nextHeartbeat: ContinuousClock.Instant
    private var rejected: UInt64 = 0
    private var shuttingDown = false
    /// Until then, requests for services no worker has registered yet wait in a queue
    /// instead of being answered `noWorkers`: after a broker restart, clients reconnect
    /// before workers do.
    private var startupGraceEnds: ContinuousClock.Instant?
    private let codec = MessageCodec()

    /// - Parameters:
    ///   - configuration: the broker's tunables.
    ///   - now: the time the broker starts.
    public init(configuration: BrokerConfiguration, now: ContinuousClock.Instant) {
        self.configuration = configuration
        self.startedAt = now
        self.nextHeartbeat = now + configuration.heartbeatInterval
        self.startupGraceEnds = now + configuration.workerExpiry
    }

    // MARK: - Queries

    /// Requests held now, queued or at a worker.
    public var pendingCount: Int { requests.count }

    /// Workers connected now.
    public var workerCount: Int { workers.count }

    /// When ``tick(now:into:)`` next has work: the next heartbeat or deadline.
    public mutating func nextWakeup() -> ContinuousClock.Instant {
        var wakeup = nextHeartbeat
        while let first = deadlines.min, requests[first.request]?.deadline != first.at {
            deadlines.removeMin() // answered already; drop lazily
        }
        if let first = deadlines.min, first.at < wakeup { wakeup = first.at }
        return wakeup
    }

    // MARK: - Input

    /// Handles one message from a peer. `frames` excludes the identity frame the ROUTER adds.
    public mutating func receive(_ frames: [[UInt8]], from peer: [UInt8], now: ContinuousClock.Instant, into out: inout [Directive]) {
        guard frames.count >= 2, frames[0] == Wire.version else {
            refuseVersion(frames, from: peer, into: &out)
            return
        }
        guard frames[1].count == 1, let command = Wire.Command(rawValue: frames[1][0]) else {
            out.append(.log("unknown command", peer: peer))
            replyError(to: peer, correlation: frames.count > 2 ? frames[2] : [], CanopyError(.badRequest, "unknown command frame; this broker speaks \(versionText) (see docs/PROTOCOL.md)"), into: &out)
            return
        }
        if let oversized = frames.first(where: { $0.count > configuration.maximumFrameBytes }) {
            out.append(.log("frame over the size limit", peer: peer))
            let correlation = command == .request && frames.count > 2 ? frames[2] : []
            replyError(to: peer, correlation: correlation, CanopyError(.tooLarge, "a frame of \(oversized.count) bytes is over the broker's limit of \(configuration.maximumFrameBytes) bytes; send less per request or raise --max-frame-bytes"), into: &out)
            return
        }
        switch command {
        case .request: clientRequest(frames, from: peer, now: now, into: &out)
        case .cancel: clientCancel(frames, from: peer, into: &out)
        case .ready: workerReady(frames, from: PeerKey(peer), now: now, into: &out)
        case .workerReply: workerReply(frames, from: PeerKey(peer), now: now, into: &out)
        case .workerHeartbeat: workerHeartbeat(from: PeerKey(peer), now: now, into: &out)
        case .workerDisconnect: workerGone(PeerKey(peer), now: now, into: &out)
        case .drain: workerDrain(from: PeerKey(peer), now: now, into: &out)
        case .reply, .error, .dispatch, .cancelDispatch, .brokerHeartbeat, .brokerDisconnect:
            out.append(.log("command not accepted by a broker", peer: peer))
            replyError(to: peer, correlation: [], CanopyError(.badRequest, "command 0x\(String(command.rawValue, radix: 16)) is sent by the broker, not to it"), into: &out)
        }
    }

    /// Expires deadlines and, when due, sends heartbeats and expires silent workers.
    public mutating func tick(now: ContinuousClock.Instant, into out: inout [Directive]) {
        while let first = deadlines.min, first.at <= now {
            deadlines.removeMin()
            guard let request = requests[first.request], request.deadline == first.at else { continue }
            expire(request, into: &out)
        }
        if let graceEnds = startupGraceEnds, now >= graceEnds {
            startupGraceEnds = nil
            endStartupGrace(now: now, into: &out)
        }
        guard now >= nextHeartbeat else { return }
        nextHeartbeat = now + configuration.heartbeatInterval
        let heartbeat = [Wire.version, Wire.Command.brokerHeartbeat.frame]
        for worker in workers.values {
            out.append(.send(to: worker.identity.bytes, frames: heartbeat))
        }
        for worker in workers.values where worker.expiry < now {
            out.append(.log("worker expired after missed heartbeats", peer: worker.identity.bytes))
            workerGone(worker.identity, now: now, into: &out)
        }
    }

    /// Stops taking new requests (they are answered `busy`); held ones are still answered.
    public mutating func beginShutdown() {
        shuttingDown = true
    }

    /// Tells every worker to go away; called last in a graceful shutdown.
    public mutating func disconnectAll(into out: inout [Directive]) {
        for worker in workers.values {
            out.append(.send(to: worker.identity.bytes, frames: [Wire.version, Wire.Command.brokerDisconnect.frame, Array("broker shutting down".utf8)]))
        }
    }

    // MARK: - Clients

    private mutating func clientRequest(_ frames: [[UInt8]], from client: [UInt8], now: ContinuousClock.Instant, into out: inout [Directive]) {
        guard frames.count == 7 else {
            rejected += 1
            out.append(.log("malformed request", peer: client))
            replyError(to: client, correlation: frames.count > 2 ? frames[2] : [], CanopyError(.badRequest, "a request has 7 frames (version, command, correlation, service, operation, header, body), got \(frames.count)"), into: &out)
            return
        }
        let correlation = frames[2]
        guard !correlation.isEmpty, correlation.count <= Wire.maximumCorrelationLength else {
            rejected += 1
            replyError(to: client, correlation: [], CanopyError(.badRequest, "the correlation id must be 1 to \(Wire.maximumCorrelationLength) bytes"), into: &out)
            return
        }
        guard Wire.isValidName(frames[3]), Wire.isValidName(frames[4]) else {
            rejected += 1
            replyError(to: client, correlation: correlation, CanopyError(.badRequest, "service and operation names are 1 to \(Wire.maximumNameLength) characters of a-z, 0-9, '.', '-' and '_'"), into: &out)
            return
        }
        guard let header = RequestHeader(frame: frames[5]) else {
            rejected += 1
            replyError(to: client, correlation: correlation, CanopyError(.badRequest, "the header frame is malformed: 4-byte timeout, 1 flags byte, then a UTF-8 principal of at most 256 bytes"), into: &out)
            return
        }
        let serviceName = String(decoding: frames[3], as: UTF8.self)
        let operation = String(decoding: frames[4], as: UTF8.self)
        let key = ClientKey(client: client, correlation: correlation)
        guard byClient[key] == nil else {
            return // the same request again (a client resending after a reconnect): the first will be answered
        }
        if serviceName == Broker.service {
            management(operation, to: client, correlation: correlation, now: now, into: &out)
            return
        }
        if shuttingDown {
            rejected += 1
            replyError(to: client, correlation: correlation, CanopyError(.busy, "the broker is shutting down; retry in a moment"), into: &out)
            return
        }
        let service: ServiceEntry
        if let known = services[serviceName] {
            service = known
        } else if startupGraceEnds != nil {
            service = ServiceEntry(name: serviceName) // its workers are expected to register soon
            services[serviceName] = service
        } else {
            rejected += 1
            replyError(to: client, correlation: correlation, CanopyError(.noWorkers, "no worker serves '\(serviceName)'; start one (canopy services lists what is connected)"), into: &out)
            return
        }
        guard service.describe(operation) != nil || (service.workers.isEmpty && startupGraceEnds != nil) else {
            rejected += 1
            service.errors += 1
            let known = service.operations.map(\.name).joined(separator: ", ")
            replyError(to: client, correlation: correlation, CanopyError(.badRequest, "service '\(serviceName)' has no operation '\(operation)'; it has: \(known)"), into: &out)
            return
        }
        var timeout = header.timeoutMilliseconds == 0 ? configuration.defaultTimeout : .milliseconds(Int64(header.timeoutMilliseconds))
        timeout = min(timeout, configuration.maximumTimeout)
        let request = Pending(
            id: nextRequestID, client: client, correlation: correlation, service: service, operation: operation,
            header: header, body: frames[6], receivedAt: now, deadline: now + timeout)
        nextRequestID += 1

        if let worker = service.freeWorker(for: operation) {
            admit(request, key: key)
            dispatch(request, to: worker, now: now, into: &out)
        } else if service.queue.count < configuration.maximumQueuedPerService {
            admit(request, key: key)
            service.queue.append(request.id)
        } else {
            rejected += 1
            service.errors += 1
            replyError(to: client, correlation: correlation, CanopyError(.busy, "'\(serviceName)' has \(configuration.maximumQueuedPerService) requests waiting already; retry later or start more workers"), into: &out)
        }
    }

    private mutating func admit(_ request: Pending, key: ClientKey) {
        requests[request.id] = request
        byClient[key] = request.id
        deadlines.insert(Deadline(at: request.deadline, request: request.id))
    }

    private mutating func clientCancel(_ frames: [[UInt8]], from client: [UInt8], into out: inout [Directive]) {
        guard frames.count == 3, let id = byClient[ClientKey(client: client, correlation: frames[2])], let request = requests[id] else {
            return // nothing held under that id: already answered, or never sent
        }
        forget(request, into: &out)
    }

    // MARK: - Workers

    private mutating func workerReady(_ frames: [[UInt8]], from peer: PeerKey, now: ContinuousClock.Instant, into out: inout [Directive]) {
        func refuse(_ reason: String) {
            out.append(.log("worker refused: \(reason)", peer: peer.bytes))
            out.append(.send(to: peer.bytes, frames: [Wire.version, Wire.Command.brokerDisconnect.frame, Array(reason.utf8)]))
        }
        guard frames.count == 5 else { return refuse("READY has 5 frames (version, command, service, operations, credit)") }
        guard Wire.isValidName(frames[2]) else { return refuse("invalid service name") }
        let name = String(decoding: frames[2], as: UTF8.self)
        guard name != Broker.service, !name.hasPrefix(Broker.service + ".") else {
            return refuse("the service name '\(Broker.service)' is reserved for the broker")
        }
        guard let operations = try? codec.decode([OperationDescriptor].self, from: frames[3]), !operations.isEmpty,
              operations.allSatisfy({ Wire.isValidName(Array($0.name.utf8)) })
        else { return refuse("the operations frame must be a non-empty JSON array of {name, idempotent, coalescable}") }
        guard let credit = Wire.uint32(frames[4]), credit >= 1, credit <= 100_000 else {
            return refuse("credit must be a 4-byte big-endian number from 1 to 100000")
        }
        if workers[peer] != nil { workerGone(peer, now: now, into: &out) }
        var table: [String: OperationDescriptor] = [:]
        for operation in operations {
            table[operation.name] = OperationDescriptor(name: operation.name, idempotent: operation.idempotent, coalescable: operation.coalescable && operation.idempotent)
        }
        let service = services[name] ?? ServiceEntry(name: name)
        services[name] = service
        let worker = Worker(identity: peer, service: service, operations: table, credit: Int(credit), expiry: now + configuration.workerExpiry)
        workers[peer] = worker
        service.workers.append(worker)
        dispatchQueued(service, now: now, into: &out)
    }

    private mutating func workerReply(_ frames: [[UInt8]], from peer: PeerKey, now: ContinuousClock.Instant, into out: inout [Directive]) {
        guard let worker = workers[peer] else { return unknownWorker(peer, into: &out) }
        worker.expiry = now + configuration.workerExpiry
        guard frames.count == 5, let id = Wire.uint64(frames[2]), frames[3].count == 1 else {
            out.append(.log("malformed worker reply", peer: peer.bytes))
            return
        }
        guard worker.held.remove(id) != nil else {
            out.append(.log("reply for a request the worker does not hold", peer: peer.bytes))
            return
        }
        let service = worker.service
        service.inFlight -= 1
        if let request = requests[id], request.worker === worker {
            finish(request, now: now)
            if frames[3][0] == Wire.Status.ok {
                service.served += 1
                out.append(.send(to: request.client, frames: [Wire.version, Wire.Command.reply.frame, request.correlation, [0], frames[4]]))
            } else {
                service.errors += 1
                let error = (try? codec.decode(CanopyError.self, from: frames[4])) ?? CanopyError(.internal, "the worker sent an unreadable error")
                replyError(to: request.client, correlation: request.correlation, error, into: &out)
            }
        }
        dispatchQueued(service, now: now, into: &out)
    }

    private mutating func workerHeartbeat(from peer: PeerKey, now: ContinuousClock.Instant, into out: inout [Directive]) {
        guard let worker = workers[peer] else { return unknownWorker(peer, into: &out) }
        worker.expiry = now + configuration.workerExpiry
    }

    private mutating func workerDrain(from peer: PeerKey, now: ContinuousClock.Instant, into out: inout [Directive]) {
        guard let worker = workers[peer] else { return unknownWorker(peer, into: &out) }
        worker.draining = true
        worker.expiry = now + configuration.workerExpiry
    }

    /// A worker the broker does not know (it registered with an earlier broker): tell it
    /// to register again.
    private func unknownWorker(_ peer: PeerKey, into out: inout [Directive]) {
        out.append(.send(to: peer.bytes, frames: [Wire.version, Wire.Command.brokerDisconnect.frame, Array("unknown worker; send READY again".utf8)]))
    }

    /// Removes a worker; its idempotent requests go once more to another worker, the rest
    /// are answered `workerLost`.
    private mutating func workerGone(_ peer: PeerKey, now: ContinuousClock.Instant, into out: inout [Directive]) {
        guard let worker = workers.removeValue(forKey: peer) else { return }
        let service = worker.service
        service.workers.removeAll { $0 === worker }
        service.inFlight -= worker.held.count
        var retry: [UInt64] = []
        for id in worker.held.sorted() {
            guard var request = requests[id], request.worker === worker else { continue }
            if request.idempotent && request.dispatches < 2 {
                request.worker = nil
                requests[id] = request
                retry.append(id)
            } else {
                finish(request, now: now)
                service.errors += 1
                let message = request.idempotent
                    ? "the request was lost with two workers in a row; it was not sent a third time"
                    : "the worker died while holding this request; it may or may not have run, and it is not idempotent, so it was not sent again"
                replyError(to: request.client, correlation: request.correlation, CanopyError(.workerLost, message), into: &out)
            }
        }
        service.queue.insert(contentsOf: retry, at: 0)
        if service.workers.isEmpty {
            services[service.name] = nil
            for id in service.queue {
                guard let request = requests[id] else { continue }
                finish(request, now: now)
                replyError(to: request.client, correlation: request.correlation, CanopyError(.noWorkers, "the last worker of '\(service.name)' went away before it could take this request"), into: &out)
            }
            service.queue.removeAll()
            return
        }
        dispatchQueued(service, now: now, into: &out)
    }

    /// After the start-up grace: requests still waiting for a service nobody registered are
    /// answered `noWorkers`, and those for an operation no worker declared `badRequest`.
    private mutating func endStartupGrace(now: ContinuousClock.Instant, into out: inout [Directive]) {
        for service in Array(services.values) {
            let waiting = service.queue
            for id in waiting {
                guard let request = requests[id] else { continue }
                if service.workers.isEmpty {
                    finish(request, now: now)
                    replyError(to: request.client, correlation: request.correlation, CanopyError(.noWorkers, "no worker serves '\(service.name)'; start one (canopy services lists what is connected)"), into: &out)
                } else if service.describe(request.operation) == nil {
                    finish(request, now: now)
                    service.errors += 1
                    replyError(to: request.client, correlation: request.correlation, CanopyError(.badRequest, "service '\(service.name)' has no operation '\(request.operation)'"), into: &out)
                }
            }
            service.queue.removeAll { requests[$0] == nil }
            if service.workers.isEmpty { services[service.name] = nil }
        }
    }

    // MARK: - Dispatch

    private mutating func dispatch(_ request: Pending, to worker: Worker, now: ContinuousClock.Instant, into out: inout [Directive]) {
        var request = request
        request.worker = worker
        request.idempotent = worker.operations[request.operation]?.idempotent ?? false
        request.dispatches += 1
        requests[request.id] = request
        worker.held.insert(request.id)
        request.service.inFlight += 1
        var header = request.header
        header.timeoutMilliseconds = UInt32(clamping: max(1, (request.deadline - now).milliseconds))
        out.append(.send(to: worker.identity.bytes, frames: [
            Wire.version, Wire.Command.dispatch.frame, Wire.frame(request.id), Array(request.operation.utf8), header.frame, request.body,
        ]))
    }

    /// Hands queued requests of `service` to workers with credit, oldest first.
    private mutating func dispatchQueued(_ service: ServiceEntry, now: ContinuousClock.Instant, into out: inout [Directive]) {
        guard !service.queue.isEmpty else { return }
        var kept: Deque<UInt64> = []
        while let id = service.queue.popFirst() {
            guard let request = requests[id] else { continue }
            if let worker = service.freeWorker(for: request.operation) {
                dispatch(request, to: worker, now: now, into: &out)
            } else {
                kept.append(id)
                if service.workers.allSatisfy({ $0.available == 0 }) { break }
            }
        }
        kept.append(contentsOf: service.queue)
        service.queue = kept
    }

    // MARK: - Answering

    private mutating func expire(_ request: Pending, into out: inout [Directive]) {
        request.service.errors += 1
        forget(request, into: &out)
        replyError(to: request.client, correlation: request.correlation, CanopyError(.timeout, "no reply from '\(request.service.name)' within the request's deadline; the service may be overloaded"), into: &out)
    }

    /// Drops a request without answering it: from the queue, or cancelled at its worker
    /// (which keeps the credit until it replies).
    private mutating func forget(_ request: Pending, into out: inout [Directive]) {
        if let worker = request.worker {
            out.append(.send(to: worker.identity.bytes, frames: [Wire.version, Wire.Command.cancelDispatch.frame, Wire.frame(request.id)]))
        } else if let index = request.service.queue.firstIndex(of: request.id) {
            request.service.queue.remove(at: index)
        }
        requests[request.id] = nil
        byClient[ClientKey(client: request.client, correlation: request.correlation)] = nil
    }

    /// Records a request as answered.
    private mutating func finish(_ request: Pending, now: ContinuousClock.Instant) {
        requests[request.id] = nil
        byClient[ClientKey(client: request.client, correlation: request.correlation)] = nil
        let micros = UInt64(max(0, (now - request.receivedAt).microseconds))
        _ = request.service.latencyMicros.record(micros)
    }

    private func replyError(to peer: [UInt8], correlation: [UInt8], _ error: CanopyError, into out: inout [Directive]) {
        let body = (try? codec.encode(error)) ?? Array(#"{"code":"internal","message":"unencodable error"}"#.utf8)
        out.append(.send(to: peer, frames: [Wire.version, Wire.Command.error.frame, correlation, body]))
    }

    private var versionText: String { String(decoding: Wire.version, as: UTF8.self) }

    private mutating func refuseVersion(_ frames: [[UInt8]], from peer: [UInt8], into out: inout [Directive]) {
        rejected += 1
        out.append(.log("message without the canopy/1 version frame", peer: peer))
        let correlation = frames.count > 2 && frames[2].count <= Wire.maximumCorrelationLength ? frames[2] : []
        let seen = frames.first.map { String(decoding: $0.prefix(32), as: UTF8.self) } ?? ""
        replyError(to: peer, correlation: correlation, CanopyError(.badRequest, "unsupported protocol version '\(seen)'; this broker speaks \(versionText)"), into: &out)
    }

    // MARK: - Management

    private mutating func management(_ operation: String, to client: [UInt8], correlation: [UInt8], now: ContinuousClock.Instant, into out: inout [Directive]) {
        let body: [UInt8]?
        switch operation {
        case Broker.Services.name: body = try? codec.encode(serviceDescriptions())
        case Broker.Stats.name: body = try? codec.encode(statistics(now: now))
        default:
            rejected += 1
            replyError(to: client, correlation: correlation, CanopyError(.badRequest, "the broker has no operation '\(operation)'; it has: services, stats"), into: &out)
            return
        }
        out.append(.send(to: client, frames: [Wire.version, Wire.Command.reply.frame, correlation, [0], body ?? []]))
    }

    /// What `broker.services` answers.
    public func serviceDescriptions() -> [ServiceDescription] {
        services.values.filter { !$0.workers.isEmpty }.sorted { $0.name < $1.name }.map { service in
            ServiceDescription(name: service.name, workers: service.workers.count, operations: service.operations)
        }
    }

    /// What `broker.stats` answers.
    public func statistics(now: ContinuousClock.Instant) -> BrokerStatistics {
        let entries = services.values.sorted { $0.name < $1.name }.map { service in
            let histogram = service.latencyMicros
            return ServiceStatistics(
                name: service.name, workers: service.workers.count, queued: service.queue.count, inFlight: service.inFlight,
                served: service.served, errors: service.errors,
                p50Micros: histogram.totalCount == 0 ? 0 : histogram.valueAtPercentile(50),
                p99Micros: histogram.totalCount == 0 ? 0 : histogram.valueAtPercentile(99))
        }
        let uptime = now - startedAt
        return BrokerStatistics(uptimeSeconds: Double(uptime.components.seconds) + Double(uptime.components.attoseconds) / 1e18, rejected: rejected, services: entries)
    }
}

extension Duration {
    /// Whole microseconds, rounded down.
    var microseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000 + attoseconds / 1_000_000_000_000
    }
}
