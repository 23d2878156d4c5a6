import CanopyWire

/// One message that crossed the broker, as a capture file holds it: a client's request, or
/// the answer the broker sent that client (a worker's reply, or an error). A reply record
/// repeats its request's service, operation and header, so a reply can be read (and
/// filtered by person) without its request.
///
/// Clients and workers appear as pseudonyms (a keyed hash of their socket identity, stable
/// within one capture), never as socket ids.
public struct CaptureRecord: Equatable, Sendable {
    /// What a record is: a client's request, the answer the client got, or a mark the broker wrote.
    public enum Kind: UInt8, Sendable {
        case request = 1
        case reply = 2
        /// A mark the broker wrote (format version 2): `body` is a ``CaptureMark``'s JSON.
        case mark = 3
    }

    /// Record flag bits.
    public struct Flags: OptionSet, Equatable, Sendable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }

        /// The reply answered several identical requests (coalesced at the broker).
        public static let shared = Flags(rawValue: 1 << 0)
        /// The answer is an error: `body` is the error's JSON.
        public static let failed = Flags(rawValue: 1 << 1)
        /// The attachments' bytes were left out (`--without-attachments`): only their sizes are kept.
        public static let attachmentsOmitted = Flags(rawValue: 1 << 2)
        /// The client spoke Majordomo (MDPC01), not canopy/3.
        public static let majordomo = Flags(rawValue: 1 << 3)
    }

    public var kind: Kind
    public var flags: Flags
    /// When the broker took the request or sent the reply: nanoseconds since 1970 (UTC).
    public var time: Int64
    /// For a reply: nanoseconds from the broker taking the request to sending this answer.
    public var latencyNanoseconds: UInt64
    /// The client's pseudonym.
    public var client: String
    /// The pseudonym of the worker that answered (empty for requests, and for answers the
    /// broker gave itself: refusals, timeouts).
    public var worker: String
    public var service: String
    public var operation: String
    /// The client's correlation id (for Majordomo clients, which have none, a counter the
    /// broker gives).
    public var correlation: [UInt8]
    /// The request's header: deadline, flags, principal.
    public var header: RequestHeader
    /// The request body, the reply body, or the error's JSON.
    public var body: [UInt8]
    /// Attachment frames (empty when omitted; see ``attachmentSizes``).
    public var attachments: [[UInt8]]
    /// Each attachment's size in bytes, also when its bytes were left out.
    public var attachmentSizes: [Int]

    public init(
        kind: Kind, flags: Flags = [], time: Int64, latencyNanoseconds: UInt64 = 0, client: String, worker: String = "",
        service: String, operation: String, correlation: [UInt8], header: RequestHeader, body: [UInt8],
        attachments: [[UInt8]] = [], attachmentSizes: [Int]? = nil
    ) {
        self.kind = kind
        self.flags = flags
        self.time = time
        self.latencyNanoseconds = latencyNanoseconds
        self.client = client
        self.worker = worker
        self.service = service
        self.operation = operation
        self.correlation = correlation
        self.header = header
        self.body = body
        self.attachments = attachments
        self.attachmentSizes = attachmentSizes ?? attachments.map(\.count)
    }

    /// Bytes this record takes on disk, near enough to bound a queue by.
    public var approximateBytes: Int {
        64 + client.utf8.count + worker.utf8.count + service.utf8.count + operation.utf8.count + correlation.count
            + header.principal.utf8.count + body.count + attachments.reduce(0) { $0 + $1.count + 4 }
    }
}

/// Why bytes are not a capture record, or not a capture file.
public struct CaptureFormatError: Error, Equatable, Sendable, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// The capture file format, version 2 (`docs/PROTOCOL.md`, "Capture files"; version 2 adds
/// the mark record, kind 3, and reads version 1 files as they are). All integers
/// big-endian.
///
/// A file is a 36-byte file header, then records. The header: the magic `CNPYCAP\0`, the
/// format version (u16), flags (u16: bit 0 pseudonymized, bit 1 without attachments), the
/// segment number (u32; a rotated capture's files count 0, 1, 2…), when the capture began
/// (i64, ns since 1970), the capture's 8-byte id (u64), and a CRC-32C of those 32 bytes.
///
/// A record: its payload's length (u32), the payload's CRC-32C (u32), the payload. A
/// payload: kind (u8), flags (u8), time (i64), latency (u64), then client, worker, service,
/// operation and correlation (each u8 length + bytes), the header frame (u16 length +
/// bytes, as on the wire), the body (u32 length + bytes), the attachment count (u8), and per
/// attachment its size (u32) followed by its bytes unless the record's flags say they were
/// left out.
public enum CaptureFormat {
    public static let magic: [UInt8] = Array("CNPYCAP".utf8) + [0]
    public static let version: UInt16 = 2
    /// The versions this build reads.
    public static let readable: ClosedRange<UInt16> = 1...2
    public static let fileHeaderBytes = 36
    /// The largest payload a reader takes: anything longer is damage, not a record.
    public static let maximumPayloadBytes = 1 << 30

