import CanopyDeployment
import CanopyServiceKit
import CanopyTesting
import Foundation
import Testing

/// A port another program holds stops every executable at once, with a sentence naming the
/// port, the option that moves it and what holds it, and a non-zero exit: it never starts half
/// way and then ignores SIGTERM.
@Suite(.serialized)
struct PortTakenTests {
    /// A data directory with a token key, as `canopy up` makes one.
    func dataDirectory() throws -> URL {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-ports-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try Data("dG9rZW4ta2V5LWZvci10ZXN0cy1vbmx5LXRva2VuLWtleS1mb3ItdGVzdHMtb25seQ==".utf8).write(to: directory.appendingPathComponent("token.key"))
        return directory
    }

    @Test(arguments: CanopyStack.services)
    func aTakenMetricsPortStopsTheExecutableAtOnceWithASentence(service: CanopyStack.Service) async throws {
        let taken = FreePorts.hold()
        defer { taken.release() }
        let directory = try dataDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        // The stack's usual arguments, with this service's metrics port the one held.
        let launch = CanopyStack.Launch(
            endpoint: "tcp://127.0.0.1:\(FreePorts.any())", http: "127.0.0.1:\(FreePorts.any())",
            dataDirectory: directory.path, metricsBase: taken.port - (service.metricsPort - CanopyStack.broker.metricsPort),
            tokenKeyFile: directory.appendingPathComponent("token.key").path)
        let result = try await runExecutable(service.executable, launch.arguments(service), limit: 30)
        #expect(result.status != 0 && result.status != 15, "\(service.executable) exited \(result.status)")
        #expect(result.errors.contains("cannot listen on 127.0.0.1:\(taken.port) for /metrics and /health"), "\(result.errors.suffix(600))")
        #expect(result.errors.contains("--metrics-bind"))
        #expect(result.errors.contains("(pid \(getpid())"), "the holder is named: \(result.errors.suffix(600))")
        // Nothing was started: no store was opened.
        if let store = service.store {
            #expect(!FileManager.default.fileExists(atPath: directory.appendingPathComponent(store).path))
        }
    }

    @Test func aTakenHTTPPortStopsCanopyAPINamingHTTP() async throws {
        let taken = FreePorts.hold()
        defer { taken.release() }
        let directory = try dataDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let result = try await runExecutable(
            "canopy-api",
            [
                "serve", "--endpoint", "tcp://127.0.0.1:\(FreePorts.any())", "--http", "127.0.0.1:\(taken.port)",
                "--metrics-bind", "off", "--token-key-file", directory.appendingPathComponent("token.key").path,
            ],
            limit: 30)
        #expect(result.status != 0 && result.status != 15)
        #expect(result.errors.contains("cannot listen on 127.0.0.1:\(taken.port) for the HTTP API"), "\(result.errors.suffix(600))")
        #expect(result.errors.contains("--http"))
    }

    @Test func aTakenBusEndpointStopsTheBrokerNamingBind() async throws {
        let taken = FreePorts.hold()
        defer { taken.release() }
        let result = try await runExecutable("canopy-broker", ["serve", "--bind", "tcp://127.0.0.1:\(taken.port)", "--metrics-bind", "off"], limit: 30)
        #expect(result.status != 0 && result.status != 15)
        #expect(result.errors.contains("cannot listen on tcp://127.0.0.1:\(taken.port) for the bus"), "\(result.errors.suffix(600))")
        #expect(result.errors.contains("--bind"))
        #expect(result.errors.contains("(pid \(getpid())"))
    }
}
