import AsyncHTTPClient
import CanopyTesting
import Foundation
import Glibc
import NIOHTTP1
import Synchronization
import Testing

/// `canopy up --brokers 2`: two live brokers, every service on both, canopy-api a client of
/// both. Part of ``JourneyTests``: its stacks run one at a time.
extension JourneyTests {
    /// What the load saw.
    final class Stop: Sendable {
        let value = Atomic<Bool>(false)
    }

    final class Answers: Sendable {
        let value = Mutex<(created: [(user: Int, id: String)], reads: Int, failedReads: [String], lostWrites: Int, otherWrites: [String])>(([], 0, [], 0, []))
    }

    @Test func withTwoBrokersTheAppGoesOnWhileEachIsKilledInTurnAndRestarted() async throws {
        let stack = try await Stack.start(["--brokers", "2"])
        defer { try? FileManager.default.removeItem(atPath: stack.data) }
        do {
            let status = try await runExecutable("canopy", ["status", "--data-dir", stack.data])
            #expect(status.output.contains("broker-2"), "canopy status shows both brokers: \(status.output)")
            // Eight people at once, each one request at a time (as a phone makes them).
            var tokens: [String] = []
            for user in 0..<8 { tokens.append(try await stack.token("person-\(user)")) }
            let answers = Answers()
            let stop = Stop()
            // Broker 1 is killed once the load runs (the stack starts it again); once it is back
            // with every service registered, broker 2; the load goes on 2 s more.
            let killer = Task {
                while answers.value.withLock({ $0.reads }) < 40 { try await Task.sleep(for: .milliseconds(50)) }
                kill(try stack.pid("broker"), SIGKILL)
                let registered = try await eventually(within: .seconds(90), every: .milliseconds(250)) {
                    let services = try await runExecutable("canopy", ["services", "--broker", stack.endpoint, "--data-dir", stack.data])
                    return services.status == 0 && ["images", "care", "identify", "remind"].allSatisfy { services.output.contains($0) }
                }
                #expect(registered, "broker 1 came back with every service")
                kill(try stack.pid("broker-2"), SIGKILL)
                try await Task.sleep(for: .seconds(2))
                stop.value.store(true, ordering: .relaxed)
            }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for caller in 0..<8 {
                    let token = tokens[caller]
                    group.addTask {
                        var round = 0
                        while !stop.value.load(ordering: .relaxed) {
                            round += 1
                            // A write: created, or (at a broker that died with it) 502, the broker lost.
                            let created = try await stack.send(
                                .POST, "/v1/plants", token: token,
                                json: #"{"scientificName":"Ficus lyrata","customName":"c\#(caller)-\#(round)"}"#)
                            if created.status == 201, let id = created.object["id"] as? String {
                                answers.value.withLock { $0.created.append((caller, id)) }
                            } else if created.status == 502, created.text.contains("connection to the broker was lost") {
                                answers.value.withLock { $0.lostWrites += 1 }
                            } else {
                                answers.value.withLock { $0.otherWrites.append("\(created.status) \(created.text)") }
                            }
                            // Reads are idempotent: they never fail, whichever broker dies.
                            for path in ["/v1/plants?limit=5", "/v1/tasks/upcoming?days=30"] {
                                let read = try await stack.send(.GET, path, token: token)
                                answers.value.withLock {
                                    $0.reads += 1
                                    if read.status != 200 { $0.failedReads.append("\(path): \(read.status) \(read.text)") }
                                }
                            }
                        }
                    }
                }
                try await group.waitForAll()
            }
            try await killer.value
            let seen = answers.value.withLock { $0 }
            #expect(seen.failedReads.count == 0, "\(seen.failedReads.count) of \(seen.reads) reads failed: \(seen.failedReads.prefix(3))")
            #expect(seen.otherWrites.count == 0, "\(seen.otherWrites.count) writes failed otherwise: \(seen.otherWrites.prefix(3))")
            #expect(seen.created.count > 20 && seen.reads > 40, "\(seen.created.count) plants, \(seen.reads) reads")
            // Every plant answered 201 is there, its owner's.
            var missing: [String] = []
            for (user, id) in seen.created where try await stack.send(.GET, "/v1/plants/\(id)", token: tokens[user]).status != 200 {
                missing.append(id)
            }
            #expect(missing.count == 0, "plants answered 201 and gone: \(missing.prefix(3))")
        } catch {
            await stack.stop()
            throw error
        }
        await stack.stop()
    }
}
