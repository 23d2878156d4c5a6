import CanopyBus
import CanopyMessages
import Testing

/// The client's protocol logic, driven without sockets or sleeps: the time is an argument.
struct ClientSessionTests {
    let start = ContinuousClock.now

    func request(_ id: UInt64) -> [[UInt8]] {
        WireMessage.request(
            WireRequest(
                correlation: Wire.frame(id), service: "plants", operation: "get",
                header: RequestHeader(timeoutMilliseconds: 1_000), body: Array("{}".utf8))
        ).encoded
    }

    func outcomes(_ directives: [ClientSession.Directive]) -> [UInt64: ClientSession.Outcome] {
        var result: [UInt64: ClientSession.Outcome] = [:]
        for case .resolve(let id, let outcome) in directives { result[id] = outcome }
        return result
    }

    @Test func aCallGoesOutAndItsReplyEndsItOnce() {
        var client = ClientSession()
        _ = client.handshakeSucceeded()
        #expect(client.call(id: 1, frames: request(1), idempotent: true, deadline: start + .seconds(1)) == [.send(request(1), broker: 0)])
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
        #expect(error.code == .timeout && error.message.contains("no broker can be reached"), "never connected: it says so")
        #expect(client.nextWakeup() == nil)
    }

    @Test func aLostConnectionFailsWhatMayHaveRunAndSendsIdempotentCallsAgain() {
        var client = ClientSession()
        _ = client.handshakeSucceeded()
        _ = client.call(id: 1, frames: request(1), idempotent: true, deadline: start + .seconds(10))
        _ = client.call(id: 2, frames: request(2), idempotent: false, deadline: start + .seconds(10))
        let lost = client.disconnected()
        #expect(lost.first == .log(.disconnected(broker: 0, calls: 2)))
        guard case .failure(let error)? = outcomes(lost)[2] else {
            Issue.record("the non-idempotent call was not failed")
            return
        }
        #expect(error.code == .brokerLost)
        #expect(outcomes(lost)[1] == nil, "the idempotent call waits")
        #expect(client.call(id: 3, frames: request(3), idempotent: true, deadline: start + .seconds(10)).isEmpty, "a new call waits for a connection too")
        #expect(client.handshakeSucceeded() == [.send(request(1), broker: 0), .send(request(3), broker: 0)])
        #expect(client.handshakeSucceeded().isEmpty, "sent again once")
    }

    @Test func aCancelEndsTheCallAndTellsTheBrokerEvenBeforeTheCallArrives() {
        var client = ClientSession()
        _ = client.handshakeSucceeded()
        _ = client.call(id: 1, frames: request(1), idempotent: true, deadline: start + .seconds(1))
        #expect(client.cancel(id: 1) == [.send(WireMessage.cancel(correlation: Wire.frame(UInt64(1))).encoded, broker: 0), .resolve(id: 1, .cancelled)])
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
        #expect(client.call(id: 3, frames: request(3), idempotent: true, deadline: start + .seconds(1)) == [.send(request(3), broker: 0)])
        #expect(outcomes(client.sendFailed(id: 3))[3] == .failure(CanopyError(.busy, "the client's send queue is full; retry later")))
    }

    // MARK: - Several brokers

