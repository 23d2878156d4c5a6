import CanopyStore
import Synchronization
import Testing

/// ``GroupCommit``: many callers' writes in few batches, each caller its own answer.
struct GroupCommitTests {
    struct Refused: Error, Equatable {
        let input: Int
    }

    @Test func eachCallerGetsItsOwnAnswerAndCallsAtOnceShareBatches() async throws {
        let commit = GroupCommit<Int, Int>(limit: 16)
        let batches = Mutex<[[Int]]>([])
        let write: @Sendable ([Int]) async throws -> [Result<Int, any Error>] = { inputs in
            batches.withLock { $0.append(inputs) }
            try await Task.sleep(for: .milliseconds(5)) // a write that takes a while: others come meanwhile
            return inputs.map { $0 % 7 == 0 ? .failure(Refused(input: $0)) : .success($0 * 10) }
        }
        let answers = await withTaskGroup(of: (Int, Result<Int, Refused>).self) { group in
            for input in 0..<200 {
                group.addTask {
                    do {
                        return (input, .success(try await commit.submit(input, write: write)))
                    } catch {
                        return (input, .failure(error as! Refused))
                    }
                }
            }
            return await group.reduce(into: [:]) { $0[$1.0] = $1.1 }
        }
        #expect(answers.count == 200)
        for (input, answer) in answers {
            #expect(answer == (input % 7 == 0 ? .failure(Refused(input: input)) : .success(input * 10)), "one input refused fails no other")
        }
        let written = batches.withLock { $0 }
        #expect(written.flatMap { $0 }.sorted() == Array(0..<200), "each input written once")
        #expect(written.allSatisfy { $0.count <= 16 }, "no batch past the limit")
        #expect(written.count < 100, "calls at once share batches: \(written.count) batches for 200 calls")
    }

    @Test func aWriterThatFailsFailsItsBatchAndTheNextBatchIsWrittenAgain() async throws {
        let commit = GroupCommit<Int, Int>()
        let failing = Mutex(true)
        let write: @Sendable ([Int]) async throws -> [Result<Int, any Error>] = { inputs in
            if failing.withLock({ $0 }) { throw Refused(input: -1) }
            return inputs.map { .success($0) }
        }
        await #expect(throws: Refused(input: -1)) { try await commit.submit(1, write: write) }
        failing.withLock { $0 = false }
        #expect(try await commit.submit(2, write: write) == 2)
    }
}
