import CanopyBroker
import CanopyBus
import CanopyMessages
import Testing

/// Majordomo (7/MDP v0.1) clients and workers at the broker, driven without sockets. Frames
/// are written here from the specification, not with Canopy's own types.
struct MajordomoTests {
    let mdpc = Array("MDPC01".utf8)
    let mdpw = Array("MDPW01".utf8)

    func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

    /// `["", "MDPC01", service, body...]`
    func clientRequest(_ service: String, _ body: [String]) -> [[UInt8]] {
        [[], mdpc, bytes(service)] + body.map(bytes)
    }

    /// Sends as text, for readable expectations.
    func texts(_ directives: [BrokerState.Directive], to peer: String) -> [[String]] {
        sends(directives).filter { $0.peer == peer }.map { $0.frames.map { String(decoding: $0, as: UTF8.self) } }
    }

    @Test func aCallerGivingUpOnAMajordomoWorkerSendsTheWorkerNothing() {
        var broker = BrokerHarness()
        _ = broker.receive([[], mdpw, [0x01], bytes("echo")], from: "mw")
        _ = broker.request("c1", 1, service: "echo", operation: "say", timeoutMs: 100)
        let expired = broker.advance(.milliseconds(200))
        #expect(errors(expired).map(\.error.code) == [.timeout])
        #expect(sends(expired).filter { $0.peer == "mw" }.isEmpty, "7/MDP has no cancel: nothing goes to the worker, not an empty message")
    }

    @Test func mmiServiceSaysWhetherAServiceExists() {
        var broker = BrokerHarness()
        broker.ready("w1")
        #expect(texts(broker.receive(clientRequest("mmi.service", ["plants"]), from: "m"), to: "m") == [["", "MDPC01", "mmi.service", "200"]])
        #expect(texts(broker.receive(clientRequest("mmi.service", ["nothing"]), from: "m"), to: "m") == [["", "MDPC01", "mmi.service", "404"]])
        #expect(texts(broker.receive(clientRequest("mmi.other", []), from: "m"), to: "m") == [["", "MDPC01", "mmi.other", "501"]])
    }

