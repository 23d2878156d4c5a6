import Synchronization

/// Many callers' small writes made together (group commit, as databases batch the commits
/// of concurrent transactions): a call that comes while a batch is being written waits for
/// the next one, which takes everything that came meanwhile, up to ``limit`` at a time. One
/// caller alone is written at once, in a batch of one; under load a store makes one
/// transaction (SQLite) or one statement (PostgreSQL) for many callers instead of one each,
/// and the calling tasks hop to the store's thread once a batch, not once a call.
///
/// The writer (`write`) gets the batch's inputs in the order they came and answers each
/// with a `Result` of its own, in the same order: one input that fails does not fail the
/// others. A writer that throws fails every call of its batch. Waiting calls are at most the
/// callers at once (each waits for its own answer), so the queue is bounded by them.
public final class GroupCommit<Input: Sendable, Output: Sendable>: Sendable {
    /// The most inputs one batch takes.
    public let limit: Int
    private let state = Mutex<(waiting: [Waiting], writing: Bool)>(([], false))

    private struct Waiting: Sendable {
        let input: Input
        let continuation: CheckedContinuation<Output, any Error>
    }

    public init(limit: Int = 128) {
        precondition(limit >= 1, "a batch of \(limit)")
        self.limit = limit
    }

    /// Writes `input` in the next batch (`write` is the same for every call of one
    /// ``GroupCommit``); returns its answer.
    public func submit(
        _ input: Input, write: @escaping @Sendable ([Input]) async throws -> [Result<Output, any Error>]
    ) async throws -> Output {
        // Nobody writing: this call writes its own input at once, on its own task (no hop).
        let alone = state.withLock { state -> Bool in
            guard !state.writing else { return false }
            state.writing = true
            return true
        }
        guard alone else {
            return try await withCheckedThrowingContinuation { continuation in
                let start = state.withLock { state -> Bool in
                    state.waiting.append(Waiting(input: input, continuation: continuation))
                    guard !state.writing else { return false }
                    state.writing = true
                    return true
                }
                if start { Task { await self.drain(write) } }
            }
        }
        let output: Result<Output, any Error>
        do {
            output = try await write([input]).first ?? .failure(Unanswered(batch: 1, answers: 0))
        } catch {
            output = .failure(error)
        }
        // Those who came meanwhile are written by a task of their own: this caller has its answer.
        let more = state.withLock { state -> Bool in
            guard !state.waiting.isEmpty else {
                state.writing = false
                return false
            }
            return true
        }
        if more { Task { await self.drain(write) } }
        return try output.get()
    }

    /// Writes batches until nobody waits.
    private func drain(_ write: @Sendable ([Input]) async throws -> [Result<Output, any Error>]) async {
        while let batch = state.withLock({ state -> [Waiting]? in
            guard !state.waiting.isEmpty else {
                state.writing = false
                return nil
            }
            let batch = Array(state.waiting.prefix(limit))
            state.waiting.removeFirst(batch.count)
            return batch
        }) {
            do {
                let outputs = try await write(batch.map(\.input))
                for (index, waiting) in batch.enumerated() {
                    waiting.continuation.resume(with: index < outputs.count ? outputs[index] : .failure(Unanswered(batch: batch.count, answers: outputs.count)))
                }
            } catch {
                for waiting in batch { waiting.continuation.resume(throwing: error) }
            }
        }
    }
}

/// A writer answered fewer inputs than its batch had (a defect of the writer).
struct Unanswered: Error, CustomStringConvertible {
    let batch: Int
    let answers: Int
    var description: String { "a batch of \(batch) writes got \(answers) answers" }
}