    @Test func newCallsGoToThePreferredBrokerWhileItIsUpAndElsewhereAtOnceWhenItIsLost() {
        var client = ClientSession(brokers: 3, preferred: 1)
        #expect(client.call(id: 1, frames: request(1), idempotent: true, deadline: start + .seconds(10)).isEmpty, "no broker up yet: it waits")
        // The first broker up takes what waits; the preferred one, once up, takes new calls.
        #expect(client.handshakeSucceeded(broker: 2) == [.log(.switched(from: 1, to: 2)), .send(request(1), broker: 2)])
        #expect(client.handshakeSucceeded(broker: 1) == [.log(.switched(from: 2, to: 1))])
        _ = client.handshakeSucceeded(broker: 0)
        #expect(client.call(id: 2, frames: request(2), idempotent: true, deadline: start + .seconds(10)) == [.send(request(2), broker: 1)])
        #expect(client.call(id: 3, frames: request(3), idempotent: false, deadline: start + .seconds(10)) == [.send(request(3), broker: 1)])
        // Broker 1 dies (SIGKILL: its connection drops): the idempotent call goes to the next
        // broker up at once, the other fails brokerLost, never sent twice; broker 2's call stays.
        let lost = client.disconnected(broker: 1)
        #expect(lost.contains(.log(.disconnected(broker: 1, calls: 2))) && lost.contains(.log(.switched(from: 1, to: 2))))
        #expect(lost.contains(.send(request(2), broker: 2)))
        guard case .failure(let error)? = outcomes(lost)[3] else {
            Issue.record("the call that is not idempotent was not failed")
            return
        }
        #expect(error.code == .brokerLost)
        #expect(!lost.contains { if case .send(let frames, _) = $0 { frames == request(1) || frames == request(3) } else { false } })
        #expect(client.sentAgain == 1, "the idempotent call, once")
        #expect(client.call(id: 4, frames: request(4), idempotent: false, deadline: start + .seconds(10)) == [.send(request(4), broker: 2)])
        // A late reply from the lost connection's broker is nobody's; answers from broker 2 end their calls.
        #expect(
            outcomes(client.receive(WireMessage.reply(correlation: Wire.frame(UInt64(2)), shared: false, body: [], attachments: []).encoded, from: 2)).keys
                .sorted() == [2])
        #expect(client.pendingCount == 2)
        // The preferred broker back: new calls return to it; those on broker 2 stay there.
        #expect(client.handshakeSucceeded(broker: 1) == [.log(.switched(from: 2, to: 1))])
        #expect(client.call(id: 5, frames: request(5), idempotent: true, deadline: start + .seconds(10)) == [.send(request(5), broker: 1)])
        // A cancel goes to the broker that holds the call.
        #expect(client.cancel(id: 4).first == .send(WireMessage.cancel(correlation: Wire.frame(UInt64(4))).encoded, broker: 2))
    }

    @Test func withEveryBrokerLostIdempotentCallsWaitForTheFirstBackAndTimeOutSayingNoneCanBeReached() {
        var client = ClientSession(brokers: 2, preferred: 0)
        _ = client.handshakeSucceeded(broker: 0)
        _ = client.handshakeSucceeded(broker: 1)
        _ = client.call(id: 1, frames: request(1), idempotent: true, deadline: start + .seconds(10))
        _ = client.call(id: 2, frames: request(2), idempotent: true, deadline: start + .seconds(1))
        _ = client.disconnected(broker: 1)
        let lost = client.disconnected(broker: 0)
        #expect(outcomes(lost).isEmpty && !lost.contains { if case .send = $0 { true } else { false } }, "nowhere to send them: they wait")
        guard case .failure(let error)? = outcomes(client.tick(now: start + .seconds(2)))[2] else {
            Issue.record("the call past its deadline did not time out")
            return
        }
        #expect(error.code == .timeout && error.message.contains("no broker can be reached"))
        #expect(client.handshakeSucceeded(broker: 1).contains(.send(request(1), broker: 1)), "the first broker back takes it")
    }

    @Test func aSendThatFailsOnAConnectionJustLostWaitsInsteadOfFailingBusy() {
        var client = ClientSession(brokers: 2, preferred: 0)
        _ = client.handshakeSucceeded(broker: 0)
        #expect(client.call(id: 1, frames: request(1), idempotent: false, deadline: start + .seconds(10)) == [.send(request(1), broker: 0)])
        // The socket refused it (its connection went a moment ago): told, the session fails
        // it as lost (never delivered, but the session cannot know that)...
        _ = client.disconnected(broker: 0)
        #expect(client.sendFailed(id: 1, broker: 0).isEmpty, "already ended by the lost connection")
        // ...and a refusal on a connection still up is a full queue: busy.
        _ = client.handshakeSucceeded(broker: 1)
        _ = client.call(id: 2, frames: request(2), idempotent: true, deadline: start + .seconds(10))
        #expect(outcomes(client.sendFailed(id: 2, broker: 1))[2] == .failure(CanopyError(.busy, "the client's send queue is full; retry later")))
    }

    /// A broker shutting down (a planned restart) refuses new calls without running them:
    /// they go to another broker, idempotent or not, and so do new calls until it is back.
    @Test func callsABrokerRefusesAsItShutsDownGoToAnotherOneEvenThoseThatAreNotIdempotent() {
        var client = ClientSession(brokers: 2, preferred: 0)
        _ = client.handshakeSucceeded(broker: 0)
        _ = client.handshakeSucceeded(broker: 1)
        _ = client.call(id: 1, frames: request(1), idempotent: false, deadline: start + .seconds(10))
        _ = client.call(id: 2, frames: request(2), idempotent: true, deadline: start + .seconds(10))
        let refusal = { (id: UInt64) in
            WireMessage.error(correlation: Wire.frame(id), error: Array(#"{"code":"shuttingDown","message":"the broker is shutting down"}"#.utf8)).encoded
        }
        #expect(client.receive(refusal(1), from: 0) == [.log(.switched(from: 0, to: 1)), .send(request(1), broker: 1)])
        #expect(client.call(id: 3, frames: request(3), idempotent: true, deadline: start + .seconds(10)) == [.send(request(3), broker: 1)])
        // What broker 0 still holds is answered as it drains.
        #expect(
            outcomes(client.receive(WireMessage.reply(correlation: Wire.frame(UInt64(2)), shared: false, body: [], attachments: []).encoded, from: 0)).keys
                .sorted() == [2])
        // It exits, a new one starts on its endpoint: new calls go back to the preferred broker.
        _ = client.disconnected(broker: 0)
        #expect(client.handshakeSucceeded(broker: 0) == [.log(.switched(from: 1, to: 0))])
        // With no other broker up, the refusal is the answer.
        var alone = ClientSession()
        _ = alone.handshakeSucceeded()
        _ = alone.call(id: 1, frames: request(1), idempotent: true, deadline: start + .seconds(10))
        guard case .failure(let error)? = outcomes(alone.receive(refusal(1)))[1] else {
            Issue.record("the refusal did not end the call")
            return
        }
        #expect(error.code == .shuttingDown)
    }

    /// A service whose workers are at one broker only (a Majordomo worker knows one): a call
    /// answered `noWorkers` (not run) tries the other brokers before it ends so.
    @Test func aCallAnsweredNoWorkersTriesTheOtherBrokersFirst() {
        var client = ClientSession(brokers: 3, preferred: 0)
        for broker in 0..<3 { _ = client.handshakeSucceeded(broker: broker) }
        _ = client.call(id: 1, frames: request(1), idempotent: false, deadline: start + .seconds(10))
        let none = { (id: UInt64) in
            WireMessage.error(correlation: Wire.frame(id), error: Array(#"{"code":"noWorkers","message":"no worker serves plants"}"#.utf8)).encoded
        }
        #expect(client.receive(none(1), from: 0) == [.send(request(1), broker: 1)])
        #expect(client.receive(none(1), from: 1) == [.send(request(1), broker: 2)])
        guard case .failure(let error)? = outcomes(client.receive(none(1), from: 2))[1] else {
            Issue.record("no broker had workers, and the call did not end")
            return
        }
        #expect(error.code == .noWorkers)
        #expect(client.pendingCount == 0 && client.sentAgain == 2)
    }
}
