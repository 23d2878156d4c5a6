import Foundation
import Glibc

/// Reads a capture one record at a time, from its first segment through its rotated ones
/// (`FILE`, `FILE.1`, `FILE.2`…, those of the same capture), holding one read buffer and one
/// record in memory however large the files are.
///
/// A file cut short (a crash mid-write) or damaged ends the reading at its last whole
/// record; ``ending`` then says which file, at which byte offset, and why.
///
/// Several captures (one per broker, taken at the same time: ``init(paths:)``) are read as
/// one, merged by time, each capture's clients told apart (a broker names its clients by its
/// own routing ids, which another broker may give too).
public final class CaptureReader {
    /// How the reading ended.
    public enum Ending: Equatable, Sendable, CustomStringConvertible {
        /// Every record of every segment was whole.
        case complete
        /// A segment ends inside a record: everything before `offset` was read.
        case truncated(file: String, offset: Int, detail: String)
        /// A record's checksum or fields are wrong at `offset`: nothing from there on was read.
        case damaged(file: String, offset: Int, detail: String)

        public var description: String {
            switch self {
            case .complete: "complete"
            case .truncated(let file, let offset, let detail): "cut short: \(file) ends inside a record at byte \(offset) (\(detail)); read up to there"
            case .damaged(let file, let offset, let detail): "damaged: \(file) at byte \(offset) (\(detail)); read up to there"
            }
        }
    }

    /// The first segment's header.
    public let header: CaptureFormat.FileHeader
    /// The files read, in order.
    public let files: [String]
    /// Set once ``next()`` returned nil.
    public private(set) var ending: Ending?
    /// Bytes read so far, over all segments.
    public private(set) var bytesRead = 0
    /// The segment being read.
    public private(set) var currentFile: String

    /// With several captures: a reader for each, and each one's next record (the merge).
    private var merged: [CaptureReader] = []
    private var heads: [CaptureRecord?] = []

    private var remainingFiles: [String]
    private var descriptor: Int32
    private var buffer: [UInt8] = []
    private var position = 0
    /// Offset in the current file of `buffer[0]`.
    private var bufferOffset = 0
    private var endOfFile = false
    /// The current segment's size in bytes, which bounds what a record can claim.
    private var fileSize: Int
    private static let chunk = 1 << 20

    /// Opens `path` (and the rotated segments after it, when `followRotations`).
    ///
    /// - Throws: ``CaptureFormatError`` when the file cannot be opened or is not a capture.
    public init(path: String, followRotations: Bool = true) throws {
        let (descriptor, header) = try Self.open(path)
        self.descriptor = descriptor
        self.header = header
        fileSize = Self.size(descriptor)
        currentFile = path
        var following: [String] = []
        if followRotations {
            var segment = 1
            while FileManager.default.fileExists(atPath: "\(path).\(segment)") {
                following.append("\(path).\(segment)")
                segment += 1
            }
        }
        remainingFiles = following
        files = [path] + following
        bufferOffset = CaptureFormat.fileHeaderBytes
        bytesRead = CaptureFormat.fileHeaderBytes
    }

    /// Opens several captures (each with its rotated segments) to read as one, in the order
    /// of their records' times; the clients of the second capture on are renamed `2/CLIENT`,
    /// `3/CLIENT`…, so that two brokers' clients never pass for one. One path reads as
    /// ``init(path:followRotations:)`` does.
    ///
    /// - Throws: ``CaptureFormatError`` when a file cannot be opened or is not a capture.
    public convenience init(paths: [String]) throws {
        guard let first = paths.first else { throw CaptureFormatError("no capture file given") }
        try self.init(path: first)
        guard paths.count > 1 else { return }
        let others = try paths.dropFirst().map { try CaptureReader(path: $0) }
        // This reader becomes the merge: a reader of its own first file is the first source.
        merged = [try CaptureReader(path: first)] + others
        heads = try merged.map { try $0.next() }
        mergedFiles = merged.flatMap(\.files)
    }

    /// Every file read, with several captures.
    private var mergedFiles: [String]?

    /// The files read: the capture's segments, or every capture's.
    public var allFiles: [String] { mergedFiles ?? files }

    /// The next record of the merge: the earliest head, its client renamed for its capture.
    private func nextMerged() throws -> CaptureRecord? {
        guard let index = heads.indices.filter({ heads[$0] != nil }).min(by: { heads[$0]!.time < heads[$1]!.time }), var record = heads[index] else {
            ending = merged.lazy.compactMap(\.ending).first { $0 != .complete } ?? .complete
            bytesRead = merged.reduce(0) { $0 + $1.bytesRead }
            return nil
        }
        heads[index] = try merged[index].next()
        bytesRead = merged.reduce(0) { $0 + $1.bytesRead }
        if index > 0 { record.client = "\(index + 1)/\(record.client)" }
        return record
    }

    deinit { if descriptor >= 0 { Glibc.close(descriptor) } }

    private static func size(_ descriptor: Int32) -> Int {
        var status = stat()
        return fstat(descriptor, &status) == 0 ? Int(status.st_size) : 0
    }

