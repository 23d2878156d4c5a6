import CanopyBroker
import CanopyMessages
import CanopyTesting
import CanopyWire
import Testing

/// The broker's state machine driven at random (many clients, workers that answer in any
/// order, come and go; cancels, expiries, coalesced flights, late answers for requests whose
/// callers left) against a model of what each caller must hear: every request it did not
/// cancel answered exactly once, with its own answer, never another caller's.
struct BrokerModelTests {
    /// A caller's name for one request.
    struct Call: Hashable {
        let client: String
        let correlation: [UInt8]
    }

    struct Expected {
        let answer: String
        let deadline: ContinuousClock.Instant
    }

    @Test(arguments: [41, 42, 43] as [UInt64])
    func randomTrafficIsAnsweredOnceToTheRightCallerAndLeavesNothingHeld(seed: UInt64) async throws {
        var random = SeededRandom(seed: seed)
        var harness = BrokerHarness { $0.maximumQueuedPerService = 40 }
        let operations = [
            OperationDescriptor(name: "get", idempotent: true, coalescable: true),
            OperationDescriptor(name: "add", idempotent: false, coalescable: false),
        ]
        let workers = (0..<4).map { "worker-\($0)" }
        var connected = Set<String>()
        var held: [String: [(id: UInt64, body: String)]] = [:] // what each worker holds, answered or not
        var outstanding: [Call: Expected] = [:]
        var nextCorrelation: [String: UInt64] = [:]
        var answers = 0, coalesced = 0, cancels = 0, lateAnswers = 0, expired = 0, lostWorkers = 0

        func check(_ directives: [BrokerState.Directive], _ step: Int, now: ContinuousClock.Instant) {
            for (peer, message) in messages(directives) {
                switch message {
                case .reply(let correlation, let shared, let body, _):
                    let call = Call(client: peer, correlation: correlation)
                    let expected = outstanding.removeValue(forKey: call)
                    #expect(expected != nil, "step \(step): \(peer) answered for a request it is not waiting for")
                    #expect(String(decoding: body, as: UTF8.self) == expected?.answer, "step \(step): another caller's answer")
                    answers += 1
                    if shared { coalesced += 1 }
                case .error(let correlation, let error):
                    let call = Call(client: peer, correlation: correlation)
                    let expected = outstanding.removeValue(forKey: call)
                    #expect(expected != nil, "step \(step): \(peer) told an error for a request it is not waiting for")
                    let code = (try? MessageCodec().decode(CanopyError.self, from: error))?.code
                    #expect([.timeout, .workerLost, .busy, .noWorkers].contains(code), "step \(step): \(String(describing: code))")
                    if code == .timeout {
                        expired += 1
                        #expect(now >= expected?.deadline ?? now, "step \(step): timed out before its deadline")
                    }
                case .dispatch(let id, _, _, let body, _):
                    #expect(connected.contains(peer), "step \(step): a request for a worker that left")
                    held[peer, default: []].append((id, String(decoding: body, as: UTF8.self)))
                case .cancelDispatch, .brokerHeartbeat, .brokerDisconnect:
                    break // a cancelled request is still answered by its worker, later (and dropped)
                default:
                    Issue.record("step \(step): the broker sent \(message.command) to \(peer)")
                }
            }
        }

        /// One of `items` at random, the same for the same seed (no set's or dictionary's order).
        func pick<T>(_ items: [T]) -> T? {
            items.isEmpty ? nil : items[Int(random.next() % UInt64(items.count))]
        }

        for worker in workers {
            check(harness.ready(worker, operations: operations, credit: 3), -1, now: harness.now)
            connected.insert(worker)
        }
        var lastHeartbeat = harness.now
        for step in 0..<12_000 {
            if step % 500 == 0 { await Task.yield() }
            switch random.next() % 16 {
            case 0..<6: // a request: mostly reads of a few popular bodies (they coalesce), some writes
                let client = "client-\(random.next() % 24)"
                let correlation = nextCorrelation[client, default: 1]
                nextCorrelation[client] = correlation + 1
                let write = random.next() % 4 == 0
                let body = write ? "{\"add\":\"\(client)-\(correlation)\"}" : "{\"get\":\(random.next() % 6)}"
                let timeout = UInt32(50 + random.next() % 400)
                let call = Call(client: client, correlation: Wire.frame(correlation))
                outstanding[call] = Expected(answer: "echo " + body, deadline: harness.now + .milliseconds(Int64(timeout)))
                check(harness.request(client, correlation, operation: write ? "add" : "get", timeoutMs: timeout, body: body), step, now: harness.now)
            case 6..<10: // a worker answers one of its requests, in any order
                guard let worker = pick(connected.sorted()), var list = held[worker], !list.isEmpty else { continue }
                let (id, body) = list.remove(at: Int(random.next() % UInt64(list.count)))
                held[worker] = list
                let before = harness.state.statistics(now: harness.now).staleAnswers ?? 0
                check(harness.reply(worker, request: id, body: "echo " + body), step, now: harness.now)
                if (harness.state.statistics(now: harness.now).staleAnswers ?? 0) > before { lateAnswers += 1 }
            case 10: // a caller gives up
                guard
                    let call = pick(
                        outstanding.keys.sorted { $0.client != $1.client ? $0.client < $1.client : $0.correlation.lexicographicallyPrecedes($1.correlation) })
                else { continue }
                outstanding[call] = nil
                cancels += 1
                check(harness.receive(WireMessage.cancel(correlation: call.correlation).encoded, from: call.client), step, now: harness.now)
            case 11 where random.next() % 8 == 0: // a worker dies; another takes its place later
                guard connected.count > 1, let worker = pick(connected.sorted()) else { continue }
                connected.remove(worker)
                held[worker] = nil
                lostWorkers += 1
                check(harness.receive(WireMessage.workerDisconnect.encoded, from: worker), step, now: harness.now)
            case 12 where connected.count < workers.count:
                let worker = workers.first { !connected.contains($0) }!
                connected.insert(worker)
                check(harness.ready(worker, operations: operations, credit: 3), step, now: harness.now)
            default: // time passes
                check(harness.advance(.milliseconds(Int64(random.next() % 20))), step, now: harness.now)
                if harness.now - lastHeartbeat > .milliseconds(500) {
                    lastHeartbeat = harness.now
                    for worker in connected { check(harness.receive(WireMessage.workerHeartbeat.encoded, from: worker), step, now: harness.now) }
                }
            }
            #expect(harness.state.pendingCount == outstanding.count, "step \(step): every request not answered is held, and nothing else")
            if step % 1_000 == 0 {
                #expect(outstanding.values.allSatisfy { $0.deadline + .milliseconds(20) >= harness.now }, "step \(step): a deadline passed unanswered")
            }
        }

        // The end: workers answer everything they hold, and every deadline passes.
        for worker in connected {
            for (id, body) in held[worker] ?? [] { check(harness.reply(worker, request: id, body: "echo " + body), 99_999, now: harness.now) }
            held[worker] = nil
        }
        check(harness.advance(.seconds(1)), 99_999, now: harness.now)
        for worker in connected {
            for (id, body) in held[worker] ?? [] { check(harness.reply(worker, request: id, body: "echo " + body), 99_999, now: harness.now) }
        }
        #expect(outstanding.isEmpty, "every request answered or given up: \(outstanding.count) left")
        #expect(harness.state.pendingCount == 0 && harness.state.flightCount == 0 && harness.state.heldBytes == 0)
        #expect(
            answers > 1_000 && coalesced > 50 && cancels > 100 && expired > 10 && lateAnswers > 10 && lostWorkers > 3,
            "the run covered every case: \(answers) answers, \(coalesced) shared, \(cancels) cancels, \(expired) expiries, \(lateAnswers) late answers dropped, \(lostWorkers) workers lost"
        )
    }
}
