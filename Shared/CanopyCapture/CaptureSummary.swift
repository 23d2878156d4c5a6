import CanopyMessages
import Foundation
import Histogram

/// What a capture holds, counted in one pass with memory that does not grow with the file
/// (`canopy capture inspect`): per service and operation, requests, answers, errors by
/// code, shared answers, bytes and answer latency; the time span; how the reading ended.
public struct CaptureSummary: Codable, Sendable, Equatable {
    /// One service and operation's figures: requests, answers, errors, answers shared by
    /// coalesced requests, bytes each way, and answer latency.
    public struct Operation: Codable, Sendable, Equatable {
        public var service: String
        public var operation: String
        public var requests: UInt64 = 0
        public var replies: UInt64 = 0
        public var errors: UInt64 = 0
        public var shared: UInt64 = 0
        public var requestBytes: UInt64 = 0
        public var replyBytes: UInt64 = 0
        /// Answer latency at the broker, from its records.
        public var latencyP50Micros: UInt64 = 0
        public var latencyP99Micros: UInt64 = 0
    }

    public var files: [String]
    public var pseudonymized: Bool
    public var withoutAttachments: Bool
    public var records: UInt64 = 0
    public var requests: UInt64 = 0
    public var replies: UInt64 = 0
    public var errors: UInt64 = 0
    public var bytes: UInt64 = 0
    /// Distinct clients, counted up to ``CaptureSummary/clientLimit`` (then "at least").
    public var clients: Int = 0
    /// The first and last record's time, ns since 1970 (0 when there are none).
    public var firstTime: Int64 = 0
    public var lastTime: Int64 = 0
    /// Errors by code (`timeout`, `notFound`…).
    public var errorCodes: [String: UInt64] = [:]
    /// Sorted by service, then operation.
    public var operations: [Operation] = []
    /// How the reading ended (``CaptureReader/Ending``'s description).
    public var ending: String = ""
    public var complete = true
    /// The mark records (a snapshot's cut): when each was written, and the snapshot it names.
    public var marks: [Mark] = []

    /// A mark record: when the broker wrote it, the snapshot it names (if any), and the requests held.
    public struct Mark: Codable, Sendable, Equatable {
        public var time: Int64
        public var snapshot: String?
        public var held: Int
    }

    /// Most distinct clients counted, and most (service, operation) rows kept: beyond them a
    /// hostile or huge capture cannot make the summary grow (extra rows fold into `(other)`).
    public static let clientLimit = 100_000
    public static let operationLimit = 10_000

    public var spanSeconds: Double { Double(lastTime - firstTime) / 1e9 }

    /// Reads the whole capture through `reader`, calling `progress` now and then with the
    /// bytes read so far.
    public static func make(_ reader: CaptureReader, progress: (Int) -> Void = { _ in }) throws -> CaptureSummary {
        var summary = CaptureSummary(
            files: reader.files, pseudonymized: reader.header.pseudonymized,
            withoutAttachments: reader.header.withoutAttachments)
        struct Key: Hashable { let service: String, operation: String }
        var rows: [Key: (Operation, Histogram<UInt64>)] = [:]
        var clients = Set<String>()
        let decoder = JSONDecoder()
        let other = Key(service: "(other)", operation: "")
        while let record = try reader.next() {
            summary.records += 1
            if summary.records % 4096 == 0 { progress(reader.bytesRead) }
            if record.kind == .mark {
                let mark = try? decoder.decode(CaptureMark.self, from: Data(record.body))
                if summary.marks.count < 1_000 { summary.marks.append(Mark(time: record.time, snapshot: mark?.snapshot, held: mark?.held ?? 0)) }
                continue
            }
            if summary.firstTime == 0 || record.time < summary.firstTime { summary.firstTime = record.time }
            summary.lastTime = max(summary.lastTime, record.time)
            let size = UInt64(record.body.count + record.attachmentSizes.reduce(0, +))
            summary.bytes += size
            if clients.count < clientLimit { clients.insert(record.client) }
            var key = Key(service: record.service, operation: record.operation)
            if rows[key] == nil && rows.count >= operationLimit { key = other }
            var (row, histogram) =
                rows[key] ?? (
                    Operation(service: key.service, operation: key.operation),
                    Histogram<UInt64>(highestTrackableValue: 3_600_000_000, numberOfSignificantValueDigits: .two)
                )
            switch record.kind {
            case .request:
                summary.requests += 1
                row.requests += 1
                row.requestBytes += size
            case .reply:
                summary.replies += 1
                row.replies += 1
                row.replyBytes += size
                if record.flags.contains(.shared) { row.shared += 1 }
                if record.flags.contains(.failed) {
                    summary.errors += 1
                    row.errors += 1
                    let code = (try? decoder.decode(CanopyError.self, from: Data(record.body)))?.code.rawValue ?? "unreadable"
                    summary.errorCodes[code, default: 0] += 1
                }
                _ = histogram.record(record.latencyNanoseconds / 1_000)
            case .mark:
                break // counted above
            }
            rows[key] = (row, histogram)
        }
        progress(reader.bytesRead)
        summary.clients = clients.count
        summary.operations = rows.values.map { row, histogram in
            var row = row
            if histogram.totalCount > 0 {
                row.latencyP50Micros = histogram.valueAtPercentile(50)
                row.latencyP99Micros = histogram.valueAtPercentile(99)
            }
            return row
        }.sorted { ($0.service, $0.operation) < ($1.service, $1.operation) }
        summary.ending = reader.ending?.description ?? "complete"
        summary.complete = reader.ending == .complete
        return summary
    }
}
