import CanopyIO
import CanopyMessages
import CanopyTesting
import CanopyWire
import Glibc
import Testing

/// The broker's receive path reads frames in place from libzmq's messages (``ReceivedFrames``)
/// instead of copying each into an array: what it decodes must be exactly what decoding the
/// same frames as arrays gives, for good messages and bad.
struct ReceivedFramesTests {
    /// A ROUTER and two DEALERs connected to it over inproc.
    static func withSockets(_ body: (_ router: ZMQSocket, _ dealers: [ZMQSocket]) throws -> Void) throws {
        let context = ZMQContext()
        let router = try ZMQSocket(context, type: .router)
        defer { router.close() }
        try router.bind("inproc://received-frames")
        let dealers = try (0..<2).map { _ in try ZMQSocket(context, type: .dealer) }
        defer { dealers.forEach { $0.close() } }
        for dealer in dealers { try dealer.connect("inproc://received-frames") }
        try body(router, dealers)
    }

    /// Waits for the next message on `router` (inproc delivers at once, but not synchronously).
    static func next(_ router: ZMQSocket, into frames: ReceivedFrames, identity: inout [UInt8]) throws -> Bool {
        var properties = PeerProperties()
        for _ in 0..<10_000 {
            if try router.receiveRouted(into: frames, identity: &identity, properties: &properties) { return true }
            usleep(100)
        }
        return false
    }

    @Test func whatIsDecodedInPlaceIsWhatTheArraysDecodeTo() throws {
        let header = RequestHeader(timeoutMilliseconds: 2_500, principal: "user-42")
        let body = Array(#"{"id":"p1"}"#.utf8)
        let messages: [WireMessage] = [
            .request(WireRequest(correlation: Wire.frame(UInt64(7)), service: "care", operation: "plants.get", header: header, body: body)),
            .request(WireRequest(correlation: [1], service: "images", operation: "put", header: header, body: [], attachments: [[0xFF, 0xD8], []])),
            .cancel(correlation: Wire.frame(UInt64(7))),
            .ready(service: "care", operations: [OperationDescriptor(name: "plants.get", idempotent: true, coalescable: true)], credit: 8),
            .workerReply(requestID: 42, failed: false, body: body, attachments: [[0xFF, 0xD8, 0xFF]]),
            .workerReply(requestID: 43, failed: true, body: Array(#"{"code":"busy","message":"m"}"#.utf8)),
            .workerHeartbeat, .credit(3), .drain,
        ]
        var random = SeededRandom(seed: 0x5EED)
        var cases: [[[UInt8]]] = messages.map(\.encoded)
        // Mutated ones: frames dropped, replaced, added, bytes flipped.
        for _ in 0..<400 {
            var frames = messages[Int(random.next() % UInt64(messages.count))].encoded
            for _ in 0..<(1 + Int(random.next() % 2)) where !frames.isEmpty {
                let index = Int(random.next() % UInt64(frames.count))
                switch random.next() % 4 {
                case 0: frames.remove(at: index)
                case 1: frames.append((0..<Int(random.next() % 6)).map { _ in UInt8(truncatingIfNeeded: random.next()) })
                case 2: frames[index] = (0..<Int(random.next() % 10)).map { _ in UInt8(truncatingIfNeeded: random.next()) }
                default: if !frames[index].isEmpty { frames[index][Int(random.next() % UInt64(frames[index].count))] ^= 0x20 }
                }
            }
            if !frames.isEmpty { cases.append(frames) }
        }
        // More frames than the holder starts with: a request with 64 attachments.
        cases.append(messages[0].encoded + (0..<64).map { [UInt8(truncatingIfNeeded: $0), 0xAB] })

        try Self.withSockets { router, dealers throws in
            let frames = ReceivedFrames(capacity: 4)
            var identity: [UInt8] = []
            var decodedBoth = 0
            for sent in cases {
                #expect(try dealers[0].send(sent, dontWait: false))
                try #require(try Self.next(router, into: frames, identity: &identity))
                #expect(frames.arrays == sent)
                #expect(MajordomoMessage.claims(frames) == MajordomoMessage.claims(sent))
                func decode<Frames: FrameList>(_ frames: Frames) -> Result<WireMessage, WireDecodingError> {
                    do throws(WireDecodingError) { return .success(try WireMessage(frames: frames)) } catch { return .failure(error) }
                }
                switch (decode(frames), decode(sent)) {
                case (.success(let inPlace), .success(let fromArrays)):
                    #expect(inPlace == fromArrays)
                    decodedBoth += 1
                case (.failure(let inPlace), .failure(let fromArrays)):
                    #expect(inPlace == fromArrays, "\(inPlace) / \(fromArrays)")
                default:
                    Issue.record("decoded one way and refused the other: \(sent)")
                }
            }
            #expect(decodedBoth >= messages.count + 1, "the good messages, mutated ones that stay good, and 64 attachments decode")
        }
    }

    @Test func aPeersIdentityIsKeptWhileTheSamePeerSendsAndTheFramesAreGivenBack() throws {
        try Self.withSockets { router, dealers throws in
            let frames = ReceivedFrames()
            var identity: [UInt8] = []
            func storage() -> UnsafePointer<UInt8>? { identity.withUnsafeBufferPointer(\.baseAddress) }
            #expect(try dealers[0].send([Wire.version, Wire.Command.workerHeartbeat.frame], dontWait: false))
            #expect(try Self.next(router, into: frames, identity: &identity))
            let first = identity, firstStorage = storage()
            #expect(!first.isEmpty)
            #expect(try dealers[0].send([Wire.version, Wire.Command.drain.frame], dontWait: false))
            #expect(try Self.next(router, into: frames, identity: &identity))
            #expect(identity == first && storage() == firstStorage, "the same peer: the same array, nothing allocated")
            #expect(try dealers[1].send([Wire.version, Wire.Command.drain.frame], dontWait: false))
            #expect(try Self.next(router, into: frames, identity: &identity))
            #expect(identity != first, "another peer: its own identity")
            #expect(frames.count == 2 && frames.array(1) == Wire.Command.drain.frame)
            // A message of more frames than any protocol has: the first 128 kept, the rest read
            // and let go (counted), and the next message arrives whole.
            let overlong = (0..<300).map { [UInt8(truncatingIfNeeded: $0)] }
            #expect(try dealers[0].send(overlong, dontWait: false))
            #expect(try dealers[0].send([Wire.version, Wire.Command.drain.frame], dontWait: false))
            #expect(try Self.next(router, into: frames, identity: &identity))
            #expect(frames.count == ReceivedFrames.maximumFrames && frames.dropped == 300 - ReceivedFrames.maximumFrames)
            #expect(frames.arrays == Array(overlong.prefix(ReceivedFrames.maximumFrames)))
            #expect(try Self.next(router, into: frames, identity: &identity))
            #expect(frames.dropped == 0 && frames.arrays == [Wire.version, Wire.Command.drain.frame])
            frames.release()
            #expect(frames.count == 0)
            var properties = PeerProperties()
            #expect(try !router.receiveRouted(into: frames, identity: &identity, properties: &properties), "nothing waiting")
        }
    }
}
