import AsyncHTTPClient
import CanopyBus
import CanopyCare
import CanopyMessages
import CanopyServiceKit
import CanopyTesting
import Foundation
import NIOCore
import NIOHTTP1
import ServiceLifecycle
import Testing

@testable import CanopyAPI

/// canopy-api as `serve` builds it, over real HTTP (AsyncHTTPClient), in front of the real
/// broker and canopy-care: every route, who may call, and what bad requests get.
extension LiveAPITests {
    @Suite(.serialized)
    struct APITests {
        static let key = Array("a signing key for the tests, long enough to be taken".utf8)

        /// One HTTP answer: status, headers, and the body as JSON when it is.
        struct Answer {
            var status: Int
            var headers: [String: String]
            var body: [UInt8]
            var json: Any? { try? JSONSerialization.jsonObject(with: Data(body)) }
            var object: [String: Any] { json as? [String: Any] ?? [:] }
        }

        struct Stack {
            let base: String
            let tokens: TokenAuthority
            let bus: TestBus
            let metricsPort: Int

            func token(_ user: String) async throws -> String { try await tokens.issue(user: user, lifetime: .seconds(3_600)) }

            func send(
                _ method: HTTPMethod, _ path: String, as user: String? = "alice", token: String? = nil, json: String? = nil,
                bytes: [UInt8]? = nil, type: String? = nil, headers: [(String, String)] = [], client: HTTPClient = .shared
            ) async throws -> Answer {
                var request = HTTPClientRequest(url: base + path)
                request.method = method
                if let token {
                    request.headers.add(name: "Authorization", value: "Bearer \(token)")
                } else if let user {
                    request.headers.add(name: "Authorization", value: "Bearer \(try await self.token(user))")
                }
                if let json {
                    request.headers.add(name: "Content-Type", value: "application/json")
                    request.body = .bytes(ByteBuffer(string: json))
                } else if let bytes {
                    request.headers.add(name: "Content-Type", value: type ?? "application/octet-stream")
                    request.body = .bytes(ByteBuffer(bytes: bytes))
                }
                for (name, value) in headers { request.headers.add(name: name, value: value) }
                let response = try await client.execute(request, timeout: .seconds(30))
                let body = try await response.body.collect(upTo: 8 * 1_048_576)
                var fields: [String: String] = [:]
                for header in response.headers { fields[header.name.lowercased()] = header.value }
                return Answer(status: Int(response.status.code), headers: fields, body: Array(body.readableBytesView))
            }
        }

        /// canopy-api over real HTTP in front of canopy-care: on the in-process bus, or
        /// (`.live`) as `serve` builds it, through the real broker.
        func withStack(
            _ mode: BusMode = .inProcess, rate: Double = 50, burst: Double = 200, work: (rate: Double, burst: Double)? = nil,
            idleTimeout: Duration = APIServiceSettings.defaultIdleTimeout,
            readTimeout: Duration = APIServiceSettings.defaultReadTimeout, _ body: (Stack) async throws -> Void
        ) async throws {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-api-\(UUID().uuidString)")
            defer { try? FileManager.default.removeItem(at: directory) }
            try await withTestBus(mode) { bus in
                let care = CareServiceSettings(directory: directory.appendingPathComponent("care"), runner: bus.runnerConfiguration())
                try await bus.start(care)
                try await body(
                    try await Self.startAPI(on: bus) { settings in
                        settings.maximumBodyBytes = 64 * 1_024
                        settings.rateLimit = rate
                        settings.rateBurst = burst
                        if let work { (settings.workRate, settings.workBurst) = work }
                        settings.idleTimeout = idleTimeout
                        settings.readTimeout = readTimeout
                    })
            }
        }