    /// What the file header says.
    public struct FileHeader: Equatable, Sendable {
        public var pseudonymized: Bool
        public var withoutAttachments: Bool
        public var segment: UInt32
        /// When the capture began, ns since 1970.
        public var startedAt: Int64
        /// The capture's id: the same in every segment of one capture.
        public var captureID: UInt64

        public init(pseudonymized: Bool, withoutAttachments: Bool, segment: UInt32, startedAt: Int64, captureID: UInt64) {
            self.pseudonymized = pseudonymized
            self.withoutAttachments = withoutAttachments
            self.segment = segment
            self.startedAt = startedAt
            self.captureID = captureID
        }

        public var encoded: [UInt8] {
            var out = CaptureFormat.magic
            out.appendBigEndian(CaptureFormat.version)
            out.appendBigEndian(UInt16((pseudonymized ? 1 : 0) | (withoutAttachments ? 2 : 0)))
            out.appendBigEndian(segment)
            out.appendBigEndian(UInt64(bitPattern: startedAt))
            out.appendBigEndian(captureID)
            out.appendBigEndian(CRC32C.checksum(out))
            return out
        }

        public init(decoding bytes: [UInt8]) throws(CaptureFormatError) {
            guard bytes.count >= CaptureFormat.fileHeaderBytes, Array(bytes.prefix(8)) == CaptureFormat.magic else {
                throw CaptureFormatError("not a Canopy capture file (it does not begin with CNPYCAP)")
            }
            var reader = ByteReader(bytes[0..<CaptureFormat.fileHeaderBytes])
            reader.skip(8)
            let version = reader.uint16()!
            guard CaptureFormat.readable.contains(version) else {
                throw CaptureFormatError(
                    "capture format version \(version); this build reads versions \(CaptureFormat.readable.lowerBound) to \(CaptureFormat.readable.upperBound)")
            }
            let flags = reader.uint16()!
            segment = reader.uint32()!
            startedAt = Int64(bitPattern: reader.uint64()!)
            captureID = reader.uint64()!
            let crc = reader.uint32()!
            guard crc == CRC32C.checksum(Array(bytes[0..<32])) else { throw CaptureFormatError("the capture file's header is damaged (checksum)") }
            pseudonymized = flags & 1 != 0
            withoutAttachments = flags & 2 != 0
        }
    }

    /// A record's bytes: length, checksum, payload.
    /// (The writer's thread runs this for every record: nothing is allocated but `out`'s growth.)
    public static func encode(_ record: CaptureRecord, into out: inout [UInt8]) {
        let start = out.count
        out.append(contentsOf: repeatElement(0, count: 8)) // length and checksum, filled in below
        out.append(record.kind.rawValue)
        out.append(record.flags.rawValue)
        out.appendBigEndian(UInt64(bitPattern: record.time))
        out.appendBigEndian(record.latencyNanoseconds)
        func short(_ text: String) {
            let bytes = text.utf8.prefix(255)
            out.append(UInt8(bytes.count))
            out.append(contentsOf: bytes)
        }
        short(record.client)
        short(record.worker)
        short(record.service)
        short(record.operation)
        out.append(UInt8(min(255, record.correlation.count)))
        out.append(contentsOf: record.correlation.prefix(255))
        // The header frame as on the wire: timeout, flags, principal.
        let principal = record.header.principal.utf8
        out.appendBigEndian(UInt16(5 + principal.count))
        out.appendBigEndian(record.header.timeoutMilliseconds)
        out.append(record.header.flags)
        out.append(contentsOf: principal)
        out.appendBigEndian(UInt32(record.body.count))
        out.append(contentsOf: record.body)
        let omitted = record.flags.contains(.attachmentsOmitted)
        out.append(UInt8(min(255, record.attachmentSizes.count)))
        for (index, size) in record.attachmentSizes.prefix(255).enumerated() {
            out.appendBigEndian(UInt32(size))
            if !omitted { out.append(contentsOf: record.attachments[index]) }
        }
        let payloadCount = UInt32(out.count - start - 8)
        out.withUnsafeMutableBytes { bytes in
            let crc = CRC32C.checksum(UnsafeRawBufferPointer(rebasing: bytes[(start + 8)...]))
            bytes.storeBytes(of: payloadCount.bigEndian, toByteOffset: start, as: UInt32.self)
            bytes.storeBytes(of: crc.bigEndian, toByteOffset: start + 4, as: UInt32.self)
        }
    }