    /// The largest record a writer can make: one that fills a segment of the format's largest.
    static let maximumRecordBytes = CaptureFormat.maximumPayloadBytes - CaptureFormat.fileHeaderBytes - 8

    private static func open(_ path: String) throws -> (Int32, CaptureFormat.FileHeader) {
        let descriptor = Glibc.open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else {
            throw CaptureFormatError("cannot open \(path): \(String(cString: strerror(errno)))")
        }
        var status = stat()
        if fstat(descriptor, &status) == 0, status.st_mode & S_IFMT != S_IFREG {
            Glibc.close(descriptor)
            throw CaptureFormatError("\(path) is not a file (a directory?); give a capture file")
        }
        var header = [UInt8](repeating: 0, count: CaptureFormat.fileHeaderBytes)
        let count = header.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
        guard count == CaptureFormat.fileHeaderBytes else {
            Glibc.close(descriptor)
            throw CaptureFormatError("\(path) is too short to be a capture file")
        }
        let decoded: CaptureFormat.FileHeader
        do {
            decoded = try CaptureFormat.FileHeader(decoding: header)
        } catch {
            Glibc.close(descriptor)
            throw CaptureFormatError("\(path): \(error)")
        }
        return (descriptor, decoded)
    }

    /// The next record, or nil at the end (see ``ending``).
    public func next() throws -> CaptureRecord? {
        guard ending == nil else { return nil }
        if !merged.isEmpty { return try nextMerged() }
        while true {
            let recordOffset = bufferOffset + position
            guard ensure(8) else {
                if available == 0 {
                    if nextSegment() { continue }
                    if ending == nil { ending = .complete }
                } else {
                    ending = .truncated(file: currentFile, offset: recordOffset, detail: "\(available) bytes of a record's 8-byte prefix")
                }
                return nil
            }
            let length = Int(readUInt32(at: position)), crc = readUInt32(at: position + 4)
            guard length <= Self.maximumRecordBytes else {
                ending = .damaged(
                    file: currentFile, offset: recordOffset, detail: "a record length of \(length) bytes, over the format's \(Self.maximumRecordBytes)")
                return nil
            }
            // Bounded by what the file still holds (asked again once: a capture being written
            // grows) before anything is allocated for it.
            if length > fileSize - recordOffset - 8 { fileSize = Self.size(descriptor) }
            let remaining = max(0, fileSize - recordOffset - 8)
            guard length <= remaining, ensure(8 + length) else {
                ending = .truncated(file: currentFile, offset: recordOffset, detail: "\(min(remaining, max(0, available - 8))) of the record's \(length) bytes")
                return nil
            }
            let payload = buffer[(position + 8)..<(position + 8 + length)]
            let actual = payload.withUnsafeBytes { CRC32C.checksum($0) }
            guard actual == crc else {
                ending = .damaged(file: currentFile, offset: recordOffset, detail: "checksum mismatch")
                return nil
            }
            do {
                let record = try CaptureFormat.decode(payload: payload)
                position += 8 + length
                bytesRead += 8 + length
                return record
            } catch {
                ending = .damaged(file: currentFile, offset: recordOffset, detail: error.description)
                return nil
            }
        }
    }

    /// Every remaining record, read one at a time into `body`.
    public func forEach(_ body: (CaptureRecord) throws -> Void) throws {
        while let record = try next() { try body(record) }
    }

    private var available: Int { buffer.count - position }

    private func readUInt32(at index: Int) -> UInt32 {
        UInt32(buffer[index]) << 24 | UInt32(buffer[index + 1]) << 16 | UInt32(buffer[index + 2]) << 8 | UInt32(buffer[index + 3])
    }

    /// Makes at least `count` bytes available from `position`, reading more of the file;
    /// false when the file ends first.
    private func ensure(_ count: Int) -> Bool {
        if available >= count { return true }
        if position > 0 {
            buffer.removeSubrange(0..<position)
            bufferOffset += position
            position = 0
        }
        while buffer.count < count && !endOfFile {
            let want = max(Self.chunk, count - buffer.count)
            let start = buffer.count
            buffer.append(contentsOf: repeatElement(0, count: want))
            let got = buffer.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress! + start, want) }
            buffer.removeSubrange((start + max(0, got))...)
            if got <= 0 { endOfFile = true }
        }
        return buffer.count >= count
    }

    /// Moves to the next rotated segment of the same capture; false when there is none.
    private func nextSegment() -> Bool {
        while let path = remainingFiles.first {
            remainingFiles.removeFirst()
            let descriptor: Int32, header: CaptureFormat.FileHeader
            do {
                (descriptor, header) = try Self.open(path)
            } catch {
                ending = .damaged(file: path, offset: 0, detail: "\(error)")
                return false
            }
            guard header.captureID == self.header.captureID else {
                Glibc.close(descriptor)
                continue
            }
            Glibc.close(self.descriptor)
            self.descriptor = descriptor
            fileSize = Self.size(descriptor)
            currentFile = path
            buffer.removeAll(keepingCapacity: true)
            position = 0
            bufferOffset = CaptureFormat.fileHeaderBytes
            bytesRead += CaptureFormat.fileHeaderBytes
            endOfFile = false
            return true
        }
        return false
    }
}
