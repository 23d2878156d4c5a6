import AsyncHTTPClient
import CanopyBroker
import CanopyBus
import CanopyCapture
import CanopyCare
import CanopyIdentify
import CanopyImages
import CanopyImaging
import CanopyMessages
import CanopyRemind
import CanopyReplay
import CanopySamples
import CanopyServiceKit
import CanopyTesting
import Foundation
import NIOCore
import Testing

@testable import CanopyAPI

extension LiveAPITests {
    /// The golden capture: a scripted journey through canopy-api that touches every service
    /// (identify a photo, accept it, add a plant with a photo, its variants and palette, its
    /// tasks, a device, a batch, another person trying the first one's data), recorded at the
    /// broker with every service on a fixed clock. `Tests/Fixtures/captures/journey.ccap` holds
    /// it; `scripts/record-golden-captures` records it again when the protocol changes on
    /// purpose. CI replays it against a fresh stack and expects zero differences.
    @Suite(.serialized)
    struct GoldenCaptureTests {
        /// The instant every service's clock is stopped at, when recording and when replaying.
        static let clock = ServiceClock.fixed(Date(timeIntervalSince1970: 1_780_300_800)) // 2026-06-01T08:00:00Z

        static var fixture: String {
            URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                .appendingPathComponent("Fixtures/captures/journey.ccap").path
        }

        /// Every service behind canopy-api, each on ``clock``, the broker capturing into
        /// `capture` when given.
        static func withGoldenStack(capture: String? = nil, _ body: (APITests.Stack) async throws -> Void) async throws {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-golden-\(UUID().uuidString)")
            defer { try? FileManager.default.removeItem(at: directory) }
            var configuration = BrokerConfiguration.testing
            configuration.capture = capture.map { CaptureSettings(path: $0) }
            try await withLiveBus(configuration: configuration) { bus in
                var images = ImageServiceSettings(directory: directory.appendingPathComponent("images"), runner: bus.runnerConfiguration())
                images.clock = clock
                bus.run(try await buildImageService(settings: images, context: bus.context, logger: bus.logger))
                var care = CareServiceSettings(directory: directory.appendingPathComponent("care"), runner: bus.runnerConfiguration())
                care.clock = clock
                care.outboxInterval = .milliseconds(100)
                bus.run(try await buildCareService(settings: care, context: bus.context, logger: bus.logger))
                var remind = ReminderServiceSettings(directory: directory.appendingPathComponent("remind"), runner: bus.runnerConfiguration())
                remind.clock = clock
                bus.run(try await buildReminderService(settings: remind, context: bus.context, logger: bus.logger))
                var identify = IdentificationServiceSettings(directory: directory.appendingPathComponent("identify"), runner: bus.runnerConfiguration())
                identify.clock = clock
                let tools = try IdentificationTools(databasePath: identify.databasePath)
                for (index, name) in APIIdentificationTests.species.enumerated() {
                    try tools.addReferences(
                        .init(scientificName: name, commonNames: ["Test plant \(index)"], family: "Testaceae"),
                        photos: try (1...3).map { try SyntheticPlant.species(index).photo(seed: $0) })
                }
                bus.run(try await buildIdentificationService(settings: identify, context: bus.context, logger: bus.logger))
                let api = try buildAPIService(
                    settings: APIServiceSettings(http: .anyLoopbackPort, bus: .init(endpoint: bus.endpoint), tokenKey: APITests.key),
                    context: bus.context, logger: bus.logger)
                let http = try #require(api.first { $0 is APIHTTPServer } as? APIHTTPServer)
                bus.run(api)
                for service in [Images.service, Care.service, Reminders.service, Identification.service] { try await bus.waitForWorkers(1, service: service) }
                try await body(
                    APITests.Stack(
                        base: "http://127.0.0.1:\(try await http.boundPort())", tokens: try TokenAuthority(key: APITests.key),
                        bus: TestBus(live: bus), metricsPort: 0))
            }
        }

