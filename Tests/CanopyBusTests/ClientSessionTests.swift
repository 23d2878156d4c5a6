import CanopyBus
import CanopyMessages
import Testing

/// The client's protocol logic, driven without sockets or sleeps: the time is an argument.
struct ClientSessionTests {
    let start = ContinuousClock.now

    func request(_ id: UInt64) -> [[UInt8]] {
        WireMessage.request(WireRequest(correlation: Wire.frame(id), service: "plants", operation: "get",
                                        header: RequestHeader(timeoutMilliseconds: 1_000), body: Array("{}".utf8))).encoded
    }

    func outcomes(_ directives: [ClientSession.Directive]) -> [UInt64: ClientSession.Outcome] {
        var result: [UInt64: ClientSession.Outcome] = [:]
        for case .resolve(let id, let outcome) in directives { result[id] = outcome }
        return result
    }

    @Test func aCallGoesOutAndItsReplyEndsItOnce() {
        var client = ClientSession()
        #expect(client.call(id: 1, frames: request(1), idempotent: true, deadline: start + .seconds(1)) == [.send(request(1))])
        let reply = WireMessage.reply(correlation: Wire.frame(UInt64(1)), shared: true, body: Array("{}".utf8), attachments: [[1]]).encoded
        #expect(outcomes(client.receive(reply)) == [1: .reply(RawReply(body: Array("{}".utf8), attachments: [[1]], shared: true))])
        #expect(client.receive(reply).isEmpty, "a late duplicate is dropped")
        #expect(client.pendingCount == 0)
    }

    @Test func anErrorAndAMalformedReplyEndTheirCallsAtOnce() {
        var client = ClientSession()
        _ = client.call(id: 1, frames: request(1), idempotent: true, deadline: start + .seconds(1))
        _ = client.call(id: 2, frames: request(2), idempotent: true, deadline: start + .seconds(1))
        let busy = WireMessage.error(correlation: Wire.frame(UInt64(1)), error: Array(#"{"code":"busy","message":"later"}"#.utf8)).encoded
        #expect(outcomes(client.receive(busy)) == [1: .failure(CanopyError(.busy, "later"))])
        let malformed = [Wire.version, Wire.Command.reply.frame, Wire.frame(UInt64(2)), [0]] // no body frame
        guard case .failure(let error)? = outcomes(client.receive(malformed))[2] else {
            Issue.record("the malformed reply did not end its call")
            return
        }
        #expect(error.code == .internal && error.message.contains("malformed"))
    }

    @Test func aCallWithoutAnAnswerTimesOutAfterItsDeadlineAndTheGrace() {
        var client = ClientSession()
        _ = client.call(id: 1, frames: request(1), idempotent: true, deadline: start + .seconds(1))
        #expect(client.nextWakeup() == start + .seconds(1) + ClientSession.grace)
        #expect(client.tick(now: start + .seconds(1)).isEmpty)
        guard case .failure(let error)? = outcomes(client.tick(now: start + .seconds(2)))[1] else {
            Issue.record("no timeout")
            return
        }
        #expect(error.code == .timeout && error.message.contains("cannot be reached"), "never connected: it says so")
        #expect(client.nextWakeup() == nil)
    }

    @Test func aLostConnectionFailsWhatMayHaveRunAndSendsIdempotentCallsAgain() {
        var client = ClientSession()
        _ = client.handshakeSucceeded()
        _ = client.call(id: 1, frames: request(1), idempotent: true, deadline: start + .seconds(10))
        _ = client.call(id: 2, frames: request(2), idempotent: false, deadline: start + .seconds(10))
        let lost = client.disconnected()
        #expect(lost.first == .log(.disconnected(calls: 2)))
        guard case .failure(let error)? = outcomes(lost)[2] else {
            Issue.record("the non-idempotent call was not failed")
            return
        }
        #expect(error.code == .workerLost)
        #expect(outcomes(lost)[1] == nil, "the idempotent call waits")
        #expect(client.handshakeSucceeded() == [.send(request(1))])
        #expect(client.handshakeSucceeded().isEmpty, "sent again once")
    }

    @Test func aCancelEndsTheCallAndTellsTheBrokerEvenBeforeTheCallArrives() {
        var client = ClientSession()
        _ = client.call(id: 1, frames: request(1), idempotent: true, deadline: start + .seconds(1))
        #expect(client.cancel(id: 1) == [.send(WireMessage.cancel(correlation: Wire.frame(UInt64(1))).encoded), .resolve(id: 1, .cancelled)])
        // The cancel can overtake its call in the mailbox: the call then ends at once.
        #expect(client.cancel(id: 2).isEmpty)
        #expect(client.call(id: 2, frames: request(2), idempotent: true, deadline: start + .seconds(1)) == [.resolve(id: 2, .cancelled)])
    }

    @Test func aRefusedKeyFailsEveryCallNowAndNewOnesUntilAHandshakeSucceeds() {
        var client = ClientSession()
        _ = client.call(id: 1, frames: request(1), idempotent: true, deadline: start + .seconds(1))
        let refused = client.handshakeRefused()
        #expect(refused.first == .log(.keyRefused))
        #expect(outcomes(refused) == [1: .failure(ClientSession.keyRefused)])
        #expect(client.handshakeRefused() == [], "logged once")
        #expect(outcomes(client.call(id: 2, frames: request(2), idempotent: true, deadline: start + .seconds(1))) == [2: .failure(ClientSession.keyRefused)])
        _ = client.handshakeSucceeded()
        #expect(client.call(id: 3, frames: request(3), idempotent: true, deadline: start + .seconds(1)) == [.send(request(3))])
        #expect(outcomes(client.sendFailed(id: 3))[3] == .failure(CanopyError(.busy, "the client's send queue is full; retry later")))
    }
}
