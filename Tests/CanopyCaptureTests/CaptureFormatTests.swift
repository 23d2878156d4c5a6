import CanopyCapture
import CanopyWire
import Foundation
import Testing

/// The capture file format: records, checksums, files cut short or damaged.
struct CaptureFormatTests {
    static func request(_ index: Int, client: String = "c-1", principal: String = "user-1", attachments: [[UInt8]] = []) -> CaptureRecord {
        CaptureRecord(
            kind: .request, time: 1_700_000_000_000_000_000 + Int64(index) * 1_000_000, client: client, service: "care",
            operation: "plants.get", correlation: Array("corr-\(index)".utf8),
            header: RequestHeader(timeoutMilliseconds: 5_000, flags: 1, principal: principal),
            body: Array(#"{"id":"plant-\#(index)"}"#.utf8), attachments: attachments)
    }

    static func reply(_ index: Int, client: String = "c-1", failed: Bool = false) -> CaptureRecord {
        CaptureRecord(
            kind: .reply, flags: failed ? [.failed] : [.shared], time: 1_700_000_000_000_000_000 + Int64(index) * 1_000_000 + 500_000,
            latencyNanoseconds: 500_000, client: client, worker: "w-1", service: "care", operation: "plants.get",
            correlation: Array("corr-\(index)".utf8), header: RequestHeader(timeoutMilliseconds: 5_000, principal: "user-1"),
            body: failed ? Array(#"{"code":"notFound","message":"no such plant"}"#.utf8) : Array(#"{"id":"plant-\#(index)","name":"Monstera"}"#.utf8))
    }

    static func temporaryPath(_ name: String) -> String {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-capture-\(UUID().uuidString)")
        try! FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory.appendingPathComponent(name).path
    }

    static func write(_ records: [CaptureRecord], to path: String) throws {
        var writer = try CaptureFileWriter(path: path, pseudonymized: false, withoutAttachments: false)
        for record in records { try writer.append(record) }
        try writer.close()
    }

    static func readAll(_ path: String) throws -> ([CaptureRecord], CaptureReader) {
        let reader = try CaptureReader(path: path)
        var records: [CaptureRecord] = []
        try reader.forEach { records.append($0) }
        return (records, reader)
    }

    @Test func crc32cMatchesTheCastagnoliCheckValue() {
        #expect(CRC32C.checksum(Array("123456789".utf8)) == 0xE306_9283)
        #expect(CRC32C.checksum([]) == 0)
        // Eight bytes at a time or one: the same checksum, whatever the split.
        let bytes = (0..<1_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        let whole = CRC32C.checksum(bytes)
        for split in [1, 7, 8, 9, 500, 999] {
            let first = bytes[..<split].withUnsafeBytes { CRC32C.update(0, $0) }
            #expect(bytes[split...].withUnsafeBytes { CRC32C.update(first, $0) } == whole)
        }
    }

    @Test func recordsComeBackAsWritten() throws {
        let path = Self.temporaryPath("capture")
        let records = [
            Self.request(1, attachments: [[1, 2, 3], Array(repeating: 7, count: 70_000)]), Self.reply(1), Self.request(2), Self.reply(2, failed: true),
        ]
        try Self.write(records, to: path)
        let (read, reader) = try Self.readAll(path)
        #expect(read == records)
        #expect(reader.ending == .complete)
        #expect(!reader.header.pseudonymized)
    }

    /// Two brokers' captures of one time read as one: in the order of their times, the second
    /// capture's clients renamed so that the same routing id at two brokers is two clients.
    @Test func severalCapturesAreReadAsOneMergedByTime() throws {
        func record(_ time: Int64, client: String) -> CaptureRecord {
            CaptureRecord(
                kind: .request, time: time, client: client, service: "care", operation: "plants.get", correlation: [UInt8(time)],
                header: RequestHeader(timeoutMilliseconds: 1_000), body: [])
        }
        let (first, second) = (Self.temporaryPath("a"), Self.temporaryPath("b"))
        try Self.write([record(1, client: "c1"), record(4, client: "c1"), record(5, client: "c1")], to: first)
        try Self.write([record(2, client: "c1"), record(3, client: "c2"), record(6, client: "c1")], to: second)
        let reader = try CaptureReader(paths: [first, second])
        var records: [CaptureRecord] = []
        try reader.forEach { records.append($0) }
        #expect(records.map(\.time) == [1, 2, 3, 4, 5, 6])
        #expect(records.map(\.client) == ["c1", "2/c1", "2/c2", "c1", "c1", "2/c1"])
        #expect(reader.ending == .complete && reader.allFiles == [first, second])
    }

    @Test func captureFilesAreReadableByTheirOwnerOnly() throws {
        let path = Self.temporaryPath("capture")
        #expect(FileManager.default.createFile(atPath: path, contents: Data("old".utf8), attributes: [.posixPermissions: 0o644]))
        try Self.write([Self.request(1)], to: path)
        let mode = try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int
        #expect(mode == 0o600)
    }

    @Test func aFileCutShortIsReadUpToItsLastWholeRecordAndSaysWhere() throws {
        let path = Self.temporaryPath("capture")
        let records = (1...5).flatMap { [Self.request($0), Self.reply($0)] }
        try Self.write(records, to: path)
        var data = try Data(contentsOf: URL(fileURLWithPath: path))
        // Where the last record begins: the file's size less that record's encoding.
        var last: [UInt8] = []
        CaptureFormat.encode(records.last!, into: &last)
        let lastStart = data.count - last.count
        for cut in [lastStart + 3, lastStart + 8, data.count - 1] {
            try data.prefix(cut).write(to: URL(fileURLWithPath: path))
            let (read, reader) = try Self.readAll(path)
            #expect(read == Array(records.dropLast()))
            guard case .truncated(let file, let offset, _) = reader.ending else {
                Issue.record("expected a truncated ending, got \(String(describing: reader.ending))")
                continue
            }
            #expect(file == path)
            #expect(offset == lastStart)
        }
        data = try Data(contentsOf: URL(fileURLWithPath: path))
        // Cut right after a whole record: complete, one record fewer.
        try data.prefix(lastStart).write(to: URL(fileURLWithPath: path))
        let (read, reader) = try Self.readAll(path)
        #expect(read.count == records.count - 1)
        #expect(reader.ending == .complete)
    }

    @Test func aDamagedRecordStopsTheReadingThereWithItsOffset() throws {
        let path = Self.temporaryPath("capture")
        let records = (1...4).map { Self.request($0) }
        try Self.write(records, to: path)
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        var first: [UInt8] = []
        CaptureFormat.encode(records[0], into: &first)
        let secondStart = CaptureFormat.fileHeaderBytes + first.count
        bytes[secondStart + 20] ^= 0x40 // one bit of the second record's payload
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        let (read, reader) = try Self.readAll(path)
        #expect(read == [records[0]])
        #expect(reader.ending == .damaged(file: path, offset: secondStart, detail: "checksum mismatch"))
        // A length no record can have is damage too, not a reason to allocate it.
        bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        bytes.replaceSubrange(secondStart..<(secondStart + 4), with: [0xFF, 0xFF, 0xFF, 0xFF])
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        let (again, damaged) = try Self.readAll(path)
        #expect(again == [records[0]])
        guard case .damaged(_, let offset, _) = damaged.ending else {
            Issue.record("not damaged: \(String(describing: damaged.ending))")
            return
        }
        #expect(offset == secondStart)
    }

    @Test func aFileThatIsNotACaptureIsRefusedWithASentence() throws {
        let path = Self.temporaryPath("notes.txt")
        try Data("hello, this is not a capture at all, just some words".utf8).write(to: URL(fileURLWithPath: path))
        #expect(throws: CaptureFormatError.self) { try CaptureReader(path: path) }
        #expect(throws: CaptureFormatError.self) { try CaptureReader(path: path + ".missing") }
        var header = CaptureFormat.FileHeader(pseudonymized: true, withoutAttachments: false, segment: 0, startedAt: 1, captureID: 9).encoded
        header[9] = 99 // another format version
        #expect(throws: CaptureFormatError.self) { try CaptureFormat.FileHeader(decoding: header) }
    }

    @Test func selectionKeepsARequestAndItsAnswerTogether() {
        var selection = CaptureSelection(services: ["care"], from: .sinceStart(1_000_000), to: .sinceStart(3_000_000))
        var images = Self.request(9)
        images.service = "images"
        let records = [Self.request(0), Self.request(1), images, Self.request(2), Self.request(3), Self.reply(0), Self.reply(1), Self.reply(2), Self.reply(3)]
        let kept = records.filter { selection.keeps($0) }
        // Requests 1 and 2 fall in [+1 ms, +3 ms); their answers come with them, even the one after the window.
        #expect(kept.map(\.kind) == [.request, .request, .reply, .reply])
        #expect(kept.map { String(decoding: $0.correlation, as: UTF8.self) } == ["corr-1", "corr-2", "corr-1", "corr-2"])
        #expect(CaptureTime("2026-11-24T21:00:00Z") == .instant(1_795_554_000_000_000_000))
        #expect(CaptureTime("+1.5") == .sinceStart(1_500_000_000))
        #expect(CaptureTime("yesterday") == nil)
        #expect(CaptureTime("+-3") == nil)
    }
}
