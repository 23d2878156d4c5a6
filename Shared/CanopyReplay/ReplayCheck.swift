import CanopyCapture
import CanopyWire
import Foundation

/// What a replay would send, and what in the capture would stop it replaying cleanly
/// (`canopy replay --dry-run`): read in one pass, nothing sent.
public struct ReplayCheck: Codable, Sendable, Equatable {
    public var requests = 0
    public var answers = 0
    public var clients = 0
    /// Seconds from the first request to the last, as captured.
    public var spanSeconds = 0.0
    /// Requests per `service.operation`.
    public var operations: [String: Int] = [:]
    /// Requests with no captured answer (the capture ended first): sent, but not compared.
    public var missingAnswers = 0
    /// Answers whose request is not in the capture (it began before the capture).
    public var answersWithoutRequest = 0
    /// Records whose time is earlier than the record before them.
    public var outOfOrder = 0
    /// Requests whose attachments the capture left out: they cannot be sent.
    public var attachmentsOmitted = 0
    /// Requests services made themselves: left to the services, not sent.
    public var derived = 0
    /// Marks (a snapshot's cut) in the capture.
    public var marks = 0
    /// `service.operation` pairs the stack does not offer (when the stack was asked).
    public var unknownOperations: [String] = []
    /// How reading the capture ended.
    public var ending = ""

    /// The checks that failed, as sentences (empty: the capture replays as it is).
    public var problems: [String] {
        var problems: [String] = []
        if ending != "complete" { problems.append("the capture is \(ending)") }
        if !unknownOperations.isEmpty { problems.append("the stack does not offer \(unknownOperations.joined(separator: ", ")): those requests will fail") }
        if outOfOrder > 0 {
            problems.append("\(outOfOrder) record(s) are earlier than the record before them: the capture was edited or its clock stepped back")
        }
        if missingAnswers > 0 { problems.append("\(missingAnswers) request(s) have no captured answer: they will be sent but not compared") }
        if attachmentsOmitted > 0 {
            problems.append("\(attachmentsOmitted) request(s) were captured without their attachments (--without-attachments): they will be skipped")
        }
        return problems
    }

    /// Reads `reader`'s capture. `offered`, when known, is every `service.operation` the stack
    /// offers now (from `broker.services`).
    public static func make(_ reader: CaptureReader, offered: Set<String>?) throws -> ReplayCheck {
        struct Key: Hashable { let client: String, correlation: [UInt8] }
        var check = ReplayCheck()
        var pending: [Key: Int] = [:]
        var clients = Set<String>()
        var previous: Int64 = .min
        var first: Int64?, last: Int64 = 0
        var unknown = Set<String>()
        do {
            while let record = try reader.next() {
                if record.time < previous { check.outOfOrder += 1 }
                previous = max(previous, record.time)
                let key = Key(client: record.client, correlation: record.correlation)
                switch record.kind {
                case .mark:
                    check.marks += 1
                case .request where record.header.flags & RequestHeader.Flag.derived != 0:
                    check.derived += 1
                    pending[key, default: 0] += 1
                case .request:
                    check.requests += 1
                    first = first ?? record.time
                    last = record.time
                    if clients.count < CaptureSummary.clientLimit { clients.insert(record.client) }
                    let name = "\(record.service).\(record.operation)"
                    if check.operations[name] != nil || check.operations.count < CaptureSummary.operationLimit {
                        check.operations[name, default: 0] += 1
                    }
                    if let offered, !offered.contains(name), unknown.count < 100 { unknown.insert(name) }
                    if record.flags.contains(.attachmentsOmitted) { check.attachmentsOmitted += 1 }
                    pending[key, default: 0] += 1
                case .reply:
                    check.answers += 1
                    if let count = pending[key] {
                        pending[key] = count > 1 ? count - 1 : nil
                    } else {
                        check.answersWithoutRequest += 1
                    }
                }
            }
        } catch {
            // Ends like damage does; `reader.ending` says where.
        }
        check.missingAnswers = pending.values.reduce(0, +)
        check.clients = clients.count
        check.spanSeconds = first.map { Double(last - $0) / 1e9 } ?? 0
        check.unknownOperations = unknown.sorted()
        check.ending = reader.ending?.description ?? "complete"
        return check
    }
}
