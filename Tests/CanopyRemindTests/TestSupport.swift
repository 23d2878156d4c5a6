import CanopyMessages
import Foundation
import Hummingbird
import Synchronization

@testable import CanopyRemind

/// A clock the test moves by hand; sleepers wake when it passes their deadline.
final class ManualClock: ReminderClock {
    private struct Sleeper {
        var deadline: Date
        var continuation: CheckedContinuation<Void, any Error>
    }

    private let state: Mutex<(now: Date, sleepers: [UUID: Sleeper])>

    init(_ start: Date) { state = Mutex((start, [:])) }

    func now() -> Date { state.withLock { $0.now } }

    func sleep(until deadline: Date) async throws {
        let id = UUID()
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let ready = state.withLock { state -> Bool in
                    if deadline <= state.now || Task.isCancelled { return true }
                    state.sleepers[id] = Sleeper(deadline: deadline, continuation: continuation)
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            state.withLock { $0.sleepers.removeValue(forKey: id) }?.continuation.resume(throwing: CancellationError())
        }
    }

    func advance(by seconds: TimeInterval) {
        let woken = state.withLock { state -> [Sleeper] in
            state.now += seconds
            let due = state.sleepers.filter { $0.value.deadline <= state.now }
            for key in due.keys { state.sleepers.removeValue(forKey: key) }
            return Array(due.values)
        }
        for sleeper in woken { sleeper.continuation.resume() }
    }
}

extension Care.Task {
    static func water(_ plant: String, due: Date, name: String? = nil) -> Care.Task {
        Care.Task(id: "\(plant):water", plantID: plant, kind: .water, title: "Water \(name ?? plant)", due: due)
    }
}