        /// canopy-api on `bus`, as `serve` builds it (live) or its parts (in process), with
        /// its HTTP API and `/metrics` on ephemeral loopback ports: the stack tests call.
        static func startAPI(on bus: TestBus, configure: (inout APIServiceSettings) -> Void = { _ in }) async throws -> Stack {
            var settings = APIServiceSettings(
                http: .anyLoopbackPort, bus: .init(endpoint: bus.live?.endpoint ?? ""), tokenKey: Self.key,
                metrics: .anyLoopbackPort)
            configure(&settings)
            let services =
                if let live = bus.live {
                    try buildAPIService(settings: settings, context: live.context, logger: live.logger)
                } else {
                    try makeAPIService(settings: settings, bus: try bus.client(timeout: settings.callTimeout), logger: bus.logger)
                }
            let http = try #require(services.first { $0 is APIHTTPServer } as? APIHTTPServer)
            let metrics = services.first { $0 is OperatingEndpoint } as? OperatingEndpoint
            bus.run(services)
            return Stack(
                base: "http://127.0.0.1:\(try await http.boundPort(within: .seconds(60)))", tokens: try TokenAuthority(key: Self.key), bus: bus,
                metricsPort: try await metrics?.boundPort(within: .seconds(60)) ?? 0)
        }

        static let monstera = #"{"scientificName":"Monstera deliciosa","customName":"Monty","location":"Living room"}"#

        // MARK: - Every route

