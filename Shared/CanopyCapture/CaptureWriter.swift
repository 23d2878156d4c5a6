import CanopyMessages
import CanopyWire
import Crypto
import Dispatch
import Foundation
import Glibc
import Synchronization

/// What a capture writes and how.
public struct CaptureSettings: Sendable, Equatable {
    /// The first segment's path; rotated segments add `.1`, `.2`…
    public var path: String
    /// A segment that reaches this many bytes is closed and the next begun.
    public var maximumFileBytes: Int = 1 << 30
    /// Most segments kept: when a new one would exceed it, the oldest rotated one is deleted
    /// (0 keeps every segment).
    public var keepFiles: Int = 0
    /// Principals replaced by keyed hashes (in headers and bodies).
    public var pseudonymize = false
    /// The pseudonyms' key (32 bytes) when the caller gave one (to pseudonymize a snapshot the
    /// same way); otherwise one is made for the capture and never written down.
    public var pseudonymKey: [UInt8]?
    /// Attachment bytes (photos) left out; their sizes are kept.
    public var withoutAttachments = false
    /// Bytes of records waiting for the disk; beyond it records are dropped and counted.
    public var queueBytes: Int = 64 << 20
    /// Whether a file already at ``path`` is replaced (the operator's `--capture FILE`), or
    /// the capture refused (one started over the bus never overwrites).
    public var replaceExisting = true

    public init(path: String) {
        self.path = path
    }
}

/// A message as the broker hands it to the capture: a record without its pseudonyms yet
/// (the writer's thread makes them, off the broker's loop), and the raw socket identities.
public struct CaptureEvent: Equatable, Sendable {
    public var record: CaptureRecord
    public var clientIdentity: [UInt8]
    public var workerIdentity: [UInt8]

    public init(record: CaptureRecord, clientIdentity: [UInt8], workerIdentity: [UInt8] = []) {
        self.record = record
        self.clientIdentity = clientIdentity
        self.workerIdentity = workerIdentity
    }
}

/// Writes a capture on a thread of its own. ``submit(_:)`` never blocks and never waits for
/// the disk: it queues the event, or drops and counts it when the queue holds
/// ``CaptureSettings/queueBytes`` already. Files are created readable by their owner only
/// (mode 0600) and rotated by size.
public final class CaptureWriter: Sendable {
    private struct Queue {
        var events: [CaptureEvent] = []
        var bytes = 0
        var closed = false
        var counts: CaptureStatus
    }

