import CanopyMessages
import Foundation
import Hummingbird
import Synchronization
@testable import Reminders

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

/// A local HTTP server that records every request (a webhook receiver or an ntfy server),
/// answering with the statuses it is given, then 200.
final class RecordingServer: Sendable {
    struct Received: Sendable {
        var path: String
        var headers: [String: String]
        var body: [UInt8]
    }

    private final class Shared: Sendable {
        let value = Mutex<(received: [Received], statuses: [Int], port: Int?)>(([], [], nil))
    }

    private let shared = Shared()
    let application: Application<RouterResponder<BasicRequestContext>>

    /// - Parameter delay: how long each answer takes.
    init(delay: Duration = .zero) {
        let shared = self.shared
        let router = Router()
        router.post("**") { request, _ -> Response in
            let body = try await request.body.collect(upTo: 1024 * 1024)
            if delay > .zero { try await Task.sleep(for: delay) }
            var headers: [String: String] = [:]
            for field in request.headers { headers[field.name.canonicalName] = field.value }
            let status = shared.value.withLock { state -> Int in
                state.received.append(Received(path: request.uri.path, headers: headers, body: Array(body.readableBytesView)))
                return state.statuses.isEmpty ? 200 : state.statuses.removeFirst()
            }
            return Response(status: .init(code: status))
        }
        application = Application(router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0), serverName: "recording"),
                                  onServerRunning: { channel in shared.value.withLock { $0.port = channel.localAddress?.port } })
    }

    func url(_ path: String, within limit: Duration = .seconds(30)) async throws -> String {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            if let port = shared.value.withLock({ $0.port }) { return "http://127.0.0.1:\(port)\(path)" }
            try await Task.sleep(for: .milliseconds(10))
        }
        throw CancellationError()
    }

    /// The next answers' statuses, before the 200s.
    func answer(_ statuses: [Int]) { shared.value.withLock { $0.statuses += statuses } }

    var received: [Received] { shared.value.withLock { $0.received } }
}

/// Waits until `condition` holds, for at most `limit`.
func eventually(within limit: Duration = .seconds(10), _ condition: () throws -> Bool) async throws -> Bool {
    let deadline = ContinuousClock.now + limit
    while ContinuousClock.now < deadline {
        if try condition() { return true }
        try await Task.sleep(for: .milliseconds(10))
    }
    return try condition()
}

extension Care.Task {
    static func water(_ plant: String, due: Date, name: String? = nil) -> Care.Task {
        Care.Task(id: "\(plant):water", plantID: plant, kind: .water, title: "Water \(name ?? plant)", due: due)
    }
}
