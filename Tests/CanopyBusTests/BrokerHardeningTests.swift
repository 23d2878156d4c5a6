import CanopyBroker
import CanopyBus
import CanopyMessages
import Testing

/// What a hostile or careless peer tried against the broker, driven without sockets: an
/// oversized reply, Unicode-equivalent principals, a peer pretending to be a worker, bursts
/// that must be bounded by bytes, and floods of malformed messages.
struct BrokerHardeningTests {
    typealias Harness = BrokerHarness

    // MARK: - Oversized replies

    @Test func anOversizedWorkerReplyAnswersTheCallerTooLargeAtOnceAndGivesTheCreditBack() {
        var broker = Harness { $0.maximumFrameBytes = 1024 }
        broker.ready("w1", credit: 1)
        let first = dispatches(broker.request("c", 1))
        #expect(first.count == 1)
        #expect(dispatches(broker.request("c", 2)).isEmpty, "credit 1: the second waits")
        let out = broker.reply("w1", request: first[0].id, body: String(repeating: "x", count: 5000))
        let refused = errors(out)
        #expect(refused.map(\.client) == ["c"])
        #expect(refused.map(\.correlation) == [Wire.frame(UInt64(1))])
        #expect(refused.first?.error.code == .tooLarge)
        #expect(refused.first?.error.message.contains("plants.get") == true)
        #expect(errors(out).allSatisfy { $0.client != "w1" }, "the worker is not answered; its caller is")
        #expect(dispatches(out).count == 1, "the credit came back: the queued request went out")
        // Many oversized replies in a row never wedge the worker.
        var next = dispatches(out)[0].id
        for n in 3...20 {
            _ = broker.request("c", UInt64(n))
            next = dispatches(broker.reply("w1", request: next, body: String(repeating: "y", count: 5000)))[0].id
        }
        #expect(replies(broker.reply("w1", request: next)).count == 1)
    }

    @Test func anOversizedMajordomoReplyAnswersTheCallerToo() {
        var broker = Harness { $0.maximumFrameBytes = 1024 }
        _ = broker.receive([[], Majordomo.worker, [0x01], Array("legacy".utf8)], from: "mw")
        let request = sends(broker.request("c", 1, service: "legacy", operation: "x")).first { $0.peer == "mw" }!.frames
        let out = broker.receive([[], Majordomo.worker, [0x03], request[3], [], [UInt8](repeating: 1, count: 5000)], from: "mw")
        #expect(errors(out).map(\.error.code) == [.tooLarge])
        #expect(sends(broker.request("c", 2, service: "legacy", operation: "x")).contains { $0.peer == "mw" }, "its one credit came back")
    }

    @Test func aRegisteredWorkerHearsTheFrameLimitAtOnce() {
        var broker = Harness { $0.maximumFrameBytes = 65_536 }
        let heartbeat = sends(broker.ready("w1")).first { $0.frames[1] == Wire.Command.brokerHeartbeat.frame }
        #expect(heartbeat?.frames.count == 3)
        #expect(heartbeat.flatMap { Wire.uint64($0.frames[2]) } == 65_536)
    }

    // MARK: - Principals are bytes

