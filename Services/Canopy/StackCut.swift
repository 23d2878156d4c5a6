import CanopyBus
import CanopyMessages
import CanopyServiceKit
import Foundation

/// The one moment a backup is taken at, across every store of a running stack: each broker
/// holds new client requests (`broker.hold`) until the requests in the air are answered, the
/// caller pins what it copies (a read transaction on every store, a PostgreSQL snapshot), and
/// the requests go on. A request either did everything it does in the stores before the cut
/// or nothing yet, so the stores agree with each other.
enum StackCut {
    /// Runs `atTheCut` at one cut of the stack in `stack`'s data directory, and returns how
    /// long requests were held, in milliseconds. A stack that is not running (no supervisor)
    /// changes nothing meanwhile: `atTheCut` runs at once and nothing is held. Every hold ends
    /// by itself after `holdMilliseconds`, so a backup that dies never stops the stack for long.
    static func hold(stack: StackOptions, holdMilliseconds: Int, _ atTheCut: () throws -> Void) async throws -> Double {
        guard let state = stack.layout.state(), state.supervisorAlive else {
            try atTheCut()
            return 0
        }
        let common = try CommonOptions.parse(["--endpoint", state.endpoint])
        let brokers = try eachBroker(common, stack: stack)
        defer { brokers.forEach { $0.bus.close() } }
        var held: [(endpoint: String, bus: BusClient)] = []
        /// Lets every held broker's requests go; the brokers whose hold had ended by itself.
        func release() async -> [String] {
            var ended: [String] = []
            for broker in held where (try? await broker.bus.call(Broker.CaptureRelease.self, .init(snapshot: nil), timeout: .seconds(10))) == nil {
                ended.append(broker.endpoint)
            }
            return ended
        }
        let started = ContinuousClock.now
        do {
            for (endpoint, bus) in brokers {
                do {
                    _ = try await bus.call(Broker.Hold.self, .init(holdMilliseconds: holdMilliseconds), timeout: .milliseconds(Int64(holdMilliseconds) + 5_000))
                } catch let error as CanopyError {
                    throw CommandFailure("the broker at \(endpoint) could not hold the stack's requests for the cut: \(error.message)\(error.code == .timeout ? " (is the stack running? canopy status)" : "")")
                }
                held.append((endpoint, bus))
            }
            try atTheCut()
        } catch {
            _ = await release()
            throw error
        }
        let ended = await release()
        let heldFor = ContinuousClock.now - started
        guard ended.isEmpty else {
            throw CommandFailure("the hold at \(ended.joined(separator: ", ")) ended by itself before the stores were pinned (after \(Int(heldFor.seconds * 1_000)) ms), so they would not agree; nothing was kept. Try again, or with a longer --hold-ms")
        }
        return (heldFor.seconds * 10_000).rounded() / 10
    }
}
