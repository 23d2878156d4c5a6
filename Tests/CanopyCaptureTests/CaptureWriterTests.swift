import CanopyCapture
import CanopyWire
import Foundation
import Testing

/// The capture's writer thread: pseudonyms, attachments left out, rotation, a bounded queue.
struct CaptureWriterTests {
    static func event(
        _ index: Int, identity: [UInt8] = [0, 1, 2, 3, 4], principal: String = "alice@example.com",
        body: String? = nil, attachments: [[UInt8]] = []
    ) -> CaptureEvent {
        var record = CaptureFormatTests.request(index, client: "", principal: principal, attachments: attachments)
        if let body { record.body = Array(body.utf8) }
        return CaptureEvent(record: record, clientIdentity: identity)
    }

    @Test func peersAlwaysAndPeopleWhenAskedBecomeStablePseudonyms() throws {
        let path = CaptureFormatTests.temporaryPath("capture")
        var settings = CaptureSettings(path: path)
        settings.pseudonymize = true
        let writer = try CaptureWriter(settings: settings)
        // A multi-key lookup names one person per key; the header names the caller.
        let multiKey = #"{"keys":[{"principal":"alice@example.com","sha256":"aa"},{"principal":"bob\"o","sha256":"bb"}]}"#
        writer.submit(Self.event(1, principal: "alice@example.com", body: multiKey))
        writer.submit(Self.event(2, principal: "alice@example.com"))
        writer.submit(Self.event(3, identity: [9, 9, 9, 9, 9], principal: "bob\"o", body: #"{"name":"Monstera","owner":"bob\"o"}"#))
        let status = writer.stop()
        #expect(writer.stop() == status, "stopping again answers the same")
        #expect(status.records == 3)
        #expect(status.dropped == 0)
        #expect(!status.capturing)

        let (records, reader) = try CaptureFormatTests.readAll(path)
        #expect(reader.header.pseudonymized)
        #expect(records.count == 3)
        let alice = records[0].header.principal, bob = records[2].header.principal
        #expect(alice.hasPrefix("p-") && alice.count == 26)
        #expect(records[1].header.principal == alice)
        #expect(bob != alice && bob.hasPrefix("p-"))
        #expect(RequestHeader(frame: records[2].header.frame) != nil, "a pseudonym is a valid principal")
        // Both people in the multi-key body, by the same pseudonyms as in the headers.
        let body = String(decoding: records[0].body, as: UTF8.self)
        #expect(body == #"{"keys":[{"principal":"\#(alice)","sha256":"aa"},{"principal":"\#(bob)","sha256":"bb"}]}"#)
        #expect(String(decoding: records[2].body, as: UTF8.self) == #"{"name":"Monstera","owner":"\#(bob)"}"#)
        // Clients: the same socket, the same pseudonym; never the socket id itself.
        #expect(records[0].client == records[1].client && records[0].client.hasPrefix("c-"))
        #expect(records[2].client != records[0].client)
        // Nothing of the people's names is left anywhere in the file.
        let file = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        #expect(file.firstRange(of: Array("alice@example.com".utf8)) == nil)
        #expect(file.firstRange(of: Array("bob".utf8)) == nil)
    }

    @Test func withoutAttachmentsKeepsTheirSizesButNotTheirBytes() throws {
        let path = CaptureFormatTests.temporaryPath("capture")
        var settings = CaptureSettings(path: path)
        settings.withoutAttachments = true
        let writer = try CaptureWriter(settings: settings)
        let photo = [UInt8](repeating: 0xAB, count: 50_000)
        writer.submit(Self.event(1, attachments: [photo, [1, 2]]))
        _ = writer.stop()
        let (records, reader) = try CaptureFormatTests.readAll(path)
        #expect(reader.header.withoutAttachments)
        #expect(records[0].attachments.isEmpty)
        #expect(records[0].attachmentSizes == [50_000, 2])
        #expect(records[0].flags.contains(.attachmentsOmitted))
        #expect(records[0].header.principal == "alice@example.com", "people are kept unless pseudonymized")
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)).count < 1_000)
    }

    @Test func aCaptureRotatesBySizeAndIsReadBackAcrossItsFiles() throws {
        let path = CaptureFormatTests.temporaryPath("capture")
        var settings = CaptureSettings(path: path)
        settings.maximumFileBytes = 8_192
        let writer = try CaptureWriter(settings: settings)
        let padding = String(repeating: "x", count: 900)
        for index in 0..<100 { writer.submit(Self.event(index, body: #"{"pad":"\#(padding)"}"#)) }
        let status = writer.stop()
        #expect(status.records == 100)
        #expect(status.segments > 5)
        for segment in 1..<status.segments {
            let size = try FileManager.default.attributesOfItem(atPath: "\(path).\(segment)")[.size] as? Int ?? 0
            #expect(size <= 8_192)
        }
        let (records, reader) = try CaptureFormatTests.readAll(path)
        #expect(reader.ending == .complete)
        #expect(reader.files.count == status.segments)
        #expect(records.map { String(decoding: $0.correlation, as: UTF8.self) } == (0..<100).map { "corr-\($0)" })
    }

    @Test func keepingAFewFilesDeletesTheOldest() throws {
        let path = CaptureFormatTests.temporaryPath("capture")
        var settings = CaptureSettings(path: path)
        settings.maximumFileBytes = 4_096
        settings.keepFiles = 2
        let writer = try CaptureWriter(settings: settings)
        for index in 0..<40 { writer.submit(Self.event(index, body: #"{"pad":"\#(String(repeating: "y", count: 900))"}"#)) }
        let status = writer.stop()
        let existing = (0..<status.segments).filter { FileManager.default.fileExists(atPath: $0 == 0 ? path : "\(path).\($0)") }
        #expect(existing == [status.segments - 2, status.segments - 1])
    }

    @Test func whenTheQueueIsFullRecordsAreDroppedAndCountedNotQueued() throws {
        let path = CaptureFormatTests.temporaryPath("capture")
        var settings = CaptureSettings(path: path)
        settings.queueBytes = 100_000
        let writer = try CaptureWriter(settings: settings)
        // Larger than the whole queue: never taken.
        #expect(!writer.submit(Self.event(0, attachments: [[UInt8](repeating: 1, count: 200_000)])))
        var taken = 0
        let big = [UInt8](repeating: 2, count: 30_000)
        for index in 1...2_000 where writer.submit(Self.event(index, attachments: [big])) { taken += 1 }
        let status = writer.stop()
        #expect(status.dropped == UInt64(2_001 - taken))
        #expect(status.records == UInt64(taken))
        #expect(status.dropped >= 1)
        let (records, _) = try CaptureFormatTests.readAll(path)
        #expect(records.count == taken)
    }

    @Test func aCaptureThatCannotBeCreatedSaysWhy() {
        let settings = CaptureSettings(path: "/nonexistent-directory/capture")
        #expect(throws: CaptureFormatError.self) { try CaptureWriter(settings: settings) }
    }
}