    public let settings: CaptureSettings
    private let queue: Mutex<Queue>
    private let wake = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)

    /// Creates the first segment and starts the writer's thread.
    ///
    /// - Throws: ``CaptureFormatError`` when the file cannot be created.
    public init(settings: CaptureSettings) throws {
        self.settings = settings
        queue = Mutex(Queue(counts: CaptureStatus(capturing: true, path: settings.path, segments: 1)))
        let file = try SegmentFile(settings: settings, captureID: UInt64.random(in: 1 ... .max), startedAt: Self.wallClockNanoseconds())
        let thread = Thread { [self] in
            self.run(file: file)
            self.finished.signal()
        }
        thread.name = "canopy-capture"
        thread.start()
    }

    /// Nanoseconds since 1970, the time capture records carry.
    public static func wallClockNanoseconds() -> Int64 {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec)
    }

    /// Queues events for the disk under one lock (the broker hands over each loop pass's
    /// events together); those that do not fit the queue are dropped and counted.
    public func submit(_ events: [CaptureEvent]) {
        guard !events.isEmpty else { return }
        let wasEmpty: Bool = queue.withLock { queue in
            guard !queue.closed, queue.counts.error == nil else { return false }
            let before = queue.events.count
            for event in events {
                let size = event.record.approximateBytes
                if queue.bytes + size <= settings.queueBytes {
                    queue.events.append(event)
                    queue.bytes += size
                } else {
                    queue.counts.dropped += 1
                }
            }
            return before == 0 && !queue.events.isEmpty
        }
        if wasEmpty { wake.signal() }
    }

    /// Queues an event for the disk; false when it was dropped (the queue is full, or the
    /// capture stopped).
    @discardableResult
    public func submit(_ event: CaptureEvent) -> Bool {
        let size = event.record.approximateBytes
        let wasEmpty: Bool? = queue.withLock { queue in
            guard !queue.closed, queue.counts.error == nil else { return nil }
            guard queue.bytes + size <= settings.queueBytes else {
                queue.counts.dropped += 1
                return nil
            }
            queue.events.append(event)
            queue.bytes += size
            return queue.events.count == 1
        }
        guard let wasEmpty else { return false }
        if wasEmpty { wake.signal() }
        return true
    }

    /// The counts so far.
    public var status: CaptureStatus { queue.withLock { $0.counts } }

    /// Writes what is queued, closes the file, and returns the final counts (again, when
    /// called again).
    public func stop() -> CaptureStatus {
        queue.withLock { $0.closed = true }
        wake.signal()
        finished.wait()
        finished.signal() // a later stop returns at once
        var status = self.status
        status.capturing = false
        return status
    }

    // MARK: - The writer's thread

    private func run(file: SegmentFile) {
        var file = file
        var pseudonyms = settings.pseudonymKey.map { Pseudonyms(key: SymmetricKey(data: $0)) } ?? Pseudonyms()
        var buffer: [UInt8] = []
        buffer.reserveCapacity(1 << 20)
        while true {
            let (events, closed) = queue.withLock { queue -> ([CaptureEvent], Bool) in
                var taken: [CaptureEvent] = []
                swap(&taken, &queue.events)
                queue.bytes = 0
                return (taken, queue.closed)
            }
            if events.isEmpty {
                if closed { break }
                _ = wake.wait(timeout: .now() + .milliseconds(200))
                continue
            }
            var written: UInt64 = 0
            for event in events {
                let record = prepare(event, &pseudonyms)
                let before = buffer.count
                CaptureFormat.encode(record, into: &buffer)
                // A new segment when this record would take the current one past its size.
                if file.bytes + buffer.count > settings.maximumFileBytes, file.bytes + before > CaptureFormat.fileHeaderBytes {
                    let record = Array(buffer[before...])
                    buffer.removeSubrange(before...)
                    guard flush(&buffer, to: &file, lost: written) else { return }
                    written = 0
                    do {
                        file = try file.next(settings: settings)
                        queue.withLock { $0.counts.segments += 1 }
                    } catch {
                        fail(String(describing: error), lost: 1)
                        return
                    }
                    buffer = record
                }
                written += 1
                if buffer.count >= 1 << 20 {
                    guard flush(&buffer, to: &file, lost: written) else { return }
                    written = 0
                }
            }
            guard flush(&buffer, to: &file, lost: written) else { return }
        }
        file.close()
    }

    /// Writes `buffer` and counts its records; on a write error, stops the capture.
    private func flush(_ buffer: inout [UInt8], to file: inout SegmentFile, lost records: UInt64) -> Bool {
        guard !buffer.isEmpty else { return true }
        do {
            try file.write(buffer)
            let count = UInt64(buffer.count)
            queue.withLock { queue in
                queue.counts.records += records
                queue.counts.bytes += count
            }
            buffer.removeAll(keepingCapacity: true)
            return true
        } catch {
            fail(String(describing: error), lost: records)
            file.close()
            return false
        }
    }

    private func fail(_ error: String, lost: UInt64) {
        queue.withLock { queue in
            queue.counts.error = error
            queue.counts.capturing = false
            queue.counts.failed += lost + UInt64(queue.events.count)
            queue.events.removeAll()
            queue.bytes = 0
        }
    }

    /// The record as written: pseudonyms for its peers (always) and its people (when asked),
    /// attachments' bytes left out when asked.
    private func prepare(_ event: CaptureEvent, _ pseudonyms: inout Pseudonyms) -> CaptureRecord {
        var record = event.record
        record.client = pseudonyms.peer(event.clientIdentity, prefix: "c-")
        record.worker = pseudonyms.peer(event.workerIdentity, prefix: "w-")
        if settings.pseudonymize {
            let principal = record.header.principal
            record.body = pseudonyms.body(record.body, principal: principal)
            record.header.principal = pseudonyms.principal(principal)
        }
        if settings.withoutAttachments, !record.attachments.isEmpty {
            record.attachmentSizes = record.attachments.map(\.count)
            record.attachments = []
            record.flags.insert(.attachmentsOmitted)
        }
        return record
    }
}