    /// Decodes one record's payload (its checksum already checked).
    public static func decode(payload: ArraySlice<UInt8>) throws(CaptureFormatError) -> CaptureRecord {
        var reader = ByteReader(payload)
        func fail(_ what: String) -> CaptureFormatError { CaptureFormatError("malformed record: \(what)") }
        guard let kindByte = reader.uint8(), let kind = CaptureRecord.Kind(rawValue: kindByte) else { throw fail("unknown kind") }
        guard let flagByte = reader.uint8(), let time = reader.uint64(), let latency = reader.uint64() else { throw fail("short fixed part") }
        var texts: [String] = []
        for name in ["client", "worker", "service", "operation"] {
            guard let count = reader.uint8(), let bytes = reader.bytes(Int(count)) else { throw fail(name) }
            texts.append(String(decoding: bytes, as: UTF8.self))
        }
        guard let correlationCount = reader.uint8(), let correlation = reader.bytes(Int(correlationCount)) else { throw fail("correlation") }
        guard let headerCount = reader.uint16(), let headerBytes = reader.bytes(Int(headerCount)),
            let header = RequestHeader(frame: headerBytes)
        else { throw fail("header") }
        guard let bodyCount = reader.uint32(), let body = reader.bytes(Int(bodyCount)) else { throw fail("body") }
        let flags = CaptureRecord.Flags(rawValue: flagByte)
        guard let attachmentCount = reader.uint8() else { throw fail("attachment count") }
        var attachments: [[UInt8]] = [], sizes: [Int] = []
        for _ in 0..<attachmentCount {
            guard let size = reader.uint32() else { throw fail("attachment size") }
            sizes.append(Int(size))
            if !flags.contains(.attachmentsOmitted) {
                guard let bytes = reader.bytes(Int(size)) else { throw fail("attachment") }
                attachments.append(bytes)
            }
        }
        guard reader.isAtEnd else { throw fail("bytes after the last field") }
        return CaptureRecord(
            kind: kind, flags: flags, time: Int64(bitPattern: time), latencyNanoseconds: latency,
            client: texts[0], worker: texts[1], service: texts[2], operation: texts[3], correlation: correlation,
            header: header, body: body, attachments: attachments, attachmentSizes: sizes)
    }
}

/// Reads big-endian integers and byte runs from a slice, returning nil past its end.
struct ByteReader {
    private let bytes: ArraySlice<UInt8>
    private var index: Int

    init(_ bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
        index = bytes.startIndex
    }

    var isAtEnd: Bool { index == bytes.endIndex }

    mutating func skip(_ count: Int) { index += count }

    mutating func bytes(_ count: Int) -> [UInt8]? {
        guard count >= 0, bytes.endIndex - index >= count else { return nil }
        defer { index += count }
        return Array(bytes[index..<(index + count)])
    }

    mutating func uint8() -> UInt8? {
        guard index < bytes.endIndex else { return nil }
        defer { index += 1 }
        return bytes[index]
    }

    mutating func uint16() -> UInt16? { integer(2).map { UInt16($0) } }
    mutating func uint32() -> UInt32? { integer(4).map { UInt32($0) } }
    mutating func uint64() -> UInt64? { integer(8) }

    private mutating func integer(_ count: Int) -> UInt64? {
        guard bytes.endIndex - index >= count else { return nil }
        var value: UInt64 = 0
        for offset in 0..<count { value = value << 8 | UInt64(bytes[index + offset]) }
        index += count
        return value
    }
}

extension [UInt8] {
    mutating func appendBigEndian<Value: FixedWidthInteger>(_ value: Value) {
        Swift.withUnsafeBytes(of: value.bigEndian) { append(contentsOf: $0) }
    }
}

/// What a mark record says (its body): the cut a snapshot was taken at. Every request
/// recorded after the mark came after the cut; none before it (in a capture started with a
/// hold) did anything the snapshot does not hold.
public struct CaptureMark: Codable, Sendable, Equatable {
    /// The snapshot's directory name beside the capture, or nil when none was taken.
    public var snapshot: String?
    /// Requests held during the snapshot (recorded right after the mark).
    public var held: Int

    public init(snapshot: String?, held: Int) {
        self.snapshot = snapshot
        self.held = held
    }
}
