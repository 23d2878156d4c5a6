import CanopyCapture
import CanopyMessages
import Foundation

/// Whether a replayed answer is the captured one, and what the replay learns from each
/// answer: ids the stack made anew (``Rebindings``, which later requests are sent with), the
/// fields that hold times, and how long the slowest request so far took (how far a time may
/// move). Pure: answers in, verdicts out; ``ReplaySchedule`` keeps one.
struct AnswerCheck {
    /// What an answer was found to be.
    enum Verdict {
        case matched
        case skipped
        /// The capture has no answer to compare with.
        case unanswered
        case differed([Difference])
        /// The stack did not answer (a timeout, no workers, …): not a difference in what it says.
        case failed(String)
    }

    private let ignored: IgnoredPaths
    private let timeTolerance: Duration?
    private let codec = MessageCodec()
    /// Ids learnt so far (captured → replayed).
    private(set) var rebindings = Rebindings()
    /// The fields found to hold times.
    private(set) var timeFields = Set<String>()
    /// The longest any request answered so far took, captured or replayed (ns): how far a
    /// time stamped while serving it may move.
    private var slowest: Int64 = 0

    /// - Parameters:
    ///   - ignore: JSON paths never compared (``ReplayOptions/ignore``).
    ///   - timeTolerance: how far a time may move beyond the requests' own durations; nil
    ///     compares times as any other value.
    init(ignore: [String], timeTolerance: Duration?) {
        ignored = IgnoredPaths(ignore)
        self.timeTolerance = timeTolerance
    }

    /// Errors that say the stack did not answer, rather than what it answered.
    private static let unanswering: Set<CanopyError.Code> = [.timeout, .noWorkers, .workerLost, .brokerLost, .shuttingDown, .busy]

    /// Compares what the stack answered with the captured answer (nil: the capture has none).
    ///
    /// - Parameters:
    ///   - took: how long the replayed request took.
    ///   - clockShift: the stack's clock minus the capture's when the request went (ns), nil
    ///     when it never went.
    mutating func verdict(_ outcome: ReplaySchedule.Outcome, captured: CaptureRecord?, took: Duration, clockShift: Int64?) -> Verdict {
        defer { slowest = max(slowest, Int64(took.nanoseconds), Int64(captured?.latencyNanoseconds ?? 0)) }
        if case .skipped = outcome { return .skipped }
        guard let captured else { return .unanswered }
        let capturedError = captured.flags.contains(.failed) ? (try? codec.decode(CanopyError.self, from: captured.body)) : nil
        switch outcome {
        case .skipped:
            return .skipped
        case .failure(let error):
            if let capturedError, capturedError.code == error.code { return .matched } // same refusal (messages may name ids)
            if Self.unanswering.contains(error.code) { return .failed("\(error.code.rawValue): \(error.message)") }
            let was = capturedError.map { "error \($0.code.rawValue)" } ?? "an answer"
            return .differed([Difference(path: "$", captured: was, replayed: "error \(error.code.rawValue): \(error.message.prefix(200))")])
        case .answer(let body, let attachments):
            if let capturedError {
                return .differed([Difference(path: "$", captured: "error \(capturedError.code.rawValue)", replayed: "an answer")])
            }
            if body != captured.body {
                // Ids first: what this answer teaches explains its own differences too.
                if let left = try? JSONSerialization.jsonObject(with: Data(captured.body), options: [.fragmentsAllowed]),
                    let right = try? JSONSerialization.jsonObject(with: Data(body), options: [.fragmentsAllowed])
                {
                    rebindings.learn(captured: left, replayed: right)
                }
            }
            var differences = ReplyComparison.differences(
                captured: captured.body, replayed: body, ignored: ignored, rebindings: rebindings,
                times: timeWindow(captured: captured, took: took, clockShift: clockShift), timed: &timeFields)
            if !captured.flags.contains(.attachmentsOmitted) {
                for index in 0..<max(captured.attachments.count, attachments.count) {
                    let left = index < captured.attachments.count ? captured.attachments[index] : nil
                    let right = index < attachments.count ? attachments[index] : nil
                    if left != right && !ignored.contains(["attachments", "\(index)"]) {
                        differences.append(
                            Difference(
                                path: "$attachments[\(index)]", captured: left.map { "\($0.count) bytes" } ?? "(absent)",
                                replayed: right.map { "\($0.count) bytes, other bytes" } ?? "(absent)"))
                    }
                }
            }
            return differences.isEmpty ? .matched : .differed(differences)
        }
    }

    /// How the stack's clock and the capture's differed, and how much room a time gets.
    ///
    /// A time in an answer was stamped while some request was being served: this one, or an
    /// earlier one whose answer did not show it (a photo's `addedAt`, stamped while its
    /// identification was served, first shown by a later list). Within its request it may
    /// fall anywhere between taking it and answering it, in the capture and in the replay, so
    /// it may move by as much as the slowest request served so far took, either way.
    private func timeWindow(captured: CaptureRecord, took: Duration, clockShift: Int64?) -> TimeWindow? {
        guard let timeTolerance, let clockShift else { return nil }
        let slack = Int64(timeTolerance.nanoseconds)
        return TimeWindow(
            shift: clockShift, below: max(Int64(captured.latencyNanoseconds), slowest) + slack,
            above: max(Int64(took.nanoseconds), slowest) + slack)
    }

    /// `$.tasks[3].due` as `$.tasks[*].due`.
    static func pattern(_ path: String) -> String {
        var out = "", inIndex = false
        for character in path {
            if character == "[" {
                inIndex = true
                out += "[*"
                continue
            }
            if character == "]" {
                inIndex = false
                out += "]"
                continue
            }
            if !inIndex { out.append(character) }
        }
        return out
    }
}
