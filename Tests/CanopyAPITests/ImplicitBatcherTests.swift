import CanopyMessages
import CanopyTesting
import Synchronization
import Testing

@testable import CanopyAPI

/// The batcher alone: what goes out together, and what each caller gets back.
struct ImplicitBatcherTests {
    /// A fetch that records the batches it was given and answers each key from `answer`,
    /// after `delay` (a service's time in the air).
    final class Recorder: Sendable {
        let batches = Mutex<[[String]]>([])
        func fetch(delay: Duration = .zero, _ answer: @escaping @Sendable (String) -> Result<String, any Error>) -> ImplicitBatcher<String, String>.Fetch {
            { keys in
                self.batches.withLock { $0.append(keys) }
                if delay > .zero { try? await Task.sleep(for: delay) }
                return keys.map(answer)
            }
        }
    }

    /// Loads every key at once; each one's answer, in order.
    static func loadAll(_ keys: [String], from batcher: ImplicitBatcher<String, String>) async -> [Result<String, any Error>] {
        await withTaskGroup(of: (Int, Result<String, any Error>).self) { group in
            for (index, key) in keys.enumerated() {
                group.addTask {
                    do { return (index, .success(try await batcher.load(key))) } catch { return (index, .failure(error)) }
                }
            }
            var answers = [Result<String, any Error>?](repeating: nil, count: keys.count)
            for await (index, answer) in group { answers[index] = answer }
            return answers.map { $0! }
        }
    }

    @Test func keysGoAtOnceWhileThereIsRoomInTheAir() async throws {
        let recorder = Recorder()
        let batcher = ImplicitBatcher<String, String>(
            kind: "test", window: .seconds(600), maximumKeys: 64, maximumInFlight: 3,
            fetch: recorder.fetch(delay: .seconds(1)) { .success($0) })
        let answers = await Self.loadAll((0..<6).map { "key-\($0)" }, from: batcher)
        #expect(answers.allSatisfy { (try? $0.get()) != nil })
        // Three alone at once, then the other three together when the first comes back.
        #expect(recorder.batches.withLock { $0.map(\.count).sorted() } == [1, 1, 1, 3])
    }

    @Test func aKeyAlreadyInTheAirIsNotSentAgain() async throws {
        let recorder = Recorder()
        let batcher = ImplicitBatcher<String, String>(
            kind: "test", window: .seconds(600), maximumKeys: 64, maximumInFlight: 2,
            fetch: recorder.fetch(delay: .seconds(1)) { .success("value of \($0)") })
        async let first = batcher.load("a")
        #expect(try await eventually { !recorder.batches.withLock { $0.isEmpty } }) // "a" is in the air
        async let second = batcher.load("a")
        async let other = batcher.load("b")
        #expect(try await [first, second, other] == ["value of a", "value of a", "value of b"])
        #expect(recorder.batches.withLock { $0 } == [["a"], ["b"]], "the second 'a' waited for the first's answer")
        // Once answered, the key is asked for again.
        #expect(try await batcher.load("a") == "value of a")
        #expect(recorder.batches.withLock { $0.count } == 3)
    }

    @Test func aLoneKeyGoesAtOnceWithoutWaitingForItsWindow() async throws {
        let recorder = Recorder()
        let batcher = ImplicitBatcher<String, String>(
            kind: "test", window: .seconds(600), maximumKeys: 64, maximumInFlight: 2, fetch: recorder.fetch { .success("value of \($0)") })
        #expect(try await batcher.load("a") == "value of a")
        #expect(try await batcher.load("b") == "value of b")
        #expect(recorder.batches.withLock { $0 } == [["a"], ["b"]])
    }

    @Test func keysGatherWhileABatchIsInTheAirAndEachCallerGetsItsOwnAnswerOrError() async throws {
        let recorder = Recorder()
        // The first key goes alone and is answered slowly; the window is longer than the test.
        let batcher = ImplicitBatcher<String, String>(
            kind: "test", window: .seconds(600), maximumKeys: 64, maximumInFlight: 1,
            fetch: recorder.fetch(delay: .seconds(1)) { key in
                key.hasPrefix("secret") ? .failure(CanopyError(.notFound, "no \(key)")) : .success("value of \(key)")
            })
        let keys = ["a", "b", "a", "secret-1", "c", "b"]
        let answers = await Self.loadAll(keys, from: batcher)
        let batches = recorder.batches.withLock { $0 }
        #expect(batches.count == 2 && batches[0].count == 1, "\(batches)")
        #expect(
            Set(batches.flatMap { $0 }) == ["a", "b", "c", "secret-1"] && Set(batches[1]).count == batches[1].count,
            "equal keys in one batch share one slot: \(batches)")
        for (key, answer) in zip(keys, answers) {
            switch answer {
            case .success(let value): #expect(value == "value of \(key)")
            case .failure(let error): #expect(key == "secret-1" && (error as? CanopyError)?.code == CanopyError.Code.notFound)
            }
        }
    }

    @Test func aFullBatchLeavesAtOnceEvenWhileAnotherIsInTheAir() async throws {
        let recorder = Recorder()
        let batcher = ImplicitBatcher<String, String>(
            kind: "test", window: .seconds(600), maximumKeys: 4, maximumInFlight: 1,
            fetch: recorder.fetch(delay: .seconds(1)) { .success($0) })
        let clock = ContinuousClock()
        let started = clock.now
        let keys = (0..<8).map { "key-\($0)" }
        let answers = await Self.loadAll(keys, from: batcher)
        #expect(zip(keys, answers).allSatisfy { key, answer in (try? answer.get()) == key })
        // One alone (nothing in the air), one full of 4 at once, the last 3 when both are answered.
        #expect(recorder.batches.withLock { $0.map(\.count).sorted() } == [1, 3, 4])
        #expect(clock.now - started < .seconds(60))
    }

    @Test(.timeLimit(.minutes(1)))
    func whileABatchIsInTheAirAKeyWaitsNoLongerThanTheWindow() async throws {
        // The first batch stays in the air until the test lets it land: only its window can
        // send the second key meanwhile (were it waiting for the first, this would hang).
        let landed = Mutex(false), started = Mutex(false)
        let batcher = ImplicitBatcher<String, String>(kind: "test", window: .milliseconds(20), maximumKeys: 64, maximumInFlight: 1) { keys in
            if keys == ["slow"] {
                started.withLock { $0 = true }
                _ = try? await eventually(within: .seconds(60)) { landed.withLock { $0 } }
            }
            return keys.map { .success($0) }
        }
        async let first = batcher.load("slow")
        #expect(try await eventually { started.withLock { $0 } })
        #expect(try await batcher.load("next") == "next", "it left when its window ended, with the first still in the air")
        landed.withLock { $0 = true }
        #expect(try await first == "slow")
    }

    @Test func whenTheCallFailsEveryKeyOfItsBatchGetsThatFailure() async throws {
        let batcher = ImplicitBatcher<String, String>(kind: "test", window: .milliseconds(5), maximumKeys: 64, maximumInFlight: 2) { keys in
            keys.map { _ in .failure(CanopyError(.noWorkers, "no canopy-images worker")) }
        }
        await #expect(throws: CanopyError(.noWorkers, "no canopy-images worker")) { try await batcher.load("x") }
    }
}