    @Test func aMajordomoClientCallsACanopyServiceWithOperationAndBody() {
        var broker = BrokerHarness()
        broker.ready("w1")
        let sent = dispatches(broker.receive(clientRequest("plants", ["get", #"{"id":"p1"}"#]), from: "m"))
        #expect(sent.map(\.worker) == ["w1"])
        #expect(sent.map(\.operation) == ["get"])
        let answer = broker.reply("w1", request: sent[0].id, body: #"{"name":"Fern"}"#)
        #expect(texts(answer, to: "m") == [["", "MDPC01", "plants", "ok", #"{"name":"Fern"}"#]])

        let failing = dispatches(broker.receive(clientRequest("plants", ["get", "{}"]), from: "m"))
        let failed = texts(broker.reply("w1", request: failing[0].id, body: #"{"code":"notFound","message":"gone"}"#, status: Wire.Status.error), to: "m")
        #expect(failed == [["", "MDPC01", "plants", "error", #"{"code":"notFound","message":"gone"}"#]])

        let malformed = texts(broker.receive(clientRequest("plants", ["get"]), from: "m"), to: "m")
        #expect(malformed.first?.prefix(4) == ["", "MDPC01", "plants", "error"])
        #expect(malformed.first?.last?.contains("badRequest") == true)
    }

    @Test func aCanopyClientCallsAMajordomoWorker() {
        var broker = BrokerHarness()
        _ = broker.receive([[], mdpw, [0x01], bytes("legacy")], from: "mw")
        #expect(broker.state.serviceDescriptions().map(\.majordomo) == [true])

        let out = broker.request("c", 9, service: "legacy", operation: "shout", body: "hello")
        let request = sends(out).first { $0.peer == "mw" }!.frames
        #expect(request.count == 7)
        #expect(request[0].isEmpty && request[1] == mdpw && request[2] == [0x02])
        #expect(request[4].isEmpty)
        #expect(request[5] == bytes("shout") && request[6] == bytes("hello"))

        // The worker echoes the client address (envelope) back with its reply.
        let answer = replies(broker.receive([[], mdpw, [0x03], request[3], [], bytes("HELLO")], from: "mw"))
        #expect(answer.map(\.client) == ["c"])
        #expect(answer.map(\.correlation) == [Wire.frame(UInt64(9))])
        #expect(answer.map(\.body) == ["HELLO"])
    }

    @Test func majordomoClientsAndWorkersTalkThroughCanopyUntouched() {
        var broker = BrokerHarness()
        _ = broker.receive([[], mdpw, [0x01], bytes("echo")], from: "mw")
        let out = broker.receive(clientRequest("echo", ["a", "b", "c"]), from: "m")
        let request = sends(out).first { $0.peer == "mw" }!.frames
        #expect(request.suffix(3).map { String(decoding: $0, as: UTF8.self) } == ["a", "b", "c"])
        let answer = broker.receive([[], mdpw, [0x03], request[3], [], bytes("x"), bytes("y")], from: "mw")
        #expect(texts(answer, to: "m") == [["", "MDPC01", "echo", "x", "y"]])
    }

    @Test func majordomoWorkersTakeOneRequestAtATime() {
        var broker = BrokerHarness()
        _ = broker.receive([[], mdpw, [0x01], bytes("echo")], from: "mw")
        #expect(sends(broker.receive(clientRequest("echo", ["1"]), from: "m1")).count == 1)
        #expect(sends(broker.receive(clientRequest("echo", ["2"]), from: "m2")).isEmpty, "queued until the worker replies")
    }

    /// 64 Majordomo clients with 16 requests each outstanding (1,024 at once) and 4 workers
    /// holding one request at a time, on the default settings: everything queues and is
    /// answered in turn; nothing is refused `busy`.
    @Test func aPipelinedMajordomoBurstOnTheDefaultsIsAnsweredWithoutBusy() {
        var broker = BrokerHarness()
        let workers = (0..<4).map { "mw\($0)" }
        for worker in workers { _ = broker.receive([[], mdpw, [0x01], bytes("echo")], from: worker) }
        var toWorkers: [(peer: String, frames: [[UInt8]])] = []
        for client in 0..<64 {
            for index in 0..<16 {
                let out = sends(broker.receive(clientRequest("echo", ["\(client)/\(index)"]), from: "m\(client)"))
                #expect(out.allSatisfy { $0.peer.hasPrefix("mw") }, "nothing goes back to a client before its answer")
                toWorkers += out
            }
        }
        #expect(toWorkers.count == 4, "each worker holds one request; the other 1,020 wait in the queue")
        var answered: [String] = []
        while let (worker, request) = toWorkers.popLast() {
            // The worker echoes the client's envelope and body back.
            let out = sends(broker.receive([[], mdpw, [0x03], request[3], [], request[5]], from: worker))
            for message in out {
                if message.peer.hasPrefix("mw") {
                    toWorkers.append(message)
                } else {
                    #expect(message.frames.count == 4 && message.frames[1] == mdpc, "an echo, not an error")
                    answered.append(String(decoding: message.frames[3], as: UTF8.self))
                }
            }
        }
        #expect(answered.count == 1_024)
        #expect(Set(answered).count == 1_024)
        #expect(broker.state.pendingCount == 0)
    }

    @Test func majordomoServicesAreCoalescedOnlyWhenTheOperatorSaysSo() {
        var plain = BrokerHarness()
        _ = plain.receive([[], mdpw, [0x01], bytes("echo")], from: "mw")
        _ = plain.receive([[], mdpw, [0x01], bytes("echo")], from: "mw2")
        #expect(sends(plain.receive(clientRequest("echo", ["same"]), from: "m1")).count == 1)
        #expect(sends(plain.receive(clientRequest("echo", ["same"]), from: "m2")).count == 1)

        var coalesced = BrokerHarness { $0.majordomoCoalescedServices = ["echo"] }
        _ = coalesced.receive([[], mdpw, [0x01], bytes("echo")], from: "mw")
        _ = coalesced.receive([[], mdpw, [0x01], bytes("echo")], from: "mw2")
        let first = sends(coalesced.receive(clientRequest("echo", ["same"]), from: "m1"))
        #expect(first.count == 1)
        #expect(sends(coalesced.receive(clientRequest("echo", ["same"]), from: "m2")).isEmpty)
        let answer = coalesced.receive([[], mdpw, [0x03], first[0].frames[3], [], bytes("done")], from: first[0].peer)
        #expect(Set(sends(answer).map(\.peer)) == ["m1", "m2"])
    }

    @Test func majordomoWorkersHeartbeatAndExpire() {
        var broker = BrokerHarness()
        _ = broker.receive([[], mdpw, [0x01], bytes("echo")], from: "mw")
        let beat = broker.advance(broker.state.configuration.heartbeatInterval)
        #expect(texts(beat, to: "mw") == [["", "MDPW01", "\u{04}"]])
        _ = broker.advance(broker.state.configuration.workerExpiry)
        _ = broker.advance(broker.state.configuration.heartbeatInterval)
        #expect(broker.state.workerCount == 0)
        // A worker the broker does not know is told to disconnect (and so to register again).
        #expect(texts(broker.receive([[], mdpw, [0x04]], from: "mw"), to: "mw") == [["", "MDPW01", "\u{05}"]])
    }

    @Test func oneServiceSpeaksOneProtocol() {
        var broker = BrokerHarness()
        broker.ready("w1")
        let refused = broker.receive([[], mdpw, [0x01], bytes("plants")], from: "mw")
        #expect(texts(refused, to: "mw") == [["", "MDPW01", "\u{05}"]])
        #expect(broker.state.workerCount == 1)
    }

    @Test func malformedMajordomoMessagesChangeNothing() {
        var broker = BrokerHarness()
        broker.ready("w1")
        let cases: [[[UInt8]]] = [
            [[], mdpc],
            [[], mdpc, bytes("Not Valid!")],
            [[], mdpw],
            [[], mdpw, [0x09]],
            [[], mdpw, [0x03], [1, 2], [], bytes("stray reply")],
            [[], mdpw, [0x02], bytes("x")],
            [[], mdpw, [0x01], bytes("broker")],
        ]
        for frames in cases {
            #expect(dispatches(broker.receive(frames, from: "m")).isEmpty)
        }
        #expect(broker.state.workerCount == 1)
        #expect(broker.state.pendingCount == 0)
    }
}