/// One segment file being written.
struct SegmentFile {
    let descriptor: Int32
    let path: String
    let segment: UInt32
    let captureID: UInt64
    let startedAt: Int64
    private(set) var bytes = 0

    init(settings: CaptureSettings, captureID: UInt64, startedAt: Int64, segment: UInt32 = 0) throws {
        path = segment == 0 ? settings.path : "\(settings.path).\(segment)"
        // Owner only: captures hold people's data. A file already there is replaced (O_TRUNC),
        // never followed through a symbolic link.
        let exclusive = segment == 0 && !settings.replaceExisting
        let descriptor = Glibc.open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (exclusive ? O_EXCL : O_TRUNC), 0o600)
        guard descriptor >= 0 else {
            if errno == EEXIST { throw CaptureFormatError("\(path) exists already; choose another name") }
            throw CaptureFormatError("cannot create the capture file \(path): \(String(cString: strerror(errno)))")
        }
        fchmod(descriptor, 0o600) // an existing file keeps its mode through O_CREAT
        self.descriptor = descriptor
        self.segment = segment
        self.captureID = captureID
        self.startedAt = startedAt
        let header = CaptureFormat.FileHeader(
            pseudonymized: settings.pseudonymize, withoutAttachments: settings.withoutAttachments,
            segment: segment, startedAt: startedAt, captureID: captureID)
        do {
            try write(header.encoded)
        } catch {
            Glibc.close(descriptor)
            throw error
        }
        if settings.keepFiles > 0, Int(segment) >= settings.keepFiles {
            // The oldest segment beyond the number kept goes (the first file, segment 0, too).
            let oldest = Int(segment) - settings.keepFiles
            unlink(oldest == 0 ? settings.path : "\(settings.path).\(oldest)")
        }
    }

    /// The next segment of the same capture (this one closed).
    func next(settings: CaptureSettings) throws -> SegmentFile {
        close()
        return try SegmentFile(settings: settings, captureID: captureID, startedAt: startedAt, segment: segment + 1)
    }

    mutating func write(_ data: [UInt8]) throws {
        var offset = 0
        while offset < data.count {
            let count = data.withUnsafeBytes { Glibc.write(descriptor, $0.baseAddress! + offset, data.count - offset) }
            if count < 0 {
                if errno == EINTR { continue }
                throw CaptureFormatError("writing \(path) failed: \(String(cString: strerror(errno)))")
            }
            offset += count
        }
        bytes += data.count
    }

    func close() {
        Glibc.close(descriptor)
    }
}

/// Writes a capture file record by record on the caller's thread (for tools that make
/// captures from captures: `canopy capture filter`, the golden-capture script). No
/// rotation, no pseudonyms: records are written as given.
public struct CaptureFileWriter {
    private var file: SegmentFile
    private var buffer: [UInt8] = []
    /// Records written so far.
    public private(set) var records = 0

    /// Creates (or replaces) `path`, readable by its owner only.
    public init(path: String, pseudonymized: Bool, withoutAttachments: Bool) throws {
        var settings = CaptureSettings(path: path)
        settings.pseudonymize = pseudonymized
        settings.withoutAttachments = withoutAttachments
        file = try SegmentFile(settings: settings, captureID: UInt64.random(in: 1 ... .max), startedAt: CaptureWriter.wallClockNanoseconds())
    }

    public mutating func append(_ record: CaptureRecord) throws {
        CaptureFormat.encode(record, into: &buffer)
        records += 1
        if buffer.count >= 1 << 20 { try flush() }
    }

    /// Writes what is buffered and closes the file.
    public mutating func close() throws {
        defer { file.close() }
        try flush()
    }

    private mutating func flush() throws {
        try file.write(buffer)
        buffer.removeAll(keepingCapacity: true)
    }
}