        @Test(arguments: BusMode.allCases) func plantsTasksStatisticsAndPreferencesWorkOverHTTP(_ mode: BusMode) async throws {
            try await withStack(mode) { stack in
                let created = try await stack.send(.POST, "/v1/plants", json: Self.monstera)
                #expect(created.status == 201, "\(String(decoding: created.body, as: UTF8.self))")
                let id = try #require(created.object["id"] as? String)
                #expect(created.object["family"] as? String == "Araceae", "filled in from the catalog")
                #expect((created.object["profile"] as? [String: Any])?["light"] as? String == "brightIndirect")
                #expect(created.headers["x-request-id"]?.isEmpty == false)
                _ = try await stack.send(.POST, "/v1/plants", json: #"{"scientificName":"Epipremnum aureum","customName":"Pothos"}"#)

                let got = try await stack.send(.GET, "/v1/plants/\(id)")
                #expect(got.status == 200 && got.object["customName"] as? String == "Monty")
                let page = try await stack.send(.GET, "/v1/plants?search=monst&limit=1")
                #expect(page.status == 200 && page.object["total"] as? Int == 1)
                let all = try await stack.send(.GET, "/v1/plants?limit=1&sort=name&descending=false")
                #expect(all.object["total"] as? Int == 2 && all.object["nextOffset"] as? Int == 1)
                #expect(((all.object["plants"] as? [[String: Any]])?.first?["customName"]) as? String == "Monty")

                let favourite = try await stack.send(.PUT, "/v1/plants/\(id)/favourite", json: #"{"favourite":true}"#)
                #expect(favourite.status == 200 && favourite.object["favourite"] as? Bool == true)
                #expect(try await stack.send(.GET, "/v1/plants?favourite=true").object["total"] as? Int == 1)
                let updated = try await stack.send(
                    .PUT, "/v1/plants/\(id)", json: #"{"scientificName":"Monstera deliciosa","customName":"Big Monty","favourite":true}"#)
                #expect(updated.status == 200 && updated.object["customName"] as? String == "Big Monty")

                let statistics = try await stack.send(.GET, "/v1/statistics")
                #expect(statistics.status == 200 && statistics.object["total"] as? Int == 2 && statistics.object["favourites"] as? Int == 1)
                let preferences = try await stack.send(.PUT, "/v1/preferences", json: #"{"timeZone":"Europe/Berlin","preferredMinute":480}"#)
                #expect(preferences.status == 200 && preferences.object["timeZone"] as? String == "Europe/Berlin")

                let upcoming = try await stack.send(.GET, "/v1/tasks/upcoming?days=30")
                let tasks = try #require(upcoming.object["tasks"] as? [[String: Any]])
                #expect(upcoming.status == 200 && !tasks.isEmpty)
                let task = try #require(tasks.first { $0["plantID"] as? String == id && $0["kind"] as? String == "water" })
                let taskID = try #require(task["id"] as? String)
                let snoozed = try await stack.send(.POST, "/v1/tasks/\(taskID)/snooze", json: #"{"until":"2031-01-01T09:00:00.000Z"}"#)
                #expect(snoozed.status == 200 && snoozed.object["snoozedUntil"] as? String == "2031-01-01T09:00:00.000Z")
                let completed = try await stack.send(.POST, "/v1/tasks/\(taskID)/complete", json: "{}")
                #expect(completed.status == 200 && completed.object["snoozedUntil"] == nil)
                let skipped = try await stack.send(.POST, "/v1/tasks/\(taskID)/skip")
                #expect(skipped.status == 200 && (skipped.object["due"] as? String ?? "") > (completed.object["due"] as? String ?? "~"))
                #expect(try await stack.send(.GET, "/v1/tasks/overdue").status == 200)

                #expect(try await stack.send(.DELETE, "/v1/plants/\(id)").status == 204)
                let gone = try await stack.send(.GET, "/v1/plants/\(id)")
                #expect(gone.status == 404 && gone.headers["content-type"] == "application/problem+json")
            }
        }

        /// Two phones editing one plant: each read answers the plant's version as its ETag; a
        /// write made against a version that has changed since answers 412 and keeps the other
        /// phone's change.
        @Test(arguments: BusMode.allCases) func aStaleIfMatchIs412AndLosesNoEdit(_ mode: BusMode) async throws {
            try await withStack(mode) { stack in
                let created = try await stack.send(.POST, "/v1/plants", json: Self.monstera)
                let id = try #require(created.object["id"] as? String)
                let read = try await stack.send(.GET, "/v1/plants/\(id)")
                #expect(read.headers["etag"] == #""1""# && read.object["version"] as? Int == 1, "\(read.headers) \(read.object)")
                // The first phone's edit, made against version 1, goes in: version 2.
                let first = try await stack.send(
                    .PUT, "/v1/plants/\(id)", json: #"{"scientificName":"Monstera deliciosa","customName":"Kitchen"}"#,
                    headers: [("If-Match", #""1""#)])
                #expect(first.status == 200 && first.headers["etag"] == #""2""#, "\(first.object)")
                // The second phone read version 1 too: refused, the first edit stands.
                let second = try await stack.send(
                    .PUT, "/v1/plants/\(id)", json: #"{"scientificName":"Monstera deliciosa","customName":"Hall"}"#,
                    headers: [("If-Match", #""1""#)])
                #expect(second.status == 412 && second.headers["content-type"] == "application/problem+json")
                #expect((second.object["detail"] as? String)?.contains("read it again") == true, "\(second.object)")
                let now = try await stack.send(.GET, "/v1/plants/\(id)")
                #expect(now.object["customName"] as? String == "Kitchen" && now.headers["etag"] == #""2""#)
                // A weak tag or a tag that is no version matches nothing; * and no If-Match match any.
                for tag in [#"W/"2""#, "2", #""two""#] {
                    let refused = try await stack.send(.PUT, "/v1/plants/\(id)", json: Self.monstera, headers: [("If-Match", tag)])
                    #expect(refused.status == 412, "If-Match \(tag)")
                }
                #expect(try await stack.send(.PUT, "/v1/plants/\(id)", json: Self.monstera, headers: [("If-Match", "*")]).headers["etag"] == #""3""#)
                #expect(try await stack.send(.PUT, "/v1/plants/\(id)", json: Self.monstera).headers["etag"] == #""4""#)
                // Setting the favourite reads and writes against the version read.
                #expect(try await stack.send(.PUT, "/v1/plants/\(id)/favourite", json: #"{"favourite":true}"#).object["version"] as? Int == 5)
                #expect(try await stack.send(.PUT, "/v1/plants/\(id)", json: Self.monstera, headers: [("If-Match", #""999""#)]).status == 412)
                let missing = try await stack.send(.PUT, "/v1/plants/nope", json: Self.monstera, headers: [("If-Match", #""1""#)])
                #expect(missing.status == 404)
            }
        }

        // MARK: - Who is calling

        @Test func aMissingForgedOrExpiredTokenIs401WithWWWAuthenticate() async throws {
            try await withStack { stack in
                let missing = try await stack.send(.GET, "/v1/plants", as: nil)
                #expect(missing.status == 401 && missing.headers["www-authenticate"]?.hasPrefix("Bearer") == true)
                #expect(missing.object["requestID"] as? String == missing.headers["x-request-id"])
                let forger = try TokenAuthority(key: Array("another key that is long enough to sign with".utf8))
                let forged = try await stack.send(.GET, "/v1/plants", token: try await forger.issue(user: "alice", lifetime: .seconds(3_600)))
                #expect(forged.status == 401 && forged.headers["www-authenticate"]?.contains("invalid_token") == true)
                let expired = try await stack.tokens.issue(user: "alice", lifetime: .seconds(60), now: Date().addingTimeInterval(-3_600))
                #expect(try await stack.send(.GET, "/v1/plants", token: expired).status == 401)
                #expect(try await stack.send(.GET, "/v1/plants", token: "not.a.token").status == 401)
                #expect(try await stack.send(.GET, "/v1/plants", token: String(repeating: "a", count: 10_000)).status == 401)
                #expect(try await stack.send(.GET, "/v1/plants").status == 200)
            }
        }

        @Test func nobodyReachesAnotherPersonsPlantsOrTasks() async throws {
            try await withStack { stack in
                let created = try await stack.send(.POST, "/v1/plants", as: "alice", json: Self.monstera)
                let id = try #require(created.object["id"] as? String)
                let tasks = try #require(try await stack.send(.GET, "/v1/tasks/upcoming?days=60", as: "alice").object["tasks"] as? [[String: Any]])
                let taskID = try #require(tasks.first?["id"] as? String)

                for (method, path, json) in [
                    (HTTPMethod.GET, "/v1/plants/\(id)", nil), (.PUT, "/v1/plants/\(id)", Self.monstera),
                    (.PUT, "/v1/plants/\(id)/favourite", #"{"favourite":true}"#), (.DELETE, "/v1/plants/\(id)", nil),
                    (.POST, "/v1/tasks/\(taskID)/complete", "{}"), (.POST, "/v1/tasks/\(taskID)/skip", nil),
                    (.POST, "/v1/tasks/\(taskID)/snooze", #"{"until":"2031-01-01T09:00:00.000Z"}"#),
                ] as [(HTTPMethod, String, String?)] {
                    let answer = try await stack.send(method, path, as: "bob", json: json)
                    #expect(answer.status == 404 || (method == .DELETE && answer.status == 204), "\(method) \(path) as bob: \(answer.status)")
                }
                #expect(try await stack.send(.GET, "/v1/plants", as: "bob").object["total"] as? Int == 0)
                let bobsTasks = try await stack.send(.GET, "/v1/tasks/upcoming?days=60", as: "bob")
                #expect((bobsTasks.object["tasks"] as? [Any])?.isEmpty == true)
                // Alice's plant and task are as they were.
                let plant = try await stack.send(.GET, "/v1/plants/\(id)", as: "alice")
                #expect(plant.status == 200 && plant.object["favourite"] as? Bool == false)
                let after = try #require(try await stack.send(.GET, "/v1/tasks/upcoming?days=60", as: "alice").object["tasks"] as? [[String: Any]])
                #expect(after.first { $0["id"] as? String == taskID }?["due"] as? String == tasks.first?["due"] as? String)
            }
        }

        // MARK: - Bad requests

        @Test func badRequestsGet400NamingTheFieldAndOneProblemShape() async throws {
            try await withStack { stack in
                func problem(_ answer: Answer, _ status: Int, field: String? = nil, _ comment: Comment? = nil) {
                    #expect(answer.status == status, comment)
                    #expect(answer.headers["content-type"] == "application/problem+json", comment)
                    #expect(Set(answer.object.keys).isSuperset(of: ["type", "title", "status", "detail", "requestID"]), comment)
                    #expect(answer.object["requestID"] as? String == answer.headers["x-request-id"], comment)
                    if let field { #expect(answer.object["field"] as? String == field, "\(answer.object) \(comment?.description ?? "")") }
                }
                problem(try await stack.send(.POST, "/v1/plants", json: "{not json"), 400, "malformed JSON")
                problem(try await stack.send(.POST, "/v1/plants", json: #"{"scientificName":"Monstera","colour":"green"}"#), 400, "unknown field")
                problem(try await stack.send(.POST, "/v1/plants", json: #"{"scientificName":42}"#), 400, field: "scientificName", "wrong type")
                problem(try await stack.send(.POST, "/v1/plants", json: #"{"customName":"Monty"}"#), 400, field: "scientificName", "missing field")
                problem(try await stack.send(.POST, "/v1/plants", json: #"{"scientificName":"Monstera","identificationConfidence":7}"#), 400, "out of range")
                problem(try await stack.send(.GET, "/v1/plants?limit=1000"), 400, field: "limit", "limit")
                problem(try await stack.send(.GET, "/v1/plants?limit=99999999999999999999999"), 400, "huge number")
                problem(try await stack.send(.GET, "/v1/plants?light=dark"), 400, "unknown enum value")
                problem(try await stack.send(.PUT, "/v1/preferences", json: #"{"timeZone":"Mars/Olympus_Mons"}"#), 400, field: "timeZone", "time zone")
                // Checked once, by the service behind the route: its field error names the field here.
                problem(try await stack.send(.GET, "/v1/plants?offset=10001"), 400, field: "offset", "offset")
                problem(try await stack.send(.GET, "/v1/tasks/upcoming?days=367"), 400, field: "days", "days")
                problem(try await stack.send(.GET, "/v1/tasks/overdue?limit=0"), 400, field: "limit", "overdue limit")
                problem(
                    try await stack.send(.PUT, "/v1/preferences", json: #"{"timeZone":"UTC","quietStartMinute":1440,"quietEndMinute":60}"#), 400,
                    field: "quietStartMinute", "quiet hours")
                problem(try await stack.send(.PUT, "/v1/preferences", json: #"{"timeZone":"UTC","preferredMinute":1e300}"#), 400, "huge number in the body")
                problem(try await stack.send(.GET, "/v1/plants/..%2F..%2Fetc"), 400, "an id that cannot be one")
                let noRoute = try await stack.send(.GET, "/v1/nothing-here")
                problem(noRoute, 404, "unknown route")
                #expect(noRoute.object["title"] as? String == "Not Found" && noRoute.object["type"] as? String == "https://canopy.dev/problems/not-found")
                // A path the document has, with a method it does not take: 405 saying which it takes.
                let wrongMethod = try await stack.send(.DELETE, "/v1/plants")
                problem(wrongMethod, 405, "a method the path does not declare")
                #expect(wrongMethod.headers["allow"] == "GET, POST" && wrongMethod.object["title"] as? String == "Method Not Allowed", "\(wrongMethod.headers)")
                #expect(try await stack.send(.PATCH, "/v1/plants/p1").headers["allow"]?.contains("DELETE") == true)
                // A field over its limit is the request's mistake: 400 naming the field (413 is for bodies).
                problem(
                    try await stack.send(.POST, "/v1/plants", json: #"{"scientificName":"\#(String(repeating: "a", count: 201))"}"#), 400,
                    field: "scientificName", "a field over its length")
                // A key twice: refused, as the bus refuses it, whichever a decoder would keep.
                problem(try await stack.send(.POST, "/v1/plants", json: #"{"scientificName":"Monstera","scientificName":"Ficus"}"#), 400, "a key twice")
                problem(
                    try await stack.send(.POST, "/v1/plants", json: #"{"scientificName":"Monstera","scientific\u004eame":"Ficus"}"#), 400,
                    "a key twice, escaped")
                problem(
                    try await stack.send(.POST, "/v1/plants", json: #"{"scientificName":""#.padding(toLength: 70_000, withPad: "a", startingAt: 0) + #""}"#),
                    413, "a body over the limit")
                // In chunks, without a length: still refused at the limit.
                var chunked = HTTPClientRequest(url: stack.base + "/v1/plants")
                chunked.method = .POST
                chunked.headers.add(name: "Authorization", value: "Bearer \(try await stack.token("alice"))")
                chunked.headers.add(name: "Content-Type", value: "application/json")
                let pieces =
                    [ByteBuffer(string: #"{"scientificName":""#)] + Array(repeating: ByteBuffer(string: String(repeating: "a", count: 8_192)), count: 10)
                    + [ByteBuffer(string: #""}"#)]
                chunked.body = .stream(pieces.async, length: .unknown)
                let refused = try await HTTPClient.shared.execute(chunked, timeout: .seconds(30))
                #expect(refused.status.code == 413)
                #expect(try await stack.send(.GET, "/v1/plants").object["total"] as? Int == 0, "nothing was stored")
            }
        }

        @Test func idleAndStalledConnectionsAreClosedAndAnOversizedBodyIsRefusedBeforeItIsSent() async throws {
            // Short timeouts, yet long enough that a loaded machine answers within them.
            try await withStack(idleTimeout: .seconds(2), readTimeout: .seconds(2)) { stack in
                let port = Int(stack.base.split(separator: ":").last!)!
                // Connected, and never a byte: closed.
                let idle = try RawConnection(port: port)
                #expect(idle.closedByServer(within: .seconds(30)), "an idle connection is closed")
                // A request whose body stalls half way: closed.
                let stalled = try RawConnection(port: port)
                stalled.send(
                    "POST /v1/plants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(try await stack.token("alice"))\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"scien"
                )
                #expect(stalled.closedByServer(within: .seconds(30)), "a stalled body is closed")
                // A keep-alive connection that answered a request, then idles: closed too.
                let used = try RawConnection(port: port)
                used.send("GET /v1/plants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(try await stack.token("alice"))\r\n\r\n")
                #expect(used.closedByServer(within: .seconds(30)) && used.received.hasPrefix("HTTP/1.1 200"), "\(used.received.prefix(80))")
                // A body announced over the limit: 413 at once, before any of it is sent; a client
                // that then sends nothing is closed like any stalled one.
                let large = try RawConnection(port: port)
                large.send(
                    "POST /v1/plants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(try await stack.token("alice"))\r\nContent-Type: application/json\r\nContent-Length: 20000000\r\n\r\n"
                )
                #expect(large.closedByServer(within: .seconds(30)) && large.received.hasPrefix("HTTP/1.1 413"), "\(large.received.prefix(80))")
            }
        }

        @Test func healthSaysWhetherTheBrokerAnswersAndWhichServicesHaveWorkers() async throws {
            try await withStack(.live) { stack in
                #expect(try await OperatingProbe.waitForHealth(stack.metricsPort, status: 200))
                let response = try await HTTPClient.shared.execute(
                    HTTPClientRequest(url: "http://127.0.0.1:\(stack.metricsPort)/health"), timeout: .seconds(10))
                let report = try JSONDecoder().decode(HealthReport.self, from: Data(try await response.body.collect(upTo: 65_536).readableBytesView))
                #expect(report.healthy && report.checks["broker"] == "answers" && report.checks["service.care"] == "1 worker", "\(report)")
            }
        }

        @Test func eachPersonIsRateLimitedWith429AndRetryAfterAndCountedByRoute() async throws {
            try await withStack(rate: 1, burst: 3) { stack in
                // The registry is the process's, shared with other tests: differences count.
                func value(_ scrape: PrometheusText, _ name: String, _ labels: [String: String] = [:]) -> Double {
                    scrape.samples.filter { sample in sample.name == name && labels.allSatisfy { sample.labels[$0.key] == $0.value } }.map(\.value).reduce(0, +)
                }
                let before = try await OperatingProbe.metrics(stack.metricsPort)
                var statuses: [Int] = []
                for _ in 0..<4 { statuses.append(try await stack.send(.GET, "/v1/plants", as: "alice").status) }
                #expect(statuses == [200, 200, 200, 429])
                let limited = try await stack.send(.GET, "/v1/statistics", as: "alice")
                #expect(limited.status == 429 && Int(limited.headers["retry-after"] ?? "") ?? 0 >= 1)
                #expect(limited.object["requestID"] as? String == limited.headers["x-request-id"])
                #expect(try await stack.send(.GET, "/v1/plants", as: "bob").status == 200, "bob has his own bucket")
                #expect(try await stack.send(.GET, "/v1/nowhere", as: "bob").status == 404)

                let after = try await OperatingProbe.metrics(stack.metricsPort)
                func delta(_ name: String, _ labels: [String: String] = [:]) -> Double { value(after, name, labels) - value(before, name, labels) }
                #expect(delta("canopy_api_requests_total", ["route": "/v1/plants", "status": "200"]) == 4)
                #expect(delta("canopy_api_requests_total", ["route": "/v1/plants", "status": "429"]) == 1)
                #expect(delta("canopy_api_requests_total", ["route": "/v1/statistics", "status": "429"]) == 1)
                #expect(delta("canopy_api_requests_total", ["status": "404"]) == 1, "an unknown route is counted under one label")
                #expect(delta("canopy_api_rate_limited_total") == 2)
                // Every label is a template of the document (never a path with someone's ids in
                // it), or one of the two labels for the rest: other suites of this process count
                // requests refused before routing as `unknown`.
                let routes = Set(after.samples.filter { $0.name == "canopy_api_requests_total" }.compactMap { $0.labels["route"] })
                #expect(routes.contains("/v1/plants/{plantID}") || routes.contains("/v1/plants"))
                #expect(
                    routes.allSatisfy { route in
                        route == "NotFound" || route == "unknown"
                            || (route.hasPrefix("/v1/")
                                && route.split(separator: "/").dropFirst().allSatisfy { $0.allSatisfy { $0.isLetter || "{}:-".contains($0) } })
                    }, "routes are the document's templates: \(routes.sorted())")
            }
        }

        /// Photos cost a person's work budget by their size: past it, 429 with the wait the
        /// budget implies and the route named, while the same person's reads go on and another
        /// person's photos are taken.
        @Test func photoWorkPastAPersonsBudgetIs429WhileTheirReadsAndOthersGoOn() async throws {
            try await withStack(work: (rate: 1, burst: 30)) { stack in
                let before = try await OperatingProbe.metrics(stack.metricsPort)
                let photo = [UInt8](repeating: 0xFF, count: 100 * 1_024) // 1 + 12.5 units
                var statuses: [Int] = []
                for _ in 0..<3 { statuses.append(try await stack.send(.POST, "/v1/plants/plant-1/photos", bytes: photo, type: "image/jpeg").status) }
                #expect(statuses.prefix(2).allSatisfy { $0 != 429 } && statuses[2] == 429, "\(statuses)")
                let refused = try await stack.send(.POST, "/v1/plants/plant-1/photos", bytes: photo, type: "image/jpeg")
                let wait = Int(refused.headers["retry-after"] ?? "") ?? 0
                #expect(refused.status == 429 && (10...12).contains(wait), "13.5 units wanted, 3 left, 1 a second: \(refused.headers)")
                #expect((refused.object["detail"] as? String)?.contains("POST /v1/plants/{plantID}/photos costs 14 work units") == true, "\(refused.object)")
                #expect(try await stack.send(.GET, "/v1/plants").status == 200, "her reads are not work")
                #expect(
                    try await stack.send(.POST, "/v1/plants/plant-2/photos", as: "bob", bytes: photo, type: "image/jpeg").status != 429,
                    "bob has his own budget")
                let after = try await OperatingProbe.metrics(stack.metricsPort)
                #expect(after.growth(since: before, "canopy_api_over_budget_total") == 2)
            }
        }

        @Test func aBatchRunsEachOperationAsIfAloneAndAnswersInOrderMixedSuccessesAndFailures() async throws {
            try await withStack { stack in
                let id = try #require(try await stack.send(.POST, "/v1/plants", json: Self.monstera).object["id"] as? String)
                let batch = """
                    {"operations":[
                      {"method":"GET","path":"/v1/plants/\(id)"},
                      {"method":"POST","path":"/v1/plants","body":{"scientificName":"Epipremnum aureum","customName":"Pothos"}},
                      {"method":"GET","path":"/v1/plants/no-such-plant"},
                      {"method":"POST","path":"/v1/plants","body":{"scientificName":42}},
                      {"method":"GET","path":"/v1/plants?limit=1&sort=name&descending=false"},
                      {"method":"PUT","path":"/v1/plants/\(id)/favourite","body":{"favourite":true}},
                      {"method":"GET","path":"/v1/statistics"},
                      {"method":"GET","path":"/health"},
                      {"method":"POST","path":"/v1/batch","body":{"operations":[]}},
                      {"method":"DELETE","path":"/v1/nowhere"},
                      {"method":"GET","path":"/v1/photos/\(String(repeating: "0", count: 64))/variants/thumbnail"}
                    ]}
                    """
                func operationsBatched() async throws -> Double {
                    try await OperatingProbe.metrics(stack.metricsPort).samples.filter { $0.name == "canopy_api_batch_operations_sum" }.map(\.value).reduce(
                        0, +)
                }
                let batchedBefore = try await operationsBatched()
                let answer = try await stack.send(.POST, "/v1/batch", json: batch)
                #expect(answer.status == 200, "\(String(decoding: answer.body, as: UTF8.self))")
                #expect(try await operationsBatched() - batchedBefore == 11, "the batch's size is recorded")
                let results = try #require(answer.object["results"] as? [[String: Any]])
                #expect(
                    results.map { $0["status"] as? Int } == [200, 201, 404, 400, 200, 200, 200, 400, 400, 404, 503],
                    "\(results.map { $0["status"] ?? "-" })")
                #expect((results[0]["body"] as? [String: Any])?["customName"] as? String == "Monty")
                #expect((results[1]["body"] as? [String: Any])?["customName"] as? String == "Pothos")
                #expect((results[3]["body"] as? [String: Any])?["field"] as? String == "scientificName")
                #expect(((results[4]["body"] as? [String: Any])?["plants"] as? [[String: Any]])?.count == 1)
                #expect((results[5]["body"] as? [String: Any])?["favourite"] as? Bool == true)
                for index in [7, 8] { #expect((results[index]["body"] as? [String: Any])?["field"] as? String == "path") }
                #expect(results[9]["status"] as? Int == 404)
                // No canopy-images in this stack: its own answer, as alone (the photos test batches one).
                #expect(((results[10]["body"] as? [String: Any])?["detail"] as? String)?.isEmpty == false)
                // What the batch did, it did: the second plant exists, the first is a favourite.
                #expect(try await stack.send(.GET, "/v1/plants").object["total"] as? Int == 2)

                // Bob's batch reaches none of Alice's plants.
                let bobs = try await stack.send(
                    .POST, "/v1/batch", as: "bob",
                    json: """
                        {"operations":[{"method":"GET","path":"/v1/plants/\(id)"},{"method":"DELETE","path":"/v1/plants/\(id)"},{"method":"GET","path":"/v1/plants"}]}
                        """)
                let bobResults = try #require(bobs.object["results"] as? [[String: Any]])
                #expect(bobResults.first?["status"] as? Int == 404)
                #expect(((bobResults.last?["body"] as? [String: Any])?["total"]) as? Int == 0)
                #expect(try await stack.send(.GET, "/v1/plants/\(id)").status == 200)

                let tooMany = "{\"operations\":[" + Array(repeating: #"{"method":"GET","path":"/v1/statistics"}"#, count: 51).joined(separator: ",") + "]}"
                let refused = try await stack.send(.POST, "/v1/batch", json: tooMany)
                #expect(refused.status == 400 && refused.object["field"] as? String == "operations")
                #expect(try await stack.send(.POST, "/v1/batch", json: #"{"operations":[]}"#).status == 400)
            }
        }
    }
}
