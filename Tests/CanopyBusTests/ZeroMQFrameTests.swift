import CanopyIO
import CanopyTesting
import Testing

/// Frames from 4 KiB up are handed to libzmq without copying; these check that what arrives is
/// what was sent even when the sender changes or drops its arrays at once.
struct ZeroMQFrameTests {
    @Test func largeFramesArriveIntactWhenTheSenderReusesItsArraysAtOnce() throws {
        let context = ZMQContext()
        let receiver = try ZMQSocket(context, type: .dealer)
        defer { receiver.close() }
        try receiver.bind("tcp://127.0.0.1:*")
        let sender = try ZMQSocket(context, type: .dealer)
        defer { sender.close() }
        try sender.connect(receiver.lastEndpoint)

        var random = SystemRandomNumberGenerator()
        let sizes = [0, 1, 4_095, 4_096, 4_097, 65_536, 300_000]
        var expected: [[[UInt8]]] = []
        var buffer: [UInt8] = []
        for round in 0..<60 {
            var frames: [[UInt8]] = []
            for size in sizes.shuffled(using: &random).prefix(3) {
                buffer = (0..<size).map { UInt8(truncatingIfNeeded: $0 &+ round) }
                frames.append(buffer)
            }
            expected.append(frames)
            #expect(try sender.send(frames, dontWait: false))
            // Written over while libzmq may still be sending: the sent copy must not change.
            for index in frames.indices where !frames[index].isEmpty { frames[index][0] ^= 0xFF }
            buffer.removeAll()
        }
        for frames in expected {
            let received = try #require(try receiver.receive(dontWait: false))
            #expect(received == frames)
        }
    }

    /// A ticket counts its message's bytes while libzmq holds the message (here: queued for a
    /// peer that is not there yet), then goes back to its pool to be handed out again.
    @Test func ticketsCountWhileLibzmqHoldsTheMessageThenReturnToThePool() async throws {
        let context = ZMQContext()
        let endpoint = "tcp://127.0.0.1:\(FreePorts.any())"
        let sender = try ZMQSocket(context, type: .dealer)
        defer { sender.close() }
        try sender.connect(endpoint) // nobody listens yet: the messages wait in libzmq
        let pool = TicketPool()
        let (peer, all) = (ByteCount(), ByteCount())
        var sent: [ObjectIdentifier] = []
        for index in 0..<3 {
            let ticket = pool.ticket(bytes: 1_000 + index, peer: peer, all: all)
            sent.append(ObjectIdentifier(ticket))
            #expect(try sender.sendLastPart([UInt8](repeating: UInt8(index), count: 1_000 + index), ticket: ticket))
        }
        #expect(peer.bytes == 3_003 && all.bytes == 3_003, "counted while libzmq holds them")
        #expect(pool.idleCount == 0)

        let receiver = try ZMQSocket(context, type: .dealer)
        defer { receiver.close() }
        try receiver.bind(endpoint)
        for index in 0..<3 {
            let frames = try #require(try receiver.receive(dontWait: false))
            #expect(frames == [[UInt8](repeating: UInt8(index), count: 1_000 + index)])
        }
        #expect(try await eventually { peer.bytes == 0 && all.bytes == 0 && pool.idleCount == 3 }, "let go once written")
        let again = pool.ticket(bytes: 10, peer: peer, all: all)
        #expect(sent.contains(ObjectIdentifier(again)), "an idle ticket is handed out again, not a new one")
        #expect(pool.idleCount == 2 && peer.bytes == 10)
    }

    /// A ticket whose message never went (dropped before its last frame) takes its bytes off
    /// when it is let go, pooled or not.
    @Test func aTicketLetGoUnsentTakesItsBytesOff() {
        let pool = TicketPool()
        let (peer, all) = (ByteCount(), ByteCount())
        do {
            let pooled = pool.ticket(bytes: 700, peer: peer, all: all)
            let alone = SendTicket(bytes: 300, peer: peer, all: all)
            #expect(peer.bytes == 1_000 && all.bytes == 1_000)
            withExtendedLifetime((pooled, alone)) {}
        }
        #expect(peer.bytes == 0 && all.bytes == 0)
    }
}