        /// A body of bytes with its content type, as an app uploads a photo.
        static func upload(_ stack: APITests.Stack, _ path: String, bytes: [UInt8], type: String) async throws -> APITests.Answer {
            var request = HTTPClientRequest(url: stack.base + path)
            request.method = .POST
            request.headers.add(name: "Authorization", value: "Bearer \(try await stack.token("alice"))")
            request.headers.add(name: "Content-Type", value: type)
            request.body = .bytes(ByteBuffer(bytes: bytes))
            let response = try await HTTPClient.shared.execute(request, timeout: .seconds(60))
            let body = try await response.body.collect(upTo: 1_048_576)
            return APITests.Answer(status: Int(response.status.code), headers: [:], body: Array(body.readableBytesView))
        }

        /// The journey, one request at a time, each answer checked.
        static func journey(_ stack: APITests.Stack) async throws {
            func ok(_ answer: APITests.Answer, _ status: Int = 200, _ what: String) {
                #expect(answer.status == status, "\(what): \(String(decoding: answer.body.prefix(300), as: UTF8.self))")
            }
            // Identify a photo and accept the best match: canopy-identify, canopy-images, canopy-care.
            let form = APIIdentificationTests.form([("photo", "image/jpeg", try SyntheticPlant.species(1).photo(seed: 7)), ("organ", nil, Array("leaf".utf8))])
            let submitted = try await upload(stack, "/v1/identifications", bytes: form, type: "multipart/form-data; boundary=canopy-test-boundary")
            ok(submitted, 200, "identify")
            let identification = try #require(submitted.object["id"] as? String)
            let accepted = try await stack.send(.POST, "/v1/identifications/\(identification)/accept", json: #"{"rank":1,"customName":"Secundo"}"#)
            ok(accepted, 200, "accept")
            let identified = try #require((accepted.object["plant"] as? [String: Any])?["id"] as? String)
            ok(try await stack.send(.GET, "/v1/plants/\(identified)"), 200, "the accepted plant")
            ok(try await stack.send(.GET, "/v1/identifications?limit=5"), 200, "history")

            // A plant added by hand, a photo of it, its variants and palette.
            let created = try await stack.send(.POST, "/v1/plants", json: APITests.monstera)
            ok(created, 201, "add a plant")
            let plant = try #require(created.object["id"] as? String)
            let photo = try await upload(stack, "/v1/plants/\(plant)/photos", bytes: try SyntheticPlant.species(2).photo(seed: 3), type: "image/jpeg")
            ok(photo, 201, "upload a photo")
            let photoID = try #require(photo.object["photoID"] as? String)
            ok(try await stack.send(.GET, "/v1/plants/\(plant)/photos"), 200, "the plant's photos")
            ok(try await stack.send(.GET, "/v1/photos/\(photoID)/variants/thumbnail"), 200, "a thumbnail")
            ok(try await stack.send(.GET, "/v1/photos/\(photoID)/variants/small", headers: [("Accept", "image/webp")]), 200, "a small WebP")
            ok(try await stack.send(.GET, "/v1/photos/\(photoID)/palette"), 200, "the palette")

            // Its care: the schedule, a task done, the next one.
            let upcoming = try await stack.send(.GET, "/v1/tasks/upcoming?days=30")
            ok(upcoming, 200, "upcoming tasks")
            let task = try #require((upcoming.object["tasks"] as? [[String: Any]])?.first { $0["plantID"] as? String == plant }?["id"] as? String)
            ok(try await stack.send(.POST, "/v1/tasks/\(task)/complete", json: "{}"), 200, "complete a task")
            ok(try await stack.send(.GET, "/v1/plants/\(plant)/next-task"), 200, "the next task")
            ok(try await stack.send(.GET, "/v1/plants?limit=20&sort=name"), 200, "the collection")
            ok(try await stack.send(.GET, "/v1/statistics"), 200, "statistics")

            // A device for reminders, and a batch of lookups.
            let device = try await stack.send(.POST, "/v1/devices", json: #"{"channel":"log","address":"alice's desk","name":"desk"}"#)
            ok(device, 201, "register a device")
            let deviceID = try #require(device.object["id"] as? String)
            ok(try await stack.send(.GET, "/v1/devices"), 200, "devices")
            let batch = try await stack.send(
                .POST, "/v1/batch",
                json: """
                    {"operations":[{"method":"GET","path":"/v1/plants/\(plant)"},{"method":"GET","path":"/v1/statistics"},\
                    {"method":"GET","path":"/v1/plants/no-such-plant"}]}
                    """)
            ok(batch, 200, "a batch")

            // Bob reaches none of it.
            #expect(try await stack.send(.GET, "/v1/plants/\(plant)", as: "bob").status == 404)
            #expect(try await stack.send(.GET, "/v1/photos/\(photoID)/variants/thumbnail", as: "bob").status == 404)
            #expect(try await stack.send(.GET, "/v1/identifications/\(identification)", as: "bob").status == 404)
            ok(try await stack.send(.DELETE, "/v1/devices/\(deviceID)", as: "bob"), 204, "bob's delete of a device he does not have")
            ok(try await stack.send(.GET, "/v1/devices"), 200, "alice's devices, still there")
            ok(try await stack.send(.DELETE, "/v1/devices/\(deviceID)"), 204, "alice removes her device")
        }

        /// Replays a capture against a fresh golden stack, as fast as it answers.
        static func replay(_ path: String) async throws -> ReplayReport {
            var report = ReplayReport()
            try await withGoldenStack { stack in
                var options = ReplayOptions()
                options.pacing = .fast
                report = try await Replayer(connection: .init(endpoint: try #require(stack.bus.live).endpoint), options: options).run(
                    try CaptureReader(path: path))
            }
            return report
        }

        static func expectClean(_ report: ReplayReport) {
            #expect(report.isClean, "\(report.examples)")
            #expect(report.requests >= 25 && report.matched == report.requests)
            #expect(report.derived > 0, "the services' own calls are in the capture and left to them")
            #expect(report.rebound >= 4, "identification, plant, task and device ids were rebound")
        }

        @Test func theCommittedGoldenJourneyReplaysAgainstAFreshStackWithZeroDifferences() async throws {
            let summary = try CaptureSummary.make(try CaptureReader(path: Self.fixture))
            #expect(summary.complete)
            #expect(Set(summary.operations.map(\.service)).isSuperset(of: [Images.service, Care.service, Identification.service, Reminders.service]))
            Self.expectClean(try await Self.replay(Self.fixture))
        }

        @Test func theJourneyRecordedNowReplaysCleanlyToo() async throws {
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-journey-\(UUID().uuidString).ccap").path
            defer { try? FileManager.default.removeItem(atPath: path) }
            try await Self.record(into: path)
            Self.expectClean(try await Self.replay(path))
        }

        /// Records the journey into `path` (the capture stopped, so the file is whole).
        static func record(into path: String) async throws {
            try await withGoldenStack(capture: path) { stack in
                try await journey(stack)
                _ = try await stack.bus.client().call(Broker.CaptureStop.self, .init())
            }
        }

        /// `scripts/record-golden-captures` runs this (it is skipped otherwise) to write the fixture again.
        @Test(.enabled(if: ProcessInfo.processInfo.environment["CANOPY_RECORD_GOLDEN"] == "1"))
        func recordTheGoldenJourney() async throws {
            try FileManager.default.createDirectory(atPath: (Self.fixture as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
            try await Self.record(into: Self.fixture)
            let summary = try CaptureSummary.make(try CaptureReader(path: Self.fixture))
            print("recorded \(summary.records) records (\(summary.requests) requests) into \(Self.fixture)")
        }
    }
}
