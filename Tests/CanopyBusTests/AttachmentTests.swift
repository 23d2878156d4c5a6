import CanopyBroker
import CanopyBus
import CanopyMessages
import CanopyTesting
import Foundation
import Testing

/// Attachments through the broker: passed on untouched both ways, compared as bytes when
/// flights are joined, and bounded by the frame limit each.
struct AttachmentTests {
    @Test func attachmentsReachTheWorkerAndComeBackToTheCaller() throws {
        var broker = BrokerHarness()
        broker.ready("w1", operations: CoalescingTests.operations)
        let photo: [UInt8] = [0xFF, 0xD8, 0xFF, 0xE0, 1, 2, 3]
        let sent = messages(broker.request("c1", 1, body: #"{"plantID":"p"}"#, attachments: [photo, [9]]))
        guard case .dispatch(let id, _, _, let body, let attachments)? = sent.first?.message else {
            Issue.record("not dispatched: \(sent)")
            return
        }
        #expect(String(decoding: body, as: UTF8.self) == #"{"plantID":"p"}"#)
        #expect(attachments == [photo, [9]])
        let answered = messages(broker.reply("w1", request: id, body: "{}", attachments: [[7, 7], []]))
        guard case .reply(_, _, let replyBody, let replyAttachments)? = answered.first?.message else {
            Issue.record("not answered: \(answered)")
            return
        }
        #expect(replyBody == Array("{}".utf8) && replyAttachments == [[7, 7], []])
        #expect(broker.state.heldBytes == 0)
    }

    @Test func onlyRequestsWithTheSameAttachmentsShareAFlight() {
        var broker = BrokerHarness()
        broker.ready("w1", operations: CoalescingTests.operations, credit: 8)
        let body = #"{"id":"a"}"#
        #expect(dispatches(broker.request("c1", 1, body: body, attachments: [[1, 2, 3]])).count == 1)
        #expect(dispatches(broker.request("c2", 1, body: body, attachments: [[1, 2, 3]])).isEmpty, "the same bytes join")
        #expect(dispatches(broker.request("c3", 1, body: body, attachments: [[1, 2, 4]])).count == 1, "one byte differs")
        #expect(dispatches(broker.request("c4", 1, body: body, attachments: [[1, 2], [3]])).count == 1, "the same bytes cut in other frames")
        #expect(dispatches(broker.request("c5", 1, body: body)).count == 1, "no attachment")
    }

    /// Large frames are hashed by a sample, but joined only when every byte is equal.
    @Test func largeAttachmentsDifferingInOneByteAnywhereDoNotShareAFlight() {
        var broker = BrokerHarness()
        broker.ready("w1", operations: CoalescingTests.operations, credit: 64)
        let photo = (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        #expect(dispatches(broker.request("c0", 1, body: "{}", attachments: [photo])).count == 1)
        #expect(dispatches(broker.request("c1", 1, body: "{}", attachments: [photo])).isEmpty, "the same photo joins")
        for (index, position) in [0, 2_047, 2_048, 150_001, 297_951, 299_999].enumerated() {
            var changed = photo
            changed[position] ^= 0xFF
            #expect(dispatches(broker.request("d\(index)", 1, body: "{}", attachments: [changed])).count == 1, "a byte at \(position) differs")
        }
        var longer = photo
        longer.append(0)
        #expect(dispatches(broker.request("e", 1, body: "{}", attachments: [longer])).count == 1, "one byte longer")
    }

    @Test func anAttachmentOverTheFrameLimitIsRefusedTooLarge() {
        var broker = BrokerHarness { $0.maximumFrameBytes = 1024 }
        broker.ready("w1", operations: CoalescingTests.operations)
        let out = broker.request("c1", 1, attachments: [[UInt8](repeating: 1, count: 1025)])
        #expect(dispatches(out).isEmpty)
        #expect(errors(out).map(\.error.code) == [.tooLarge])
        #expect(errors(out).first?.correlation == Wire.frame(UInt64(1)))
        // A worker's attachment over the limit answers its caller tooLarge and frees the credit.
        let sent = dispatches(broker.request("c1", 2))
        let refused = errors(broker.reply("w1", request: sent[0].id, attachments: [[UInt8](repeating: 2, count: 2048)]))
        #expect(refused.map(\.error.code) == [.tooLarge])
        #expect(dispatches(broker.request("c1", 3)).count == 1, "the worker's credit came back")
    }

    @Test func attachmentsTravelOverALiveBusAndATooLargeOneLeavesTheConnectionWorking() async throws {
        var configuration = BrokerConfiguration.testing
        configuration.maximumFrameBytes = 256 * 1024
        try await withLiveBus(configuration: configuration) { bus in
            let worker = bus.startWorker(name: "w1")
            try await bus.waitForWorkers(1)
            let client = try bus.client()
            let photo = Data((0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 31) })
            let reply = try await client.call(TestService.ReverseBlobs.self, .init(label: "photos", blobs: [photo, Data([1, 2])]))
            #expect(reply.label == "photos:2")
            #expect(reply.blobs == [Data([2, 1]), Data(photo.reversed())])

            let refused = await #expect(throws: CanopyError.self) {
                _ = try await client.call(TestService.ReverseBlobs.self, .init(label: "big", blobs: [Data(count: 300 * 1024)]))
            }
            #expect(refused?.code == .tooLarge)
            // The same client and worker go on.
            #expect(try await client.call(TestService.ReverseBlobs.self, .init(label: "after", blobs: [])).label == "after:0")
            #expect(worker.counters.calls.load(ordering: .relaxed) == 2, "the refused call never reached the worker")
        }
    }

    @Test func aMajordomoClientSeesAttachmentsAsExtraFrames() {
        var broker = BrokerHarness()
        broker.ready("w1", operations: CoalescingTests.operations)
        let request = MajordomoMessage.client(service: Array("plants".utf8), body: [Array("get".utf8), Array("{}".utf8), [0xAB]])
        let sent = messages(broker.receive(request.encoded, from: "m1"))
        guard case .dispatch(let id, _, _, _, let attachments)? = sent.first?.message else {
            Issue.record("not dispatched")
            return
        }
        #expect(attachments == [[0xAB]])
        let out = sends(broker.reply("w1", request: id, body: "{}", attachments: [[0xCD]]))
        #expect(out.first?.frames == MajordomoMessage.client(service: Array("plants".utf8), body: [Majordomo.ok, Array("{}".utf8), [0xCD]]).encoded)
    }
}
