import AsyncHTTPClient
import CanopyCapture
import CanopyImaging
import CanopyReplay
import CanopySamples
import CanopyServiceKit
import CanopyTesting
import Foundation
import GRDB
import Glibc
import NIOCore
import NIOHTTP1
import Testing

/// The whole journey with every service as a real process (`canopy up`), over HTTP as apps
/// make it: a photo identified and accepted, the plant's schedule, a reminder delivered to a
/// webhook at its time, a task completed and the next one, thumbnails and palette; then the
/// plant deleted while canopy-images is stopped, and every store checked clean once it is
/// back. A second person sees nothing of the first's at any step. The journey's captured
/// traffic is then replayed against a fresh stack.
@Suite(.serialized)
struct JourneyTests {
    /// A stack of real processes in a data directory of its own, on free ports.
    struct Stack {
        let data: String
        let endpoint: String
        let http: String
        /// Where the stores are when not SQLite in `data`: `--database-url` and its password file.
        var database: [String] = []
        /// The broker's /metrics port; the services' follow (images, care, identify, remind, batch).
        var metricsBase = 0

        /// - Parameter database: `--database-url URL --database-password-file FILE` for stores
        ///   in PostgreSQL; `more`: further `canopy up` options (`--replicas`).
        static func start(environment: [String: String] = [:], database: [String] = [], _ more: [String] = []) async throws -> Stack {
            let data = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-e2e-\(UUID().uuidString)").path
            let stack = Stack(
                data: data, endpoint: "tcp://127.0.0.1:\(FreePorts.any())", http: "127.0.0.1:\(FreePorts.any())", database: database,
                metricsBase: FreePorts.run(of: 16))
            // The first six processes on their ports; replicas on the ones after.
            let up = try await runExecutable(
                "canopy",
                [
                    "up", "--detach", "--data-dir", data, "--broker", stack.endpoint, "--http", stack.http,
                    "--metrics-base", "\(stack.metricsBase)",
                ] + database + more, environment: environment, limit: 240)
            #expect(up.status == 0, "canopy up: \(up.output) \(up.errors)")
            try stack.loadReferences()
            return stack
        }

        /// The same stack started again from its data directory (after ``stop()``), on the
        /// same addresses.
        func restart(environment: [String: String] = [:]) async throws {
            let up = try await runExecutable(
                "canopy",
                [
                    "up", "--detach", "--data-dir", data, "--broker", endpoint, "--http", http,
                    "--metrics-base", "\(metricsBase)",
                ] + database, environment: environment, limit: 240)
            #expect(up.status == 0, "canopy up: \(up.output) \(up.errors)")
        }

        /// Every process's /metrics, parsed.
        func scrapes() async throws -> [PrometheusText] {
            var scrapes: [PrometheusText] = []
            for port in metricsBase..<(metricsBase + 6) {
                let response = try await HTTPClient.shared.execute(HTTPClientRequest(url: "http://127.0.0.1:\(port)/metrics"), timeout: .seconds(10))
                scrapes.append(try PrometheusText(String(buffer: try await response.body.collect(upTo: 8 << 20))))
            }
            return scrapes
        }

        func stop() async {
            _ = try? await runExecutable("canopy", ["down", "--data-dir", data], limit: 120)
        }

        func token(_ user: String) async throws -> String {
            let issued = try await runExecutable("canopy-api", ["token", "issue", "--user", user, "--days", "1", "--token-key-file", data + "/token.key"])
            return issued.output.trimmingCharacters(in: .whitespacesAndNewlines)
        }

