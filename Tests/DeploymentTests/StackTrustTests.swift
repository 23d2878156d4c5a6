import CanopyBus
import CanopyMessages
import CanopyTesting
import Foundation
import Glibc
import Logging
import Testing

/// On one machine too, reaching the broker is not enough: `canopy up` runs the bus over
/// CurveZMQ with keys of its own (made in `<data-dir>/keys` at the first start), so a local
/// process that is not one of the stack's own can neither serve as a service nor call, a
/// service's key serves that service alone, and only a worker's key may make a request as a
/// service (the derived flag).
@Suite(.serialized)
struct StackTrustTests {
    @Test func onlyTheStacksOwnKeysServeOrCallOnACanopyUpStack() async throws {
        let data = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-trust-\(UUID().uuidString)").path
        let stranger = try TemporaryDirectory("canopy-trust-stranger")
        defer {
            try? FileManager.default.removeItem(atPath: data)
            stranger.remove()
        }
        let stack = ["--data-dir", data]
        let broker = "tcp://127.0.0.1:\(FreePorts.any())"
        let up = try await runExecutable(
            "canopy",
            [
                "up", "--detach", "--broker", broker, "--http", "127.0.0.1:\(FreePorts.any())",
                "--metrics-base", "\(FreePorts.run(of: 5))",
            ] + stack, limit: 240)
        defer { _ = try? CanopyUpTests.runDown(stack) }
        try #require(up.status == 0, "\(up.output) \(up.errors)")

        // The keys are the owner's alone.
        func mode(_ path: String) -> Int { ((try? FileManager.default.attributesOfItem(atPath: data + path))?[.posixPermissions] as? Int) ?? -1 }
        #expect(mode("/keys") == 0o700)
        for name in ["broker", "care", "api", "operator"] { #expect(mode("/keys/\(name).key") == 0o600, "\(name).key") }

        // The operator's CLI finds the stack's keys in its data directory.
        func careWorkers() async throws -> Int? {
            let listed = try await runExecutable("canopy", ["services", "--broker", broker] + stack)
            guard listed.status == 0 else { return nil }
            return listed.output.split(separator: "\n").first { $0.hasPrefix("care ") }.flatMap {
                $0.split(separator: " ").dropFirst().first.flatMap { Int($0) }
            }
        }
        #expect(try await careWorkers() == 1)

        // A process without the stack's keys cannot call (its handshake is refused) ...
        let refused = try await runExecutable(
            "canopy",
            [
                "send", "care", "plants.list", "--principal", "demo", "--json", #"{"limit":10}"#,
                "--broker", broker, "--timeout-ms", "3000", "--data-dir", stranger.url.path,
            ])
        #expect(refused.status != 0 && !refused.output.contains("plants"), "\(refused.output) \(refused.errors)")

        // ... nor serve: a worker with no key never registers,
        let rogue = Process()
        rogue.executableURL = try LiveBus.executable("canopy-test-worker")
        rogue.arguments = ["--endpoint", broker, "--name", "rogue", "--log-level", "critical"]
        try rogue.run()
        defer { if rogue.isRunning { kill(rogue.processIdentifier, SIGKILL) } }
        // ... and one presenting another service's key (remind's) as care is refused and logged.
        let impostor = Process()
        impostor.executableURL = try LiveBus.executable("canopy-care")
        impostor.arguments = [
            "serve", "--endpoint", broker, "--data-dir", stranger.url.path, "--metrics-bind", "off", "--log-level", "critical",
            "--curve-server-key", "\(data)/keys/broker.pub", "--curve-secret-key-file", "\(data)/keys/remind.key",
        ]
        try impostor.run()
        defer { if impostor.isRunning { kill(impostor.processIdentifier, SIGKILL) } }
        func brokerLog() -> String { (try? String(contentsOfFile: "\(data)/logs/broker.log", encoding: .utf8)) ?? "" }
        #expect(try await eventually(within: .seconds(60)) { brokerLog().contains("worker refused") }, "\(CanopyUpTests.logTails(data, ["broker"]))")
        try await Task.sleep(for: .seconds(3)) // the rogue worker has had its time to try
        let services = try await runExecutable("canopy", ["services", "--broker", broker] + stack)
        #expect(
            services.status == 0 && !services.output.contains("rogue") && !services.output.split(separator: "\n").contains { $0.hasPrefix("test ") },
            "\(services.output)")
        #expect(try await careWorkers() == 1, "the impostor never joined care")

        // The operator's key is a client's: it may call, but not as a service (the derived
        // flag, which operations such as images.purge take alone).
        var configuration = BusClient.Configuration(endpoint: broker)
        configuration.curve = try stackOperatorCurve(data: data)
        configuration.defaultTimeout = .seconds(20)
        let operatorClient = try BusClient(configuration: configuration, context: ZMQContext(), logger: Logger(label: "trust"))
        defer { operatorClient.close() }
        _ = try await operatorClient.call(Care.ListPlants.self, .init(limit: 10), principal: "demo")
        configuration.derived = true
        let posing = try BusClient(configuration: configuration, context: ZMQContext(), logger: Logger(label: "trust"))
        defer { posing.close() }
        await #expect {
            _ = try await posing.call(Images.Purge.self, .init(plantID: "plant-1"), principal: "demo")
        } throws: { error in
            "\(error)".contains("worker key")
        }
    }
}
