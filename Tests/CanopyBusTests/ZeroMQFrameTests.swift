import CanopyIO
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
}