        func pid(_ service: String) throws -> Int32 {
            let state = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: data + "/stack.json"))) as? [String: Any]
            let services = state?["services"] as? [[String: Any]] ?? []
            return try #require(services.first { $0["name"] as? String == service }?["pid"] as? Int32)
        }

        /// Species of canopy-care's catalog (so an accepted plant has a care profile), with
        /// made-up photos, for canopy-identify's reference matcher (it reloads them).
        static let species = ["Monstera deliciosa", "Ficus lyrata", "Epipremnum aureum"]

        func loadReferences() throws {
            let directory = URL(fileURLWithPath: data).appendingPathComponent("references")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            for index in 0..<3 {
                let files = try (1...3).map { seed in
                    let file = directory.appendingPathComponent("\(index)-\(seed).jpg")
                    try Data(try SyntheticPlant.species(index).photo(seed: seed)).write(to: file)
                    return file.path
                }
                let process = Process()
                process.executableURL = try LiveBus.executable("canopy-identify")
                process.arguments = ["reference", "add", "--data-dir", data, "--species", Self.species[index]] + database + files
                try process.run()
                process.waitUntilExit()
                #expect(process.terminationStatus == 0)
            }
        }

        func send(
            _ method: HTTPMethod, _ path: String, token: String, json: String? = nil, body: [UInt8]? = nil, type: String? = nil,
            headers more: [(String, String)] = []
        ) async throws -> Answer {
            var request = HTTPClientRequest(url: "http://\(http)\(path)")
            request.method = method
            request.headers.add(name: "Authorization", value: "Bearer \(token)")
            request.headers.add(contentsOf: more)
            if let json {
                request.headers.add(name: "Content-Type", value: "application/json")
                request.body = .bytes(ByteBuffer(string: json))
            } else if let body {
                request.headers.add(name: "Content-Type", value: type ?? "application/octet-stream")
                request.body = .bytes(ByteBuffer(bytes: body))
            }
            let response = try await HTTPClient.shared.execute(request, timeout: .seconds(60))
            let collected = try await response.body.collect(upTo: 32 << 20)
            var headers: [String: String] = [:]
            for header in response.headers { headers[header.name.lowercased()] = header.value }
            return Answer(status: Int(response.status.code), headers: headers, body: Array(collected.readableBytesView))
        }
    }

    struct Answer {
        var status: Int
        var headers: [String: String]
        var body: [UInt8]
        var object: [String: Any] { (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any] ?? [:] }
        var text: String { String(decoding: body.prefix(400), as: UTF8.self) }
    }

    /// Every row of every table of the SQLite stores under `data` that mentions `needle`, as
    /// "store.table" names.
    static func mentions(of needle: String, in data: String) throws -> [String] {
        var found: [String] = []
        for store in ["care/care.sqlite", "images/images.sqlite", "identify/identify.sqlite", "remind/remind.sqlite"] {
            var configuration = Configuration()
            configuration.readonly = true
            let queue = try DatabaseQueue(path: "\(data)/\(store)", configuration: configuration)
            try queue.read { db in
                for table in try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'") {
                    let columns = try Row.fetchAll(db, sql: "PRAGMA table_info(\"\(table)\")").map { $0["name"] as String }
                    let condition = columns.map { "CAST(\"\($0)\" AS TEXT) LIKE ?" }.joined(separator: " OR ")
                    let count =
                        try Int.fetchOne(
                            db, sql: "SELECT COUNT(*) FROM \"\(table)\" WHERE \(condition)",
                            arguments: StatementArguments(Array(repeating: "%\(needle)%", count: columns.count))) ?? 0
                    if count > 0 { found.append("\(store).\(table)") }
                }
            }
        }
        return found
    }

    @Test func theWholeJourneyOverHTTPWithEveryServiceAsAProcess() async throws {
        let webhook = RecordingServer()
        let server = Task { try await webhook.application.run() }
        defer { server.cancel() }
        let hook = try await webhook.url("/hooks/canopy")
        // Webhooks to this machine are refused unless the operator allows the host.
        let stack = try await Stack.start(environment: ["CANOPY_ALLOW_HOSTS": "127.0.0.1"])
        defer { try? FileManager.default.removeItem(atPath: stack.data) }
        let capture = stack.data + "/journey"
        do {
            let alice = try await stack.token("alice"), bob = try await stack.token("bob")
            let started = try await runExecutable("canopy", ["capture", "start", "journey", "--broker", stack.endpoint, "--data-dir", stack.data])
            #expect(started.status == 0, "\(started.errors)")

            // A photo identified and accepted: canopy-api, canopy-identify, canopy-images, canopy-care.
            let form = MultipartForm.encode(
                [
                    .init(name: "photo", type: "image/jpeg", bytes: try SyntheticPlant.species(1).photo(seed: 42)),
                    .init(name: "organ", bytes: Array("leaf".utf8)),
                ], boundary: "e2e")
            let identified = try await stack.send(.POST, "/v1/identifications", token: alice, body: form, type: "multipart/form-data; boundary=e2e")
            #expect(identified.status == 200, "\(identified.text)")
            let identification = try #require(identified.object["id"] as? String)
            #expect((identified.object["results"] as? [[String: Any]])?.first?["scientificName"] as? String == Stack.species[1])
            let accepted = try await stack.send(.POST, "/v1/identifications/\(identification)/accept", token: alice, json: #"{"rank":1,"customName":"Uno"}"#)
            #expect(accepted.status == 200, "\(accepted.text)")
            let plant = try #require((accepted.object["plant"] as? [String: Any])?["id"] as? String)
            #expect(try await stack.send(.GET, "/v1/identifications/\(identification)", token: bob).status == 404)
            #expect(try await stack.send(.GET, "/v1/plants/\(plant)", token: bob).status == 404)

            // Its schedule; a webhook device; a task due in seconds, delivered at its time.
            let upcoming = try await stack.send(.GET, "/v1/tasks/upcoming?days=60", token: alice)
            let tasks = (upcoming.object["tasks"] as? [[String: Any]] ?? []).filter { $0["plantID"] as? String == plant }
            let task = try #require(tasks.first?["id"] as? String, "\(upcoming.text)")
            #expect((try await stack.send(.GET, "/v1/tasks/upcoming?days=60", token: bob).object["tasks"] as? [Any])?.isEmpty == true)
            let device = try await stack.send(
                .POST, "/v1/devices", token: alice,
                json: #"{"channel":"webhook","address":"\#(hook)","secret":"whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}"#)
            #expect(device.status == 201, "\(device.text)")
            let due = Date(timeIntervalSinceNow: 4)
            let snoozed = try await stack.send(
                .POST, "/v1/tasks/\(task)/snooze", token: alice,
                json: #"{"until":"\#(due.formatted(Date.ISO8601FormatStyle(includingFractionalSeconds: true)))"}"#)
            #expect(snoozed.status == 200, "\(snoozed.text)")
            _ = try await eventually(within: .seconds(60), every: .milliseconds(100)) { !webhook.received.isEmpty }
            let delivered = try #require(webhook.received.first, "no webhook arrived within a minute of the reminder's time")
            #expect(Date() >= due.addingTimeInterval(-1), "delivered at its time, not before")
            #expect(delivered.path == "/hooks/canopy" && String(decoding: delivered.body, as: UTF8.self).contains("Uno"))
            #expect(delivered.headers["webhook-signature"]?.hasPrefix("v1,") == true)

            // Done, and the next one; the photo's thumbnail and palette, for alice only.
            #expect(try await stack.send(.POST, "/v1/tasks/\(task)/complete", token: alice, json: "{}").status == 200)
            let next = try await stack.send(.GET, "/v1/plants/\(plant)/next-task", token: alice)
            #expect(next.status == 200 && (next.object["task"] as? [String: Any])?["id"] != nil, "\(next.text)")
            let photos = try await stack.send(.GET, "/v1/plants/\(plant)/photos", token: alice)
            let photo = try #require((photos.object["photos"] as? [[String: Any]])?.first?["photoID"] as? String, "\(photos.text)")
            let thumbnail = try await stack.send(.GET, "/v1/photos/\(photo)/variants/thumbnail", token: alice)
            #expect(thumbnail.status == 200 && thumbnail.headers["content-type"] == "image/jpeg" && thumbnail.body.prefix(2) == [0xFF, 0xD8])
            #expect((try await stack.send(.GET, "/v1/photos/\(photo)/palette", token: alice).object["swatches"] as? [Any])?.isEmpty == false)
            #expect(try await stack.send(.GET, "/v1/photos/\(photo)/variants/thumbnail", token: bob).status == 404)

            // The provisioned dashboards ask only for series and labels this stack exports, now
            // that every service has served (a reminder delivered, photos cached, the edge answered).
            let queries = try GrafanaDashboards.queries(
                in: URL(fileURLWithPath: #filePath).deletingLastPathComponent()
                    .appendingPathComponent("../../deploy/grafana/dashboards").standardized, datasourceUID: "prometheus")
            #expect(queries.count > 20)
            let problems = GrafanaDashboards.problems(queries, scrapes: try await stack.scrapes())
            #expect(problems.isEmpty, "\(problems.joined(separator: "\n"))")
            let stopped = try await runExecutable("canopy", ["capture", "stop", "--broker", stack.endpoint, "--data-dir", stack.data])
            #expect(stopped.status == 0, "\(stopped.errors)")

            // The plant deleted while canopy-images is stopped: once it is back, no store holds any of it.
            let images = try stack.pid("images")
            kill(images, SIGSTOP)
            let deleted = try await stack.send(.DELETE, "/v1/plants/\(plant)", token: alice)
            #expect(deleted.status == 204, "\(deleted.text)")
            #expect(
                try await eventually(within: .seconds(30), every: .milliseconds(250)) { // the broker gives up on the stopped worker
                    let services = try await runExecutable("canopy", ["services", "--broker", stack.endpoint, "--data-dir", stack.data])
                    return services.status == 0 && !services.output.contains("images")
                }, "the stopped canopy-images was dropped by the broker")
            kill(images, SIGCONT)
            var left: [String] = []
            #expect(
                try await eventually(within: .seconds(90), every: .milliseconds(500)) {
                    left = try Self.mentions(of: plant, in: stack.data) + Self.mentions(of: photo, in: stack.data)
                    return left.isEmpty
                }, "still held: \(left)")
            #expect(try await stack.send(.GET, "/v1/plants/\(plant)", token: alice).status == 404)
        } catch {
            await stack.stop()
            throw error
        }
        await stack.stop()

        // The journey's traffic, replayed against a fresh stack: every answer the same. Times
        // come from running clocks here (the reminder had to fire), so time fields are left out.
        let fresh = try await Stack.start(environment: ["CANOPY_ALLOW_HOSTS": "127.0.0.1"])
        defer { try? FileManager.default.removeItem(atPath: fresh.data) }
        do {
            var options = ReplayOptions()
            options.pacing = .recorded(speed: 1)
            options.ignore = [
                "createdAt", "addedAt", "due", "snoozedUntil", "dateAdded", "dateIdentified", "updatedAt", "registeredAt", "lastWatered",
                "lastFertilized", "completedAt", "acceptedAt", "at",
            ]
            let report = try await Replayer(connection: .init(endpoint: fresh.endpoint, curve: try stackOperatorCurve(data: fresh.data)), options: options)
                .run(try CaptureReader(path: capture))
            #expect(report.isClean, "\(report.examples)")
            #expect(report.requests > 10 && report.derived > 0 && report.rebound > 0)
        } catch {
            await fresh.stop()
            throw error
        }
        await fresh.stop()
    }
}
