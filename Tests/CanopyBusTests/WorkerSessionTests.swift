import CanopyBus
import CanopyMessages
import Testing

/// The worker's protocol logic, driven without sockets or sleeps: the time is an argument.
struct WorkerSessionTests {
    static let operations = [OperationDescriptor(name: "get", idempotent: true, coalescable: false)]
    let start = ContinuousClock.now

    func session(credit: Int = 4) -> WorkerSession {
        WorkerSession(
            settings: .init(
                service: "plants", operations: Self.operations, credit: credit, heartbeatInterval: .seconds(1), liveness: 3,
                drainTimeout: .seconds(5)), now: start)
    }

    func dispatch(_ id: UInt64, body: String = "{}", attachments: [[UInt8]] = []) -> [[UInt8]] {
        WireMessage.dispatch(
            requestID: id, operation: "get", header: RequestHeader(timeoutMilliseconds: 1_000), body: Array(body.utf8),
            attachments: attachments
        ).encoded
    }

    func sent(_ directives: [WorkerSession.Directive]) -> [WireMessage] {
        directives.compactMap { if case .send(let message) = $0 { message } else { nil } }
    }

    @Test func aBatchOfRequestsStartsEachAndEachAnswerGoesBackOnItsOwn() {
        var worker = session()
        _ = worker.connected(now: start)
        let header = RequestHeader(timeoutMilliseconds: 1_000)
        let batch = WireMessage.dispatchBatch([
            .init(requestID: 7, operation: "get", header: header, body: Array("{\"a\":1}".utf8)),
            .init(requestID: 8, operation: "get", header: header, body: Array("{\"b\":2}".utf8)),
        ])
        let out = worker.receive(batch.encoded, now: start)
        #expect(
            out == [
                .start(id: 7, operation: "get", header: header, payload: Payload(body: Array("{\"a\":1}".utf8))),
                .start(id: 8, operation: "get", header: header, payload: Payload(body: Array("{\"b\":2}".utf8))),
            ])
        #expect(worker.running == [7: "get", 8: "get"])
        #expect(sent(worker.finished(id: 8, connection: 0, .success(Payload(body: [1])))) == [.workerReply(requestID: 8, failed: false, body: [1])])
        #expect(worker.running == [7: "get"])
    }

    @Test func aConnectionAnnouncesTheServiceAndIsRegisteredOnceTheBrokerBeats() {
        var worker = session(credit: 6)
        #expect(sent(worker.connected(now: start)) == [.ready(service: "plants", operations: Self.operations, credit: 6)])
        #expect(!worker.isRegistered)
        _ = worker.receive(WireMessage.brokerHeartbeat(maximumFrameBytes: 65_536).encoded, now: start)
        #expect(worker.isRegistered)
        #expect(worker.maximumReplyBytes == 65_536)
    }

    @Test func aDispatchStartsAHandlerAndItsResultGoesBackWithItsAttachments() {
        var worker = session()
        _ = worker.connected(now: start)
        let started = worker.receive(dispatch(7, body: #"{"id":1}"#, attachments: [[0xFF]]), now: start)
        #expect(
            started == [
                .start(
                    id: 7, operation: "get", header: RequestHeader(timeoutMilliseconds: 1_000),
                    payload: Payload(body: Array(#"{"id":1}"#.utf8), attachments: [[0xFF]]))
            ])
        #expect(worker.running == [7: "get"])
        let replied = worker.finished(id: 7, connection: 0, .success(Payload(body: Array("{}".utf8), attachments: [[1, 2]])))
        #expect(sent(replied) == [.workerReply(requestID: 7, failed: false, body: Array("{}".utf8), attachments: [[1, 2]])])
        #expect(worker.running.isEmpty)
        #expect(worker.finished(id: 7, connection: 0, .success(Payload(body: []))).isEmpty, "answered once")
    }

    @Test func aReplyOverTheBrokersFrameLimitIsAnsweredTooLargeInstead() throws {
        var worker = session()
        _ = worker.connected(now: start)
        _ = worker.receive(WireMessage.brokerHeartbeat(maximumFrameBytes: 2_048).encoded, now: start)
        _ = worker.receive(dispatch(1), now: start)
        let replied = sent(worker.finished(id: 1, connection: 0, .success(Payload(body: [], attachments: [[UInt8](repeating: 0, count: 4_096)]))))
        guard case .workerReply(1, true, let body, [])? = replied.first else {
            Issue.record("not refused: \(replied)")
            return
        }
        let error = try MessageCodec().decode(CanopyError.self, from: body)
        #expect(error.code == .tooLarge && error.message.contains("2048"))
    }

    @Test func aSilentBrokerIsLeftAfterLivenessBeatsAndItsRequestsAreCancelled() {
        var worker = session()
        _ = worker.connected(now: start)
        _ = worker.receive(WireMessage.brokerHeartbeat(maximumFrameBytes: 1 << 24).encoded, now: start)
        _ = worker.receive(dispatch(3), now: start)
        #expect(sent(worker.tick(now: start + .seconds(1))) == [.workerHeartbeat], "heartbeats every interval")
        #expect(sent(worker.tick(now: start + .seconds(2))) == [.workerHeartbeat])
        #expect(worker.tick(now: start + .milliseconds(2_900)).isEmpty)
        let out = worker.tick(now: start + .milliseconds(3_100))
        #expect(out == [.log(.brokerSilent), .cancel(id: 3), .reconnect(backoff: .zero)])
        #expect(!worker.isRegistered && worker.running.isEmpty && worker.connection == 1)
        // A handler of the old connection finishing later sends nothing.
        #expect(worker.finished(id: 3, connection: 0, .success(Payload(body: []))).isEmpty)
    }

    @Test func refusalsInARowBackOffUpToFiveSecondsAndAnAcceptedReadyResetsThem() {
        var worker = session()
        var backoffs: [Duration] = []
        var now = start
        for _ in 0..<9 {
            _ = worker.connected(now: now)
            _ = worker.receive(WireMessage.brokerDisconnect(reason: "this worker's CURVE key may not serve 'plants'").encoded, now: now)
            #expect(worker.disconnected)
            for directive in worker.tick(now: now) { if case .reconnect(let backoff) = directive { backoffs.append(backoff) } }
            now += .milliseconds(10)
        }
        #expect(
            backoffs == [
                .zero, .milliseconds(100), .milliseconds(200), .milliseconds(400), .milliseconds(800), .milliseconds(1_600),
                .milliseconds(3_200), .milliseconds(5_000), .milliseconds(5_000),
            ])
        _ = worker.connected(now: now)
        _ = worker.receive(WireMessage.brokerHeartbeat(maximumFrameBytes: 1 << 24).encoded, now: now)
        _ = worker.receive(WireMessage.brokerDisconnect(reason: "broker shutting down").encoded, now: now)
        #expect(worker.tick(now: now).last == .reconnect(backoff: .zero), "one refusal after an accepted READY does not wait")
    }

    @Test func aDrainWaitsForRunningHandlersThenDisconnects() {
        var worker = session()
        _ = worker.connected(now: start)
        _ = worker.receive(dispatch(1), now: start)
        #expect(sent(worker.shutdown(now: start)) == [.drain])
        #expect(worker.shutdown(now: start).isEmpty, "once")
        #expect(!worker.tick(now: start + .milliseconds(500)).contains(.stop), "a handler still runs")
        _ = worker.finished(id: 1, connection: 0, .failure(CanopyError(.notFound, "no such plant")))
        let out = worker.tick(now: start + .milliseconds(600))
        #expect(sent(out) == [.workerDisconnect])
        #expect(out.last == .stop)
    }

    @Test func aDrainThatRunsOutAbandonsWhatIsStillRunning() {
        var worker = session()
        _ = worker.connected(now: start)
        _ = worker.receive(dispatch(1), now: start)
        _ = worker.receive(dispatch(2), now: start)
        _ = worker.shutdown(now: start)
        #expect(worker.nextWakeup <= start + .seconds(1))
        let out = worker.tick(now: start + .seconds(5))
        #expect(out == [.send(.workerDisconnect), .log(.stopped(abandoned: 2)), .cancel(id: 1), .cancel(id: 2), .stop])
    }

    @Test func malformedOrMisdirectedMessagesAreDroppedWithAReason() {
        var worker = session()
        _ = worker.connected(now: start)
        #expect(
            worker.receive([Array("canopy/1".utf8), [0x20]], now: start) == [
                .log(.dropped(reason: "malformed message from the broker: message without the \(Wire.versionText) version frame"))
            ])
        #expect(
            worker.receive(WireMessage.reply(correlation: [1], shared: false, body: []).encoded, now: start) == [
                .log(.dropped(reason: "command not sent to workers"))
            ])
        #expect(worker.receive(WireMessage.cancelDispatch(requestID: 99).encoded, now: start).isEmpty, "a cancel for nothing held")
    }
}