    @Test func unicodeEquivalentPrincipalsAreRefusedNotMerged() {
        var broker = Harness()
        broker.ready("w1", operations: [OperationDescriptor(name: "get", idempotent: true, coalescable: true)])
        let nfc = broker.request("c1", 1, principal: "jos\u{E9}", body: #"{"sha256":"a"}"#)
        let nfd = broker.request("c2", 2, principal: "jose\u{301}", body: #"{"sha256":"a"}"#)
        let kelvin = broker.request("c3", 3, principal: "\u{212A}ate", body: #"{"sha256":"a"}"#)
        for out in [nfc, nfd, kelvin] {
            #expect(dispatches(out).isEmpty)
            #expect(errors(out).first?.error.code == .badRequest)
            #expect(errors(out).first?.error.message.contains("printable ASCII") == true)
        }
    }

    @Test func onlyTheSamePrincipalBytesShareAFlight() {
        var broker = Harness()
        broker.ready("w1", operations: [OperationDescriptor(name: "get", idempotent: true, coalescable: true)])
        #expect(dispatches(broker.request("c1", 1, principal: "Kate", body: "{}")).count == 1)
        #expect(dispatches(broker.request("c2", 2, principal: "kate", body: "{}")).count == 1, "case differs: another person")
        #expect(dispatches(broker.request("c3", 3, principal: "Kate", body: "{}")).isEmpty, "the same bytes join the flight")
    }

    @Test func principalsAreOneTo256BytesOfPrintableASCII() {
        #expect(RequestHeader.isValidPrincipal(Array("user-42".utf8)))
        #expect(RequestHeader.isValidPrincipal(Array("auth0|5f2c@example.org".utf8)))
        #expect(!RequestHeader.isValidPrincipal(Array("with space".utf8)))
        #expect(!RequestHeader.isValidPrincipal(Array("tab\t".utf8)))
        #expect(!RequestHeader.isValidPrincipal(Array("jos\u{E9}".utf8)))
        #expect(!RequestHeader.isValidPrincipal([UInt8](repeating: 0x61, count: 257)))
        #expect(RequestHeader(frame: RequestHeader(timeoutMilliseconds: 5, principal: "").frame)?.principal == "")
        #expect(RequestHeader(frame: [0, 0, 0, 5, 0] + Array("jose\u{301}".utf8)) == nil)
    }

    // MARK: - Who may serve

    @Test func withAnAllowListOnlyAllowedKeysRegisterAndOnlyForTheirServices() {
        let careKey = "careKEYcareKEYcareKEYcareKEYcareKEYcare0"
        let anyKey = "anyKEYanyKEYanyKEYanyKEYanyKEYanyKEYany0"
        var broker = Harness { $0.workerKeys = WorkerKeys([careKey: ["plants"], anyKey: ["*"]]) }
        for (peer, key) in [("nobody", nil), ("stranger", "strangerKEYstrangerKEYstrangerKEYstrang")] as [(String, String?)] {
            let refused = sends(broker.ready(peer, key: key))
            #expect(refused.map { $0.frames[1] } == [Wire.Command.brokerDisconnect.frame])
        }
        #expect(sends(broker.ready("care-on-images", service: "images", key: careKey)).map { $0.frames[1] } == [Wire.Command.brokerDisconnect.frame])
        #expect(broker.state.workerCount == 0)
        broker.ready("care", key: careKey)
        broker.ready("any", service: "images", key: anyKey)
        #expect(broker.state.workerCount == 2)
        // A refused peer's replies are not taken as answers.
        let sent = dispatches(broker.request("c", 1))
        #expect(sent.map(\.worker) == ["care"])
        #expect(replies(broker.reply("stranger", request: sent[0].id)).isEmpty)
        #expect(replies(broker.reply("care", request: sent[0].id, key: careKey)).count == 1)
    }

    @Test func aPeerWithAnotherKeyCannotSpeakForARegisteredWorker() {
        let workerKey = "careKEYcareKEYcareKEYcareKEYcareKEYcare0"
        let clientKey = "clntKEYclntKEYclntKEYclntKEYclntKEYclnt0"
        var broker = Harness { $0.workerKeys = WorkerKeys([workerKey: ["plants"]]) }
        broker.ready("w1", key: workerKey)
        let sent = dispatches(broker.request("c", 1))
        // The same routing identity, another key: its reply is not an answer.
        let forged = broker.receive(
            [Wire.version, Wire.Command.workerReply.frame, Wire.frame(sent[0].id), [Wire.Status.ok], Array("{}".utf8)],
            from: "w1", key: clientKey)
        #expect(replies(forged).isEmpty)
        #expect(broker.state.statistics(now: broker.now).malformed == 1)
        #expect(
            replies(
                broker.receive(
                    [Wire.version, Wire.Command.workerReply.frame, Wire.frame(sent[0].id), [Wire.Status.ok], Array("{}".utf8)],
                    from: "w1", key: workerKey)
            ).count == 1)
    }

    @Test func majordomoWorkersFollowTheSameAllowList() {
        let key = "mdpKEYmdpKEYmdpKEYmdpKEYmdpKEYmdpKEYmdp0"
        var broker = Harness { $0.workerKeys = WorkerKeys([key: ["legacy"]]) }
        let refused = sends(broker.receive([[], Majordomo.worker, [0x01], Array("legacy".utf8)], from: "mw", key: "otherKEYotherKEYotherKEYotherKEYotherKEY"))
        #expect(refused.map { $0.frames.count > 2 ? $0.frames[2] : [] } == [Majordomo.Command.disconnect.frame])
        #expect(broker.state.workerCount == 0)
        _ = broker.receive([[], Majordomo.worker, [0x01], Array("legacy".utf8)], from: "mw", key: key)
        #expect(broker.state.workerCount == 1)
    }

    // MARK: - Memory bounded by bytes

    @Test func aBurstOfSmallRequestsIsQueuedNotRefused() {
        // The Majordomo guide's mdclient2: 5,000 requests of 11 bytes at once to one worker.
        var broker = Harness()
        broker.ready("w1", credit: 1)
        var refused = 0
        for n in 1...5_000 {
            refused += errors(broker.request("c", UInt64(n), timeoutMs: 60_000, body: "hello world")).count
        }
        #expect(refused == 0)
        #expect(broker.state.statistics(now: broker.now).services[0].queued == 4_999)
    }

    @Test func queuedBytesPerServiceAreBounded() {
        var broker = Harness { $0.maximumQueuedBytesPerService = 10_000 }
        broker.ready("w1", credit: 1)
        let body = String(repeating: "x", count: 3_000)
        let outcomes = (1...6).map { errors(broker.request("c", UInt64($0), timeoutMs: 60_000, body: body)).first?.error.code }
        // One at the worker, three queued (9,000 bytes), the rest busy.
        #expect(outcomes == [nil, nil, nil, nil, .busy, .busy])
        let stats = broker.state.statistics(now: broker.now)
        // Each counts its body and what holding it costs besides (names, header, bookkeeping).
        #expect(stats.services[0].queuedBytes > 9_000 && stats.services[0].queuedBytes <= 10_000, "\(stats.services[0].queuedBytes)")
        #expect(stats.heldBytes > 12_000 && stats.heldBytes < 12_000 + 4 * 1_024, "\(stats.heldBytes)")
    }

    @Test func heldBytesAreBoundedAndGivenBackWhenRequestsEnd() {
        var broker = Harness { $0.maximumHeldBytes = 10_000 }
        broker.ready("w1", credit: 100) // a worker that never answers
        let body = String(repeating: "x", count: 4_000)
        let outcomes = (1...4).map { errors(broker.request("c", UInt64($0), timeoutMs: 1_000, body: body)).first?.error.code }
        #expect(outcomes == [nil, nil, .busy, .busy])
        #expect(broker.state.heldBytes > 8_000 && broker.state.heldBytes <= 10_000, "\(broker.state.heldBytes)")
        let expired = errors(broker.advance(.milliseconds(1_100)))
        #expect(expired.map(\.error.code) == [.timeout, .timeout])
        #expect(broker.state.heldBytes == 0, "timed-out requests no longer count")
        #expect(errors(broker.request("c", 9, body: body)).isEmpty)
    }

    @Test func theStartupGraceHoldsABoundedNumberOfUnknownServices() {
        var broker = Harness(fresh: true) { $0.maximumGraceServices = 3 }
        var codes: [CanopyError.Code?] = []
        for n in 1...5 {
            codes.append(errors(broker.request("c", UInt64(n), service: "invented-\(n)")).first?.error.code)
        }
        #expect(codes == [nil, nil, nil, .noWorkers, .noWorkers])
    }

    @Test func queuedBytesFollowDispatchRetryAndCancel() {
        var broker = Harness()
        broker.ready("w1", credit: 1)
        let first = dispatches(broker.request("c", 1, body: "12345"))
        let flightCost = 10 + 24 + "get".utf8.count + 32 + 256 // body, frame, operation, header, bookkeeping
        let waiterCost = (1 + 8) + "plants".utf8.count + 192 // client id and correlation, service name, bookkeeping
        _ = broker.request("c", 2, timeoutMs: 60_000, body: "1234567890")
        #expect(broker.state.statistics(now: broker.now).services[0].queuedBytes == flightCost)
        _ = broker.reply("w1", request: first[0].id) // the queued one goes out
        #expect(broker.state.statistics(now: broker.now).services[0].queuedBytes == 0)
        #expect(broker.state.heldBytes == flightCost + waiterCost)
        _ = broker.receive([Wire.version, Wire.Command.cancel.frame, Wire.frame(UInt64(2))], from: "c")
        #expect(broker.state.heldBytes == 0)
    }

    // MARK: - Outcomes

    @Test func everyAnsweredRequestIsCountedByItsOutcome() {
        var broker = Harness { $0.maximumQueuedPerService = 1 }
        broker.ready("w1", credit: 1)
        let first = dispatches(broker.request("c", 1, timeoutMs: 60_000))
        _ = broker.request("c", 2, timeoutMs: 100) // queued, then times out
        _ = broker.request("c", 3) // the queue is full: busy
        _ = broker.advance(.milliseconds(150))
        _ = broker.reply("w1", request: first[0].id)
        let failing = dispatches(broker.request("c", 4))
        _ = broker.reply("w1", request: failing[0].id, body: #"{"code":"notFound","message":"gone"}"#, status: Wire.Status.error)
        let get = broker.state.statistics(now: broker.now).operations.first { $0.operation == "get" }
        #expect(get?.outcomes == ["ok": 1, "timeout": 1, "busy": 1, "notFound": 1])
    }

    // MARK: - Malformed messages

    @Test func malformedMessagesAreCounted() {
        var broker = Harness()
        _ = broker.receive([Array("junk".utf8)], from: "x")
        _ = broker.receive([Wire.version, [0x7F]], from: "x")
        _ = broker.receive([Wire.version, Wire.Command.request.frame, [1]], from: "x")
        _ = broker.receive([Wire.version, Wire.Command.reply.frame], from: "x")
        let stats = broker.state.statistics(now: broker.now)
        #expect(stats.malformed == 4)
        #expect(stats.rejected >= 4)
    }

    @Test func repeatedWarningsAreWrittenAFewAtATimeAndTheRestCounted() {
        var limiter = LogRateLimiter(burst: 3, window: .seconds(10))
        let start = ContinuousClock.now
        let decisions = (0..<1_000).map { _ in limiter.decide("malformed request", now: start) }
        #expect(decisions.filter { $0 == .write }.count == 3)
        #expect(limiter.decide("another reason", now: start) == .write, "each reason has its own budget")
        #expect(limiter.endWindows(now: start + .seconds(5)).isEmpty, "the window is not over")
        let report = limiter.endWindows(now: start + .seconds(10))
        #expect(report.map(\.reason) == ["malformed request"])
        #expect(report.map(\.suppressed) == [997])
        #expect(limiter.decide("malformed request", now: start + .seconds(11)) == .write, "a new window writes again")
    }
}
