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
    /// Runs `atTheCut` at one cut and returns how long requests were held, in milliseconds:
    /// the cut of `brokers` when named (a stack run elsewhere: compose, several hosts), else of
    /// the stack `canopy up` runs from `stack`'s data directory. With neither (no broker named,
    /// no supervisor alive there) `atTheCut` runs at once and nil says nothing was held. Every
    /// hold ends by itself after `holdMilliseconds`, so a backup that dies never stops the
    /// stack for long.
    static func hold(stack: StackOptions, brokers named: [String]?, holdMilliseconds: Int, _ atTheCut: () throws -> Void) async throws -> Double? {
        let endpoints: String
        if let named, !named.isEmpty {
            endpoints = named.joined(separator: ",")
        } else if let state = stack.layout.state(), state.supervisorAlive {
            endpoints = state.endpoint
        } else {
            try atTheCut()
            return nil
        }
        let common = try CommonOptions.parse(["--endpoint", endpoints])
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
                    held.append((endpoint, bus)) // a hold begun after the client stopped waiting is ended too
                    throw CommandFailure("the broker at \(endpoint) could not hold the stack's requests for the cut: \(error.message)")
                }
                held.append((endpoint, bus))
            }
            do {
                try atTheCut()
            } catch let error as CommandFailure {
                throw error
            } catch {
                throw CommandFailure("the stores could not be pinned at the cut: \(error)")
            }
        } catch {
            _ = await release()
            throw error
        }
        let ended = await release()
        let heldFor = ContinuousClock.now - started
        guard ended.isEmpty else {
            throw CommandFailure(
                "the hold at \(ended.joined(separator: ", ")) ended by itself before the stores were pinned (after \(Int(heldFor.seconds * 1_000)) ms), so they would not agree; nothing was kept. Try again, or with a longer --hold-ms"
            )
        }
        return (heldFor.seconds * 10_000).rounded() / 10
    }
}
