import AsyncHTTPClient
import CanopyBroker
import CanopyBus
import CanopyCare
import CanopyMessages
import CanopyTesting
import Foundation
import NIOCore
import Testing

@testable import CanopyAPI

/// A `canopy-api serve` process killed after the work of a keyed request was set going and
/// before it answered; the app sends the request again, with its key, to the edge started
/// again: the plant is added once, and the answer names it.
struct IdempotencyCrashTests {
    static let key = "dG9rZW4ta2V5LWZvci10ZXN0cy1vbmx5LXRva2VuLWtleS1mb3ItdGVzdHMtb25seQ=="

    /// A running `canopy-api serve` in front of `endpoint`, keeping its store in `data`.
    final class Edge {
        let process = Process()
        let errors: URL
        var http = ""

        init(endpoint: String, data: URL, directory: URL) async throws {
            errors = directory.appendingPathComponent("stderr-\(UUID().uuidString)")
            process.executableURL = try LiveBus.executable("canopy-api")
            process.arguments = [
                "serve", "--endpoint", endpoint, "--http", "127.0.0.1:0", "--metrics-bind", "off", "--log-level", "info",
                "--token-key-file", directory.appendingPathComponent("token.key").path, "--data-dir", data.path,
                "--idempotency-lease-ms", "1000", "--call-timeout-ms", "120000",
            ]
            process.standardOutput = FileHandle.nullDevice
            _ = FileManager.default.createFile(atPath: errors.path, contents: nil)
            process.standardError = try FileHandle(forWritingTo: errors)
            try process.run()
            var found: String?
            _ = try await eventually(within: .seconds(90), every: .milliseconds(50)) { [errors, process] in
                let text = (try? String(contentsOf: errors, encoding: .utf8)) ?? ""
                if let range = text.range(of: #"api\.address=127\.0\.0\.1:[1-9][0-9]*"#, options: .regularExpression) {
                    found = String(text[range].dropFirst("api.address=".count))
                }
                return found != nil || !process.isRunning
            }
            http = try #require(
                found, "canopy-api did not start listening; it wrote: \(((try? String(contentsOf: errors, encoding: .utf8)) ?? "").suffix(1_500))")
        }

        func kill() {
            if process.isRunning { Foundation.kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
        }
    }

    static func createPlant(_ http: String, token: String, key: String) async throws -> (status: Int, headers: [String: String], body: [String: Any]) {
        var request = HTTPClientRequest(url: "http://\(http)/v1/plants")
        request.method = .POST
        request.headers.add(name: "Authorization", value: "Bearer \(token)")
        request.headers.add(name: "Content-Type", value: "application/json")
        request.headers.add(name: "Idempotency-Key", value: key)
        request.body = .bytes(ByteBuffer(string: #"{"scientificName":"Monstera deliciosa","customName":"Monty"}"#))
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(30))
        let body = try await response.body.collect(upTo: 1 << 20)
        var headers: [String: String] = [:]
        for header in response.headers { headers[header.name.lowercased()] = header.value }
        return (Int(response.status.code), headers, (try? JSONSerialization.jsonObject(with: Data(body.readableBytesView))) as? [String: Any] ?? [:])
    }

    @Test func anEdgeKilledBetweenTheWorkAndItsAnswerStillAddsThePlantOnceWhenTheRequestIsRetried() async throws {
        let directory = try TemporaryDirectory("idempotency-crash")
        defer { directory.remove() }
        try Data(Self.key.utf8).write(to: directory.url.appendingPathComponent("token.key"))
        let data = directory.url.appendingPathComponent("data")
        // A start-up grace long enough that a request for canopy-care waits in the broker
        // until canopy-care starts (the work set going, not yet done).
        var configuration = BrokerConfiguration.testing
        configuration.liveness = 3_000
        try await withTestBus(.live, configuration: configuration) { bus in
            let live = try #require(bus.live)
            let tokens = try TokenAuthority(keys: [try TokenAuthority.key(file: directory.url.appendingPathComponent("token.key").path, value: nil)])
            let token = try await tokens.issue(user: "alice", lifetime: .seconds(3_600))
            let client = try bus.client()
            let key = UUID().uuidString

            // The first edge takes the request and sends plants.add to the broker; it is killed
            // there, before canopy-care has done the work.
            let first = try await Edge(endpoint: live.endpoint, data: data, directory: directory.url)
            defer { first.kill() }
            let lost = Task { [http = first.http] in (try? await Self.createPlant(http, token: token, key: key))?.status }
            #expect(
                try await eventually(within: .seconds(30)) { (try? await client.call(Broker.Stats.self, Empty()).heldBytes) ?? 0 > 0 },
                "the request reached the broker")
            first.kill()
            #expect(await lost.value == nil, "its answer is lost")

            // canopy-care comes up and does the work; its answer goes nowhere.
            try await bus.start(CareServiceSettings(directory: directory.url.appendingPathComponent("care"), runner: bus.runnerConfiguration()))
            #expect(
                try await eventually(within: .seconds(30)) {
                    (try? await client.call(Care.ListPlants.self, .init(), principal: "alice").total) == 1
                }, "the work was done")
            let added = try #require(try await client.call(Care.ListPlants.self, .init(), principal: "alice").plants.first)

            // The app sends it again, with its key, to the edge started again: the plant the
            // work added, once (a 409 while the dead edge's hold lasts, then the answer).
            let second = try await Edge(endpoint: live.endpoint, data: data, directory: directory.url)
            defer { second.kill() }
            var answer = try await Self.createPlant(second.http, token: token, key: key)
            var conflicts = 0
            while answer.status == 409, conflicts < 20 {
                conflicts += 1
                #expect(Int(answer.headers["retry-after"] ?? "") ?? 0 >= 1)
                try await Task.sleep(for: .seconds(Int(answer.headers["retry-after"] ?? "1") ?? 1))
                answer = try await Self.createPlant(second.http, token: token, key: key)
            }
            #expect(answer.status == 201, "\(answer.body)")
            #expect(
                answer.body["id"] as? String == added.id
                    && added.id
                        == IdempotencyKeys.plantID(
                            serviceKey: IdempotencyKeys.serviceKey(person: "alice", route: "POST /v1/plants", key: key))
            )
            #expect(try await client.call(Care.ListPlants.self, .init(), principal: "alice").total == 1, "added once")
            let again = try await Self.createPlant(second.http, token: token, key: key)
            #expect(again.status == 201 && again.headers["idempotent-replayed"] == "true" && again.body["id"] as? String == added.id)
        }
    }
}
