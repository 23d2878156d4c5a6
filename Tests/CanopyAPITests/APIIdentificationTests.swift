import AsyncHTTPClient
import CanopyBus
import CanopyCare
import CanopyIdentify
import CanopyImages
import CanopyImaging
import CanopyMessages
import CanopyRemind
import CanopySamples
import CanopyServiceKit
import CanopyTesting
import Foundation
import NIOCore
import Testing

@testable import CanopyAPI

extension LiveAPITests {
    /// Identifications through canopy-api: a multipart upload of photos with their organs,
    /// then accept, get and history, with canopy-identify (its offline reference matcher),
    /// canopy-images and canopy-care behind it.
    @Suite(.serialized)
    struct APIIdentificationTests {
        static let species = ["Testus primus", "Testus secundus", "Testus tertius"]

        /// canopy-images, canopy-care and canopy-identify (and canopy-remind when asked) behind
        /// canopy-api, as `serve` builds them.
        static func withIdentifyStack(
            _ mode: BusMode = .inProcess, reminders: Bool = false, erasureWindow: Duration = ErasedPeople.defaultWindow,
            configure: (inout APIServiceSettings) -> Void = { _ in },
            _ body: (APITests.Stack) async throws -> Void
        ) async throws {
            let directory = try TemporaryDirectory("api-identify")
            defer { directory.remove() }
            try await withTestBus(mode, erasureWindow: erasureWindow) { bus in
                let images = ImageServiceSettings(directory: directory.url.appendingPathComponent("images"), runner: bus.runnerConfiguration())
                let care = CareServiceSettings(directory: directory.url.appendingPathComponent("care"), runner: bus.runnerConfiguration())
                try await bus.start(images)
                try await bus.start(care)
                if reminders {
                    let remind = ReminderServiceSettings(directory: directory.url.appendingPathComponent("remind"), runner: bus.runnerConfiguration())
                    try await bus.start(remind)
                }
                let settings = IdentificationServiceSettings(directory: directory.url.appendingPathComponent("identify"), runner: bus.runnerConfiguration())
                let tools = try IdentificationTools(databasePath: settings.databasePath)
                for (index, name) in Self.species.enumerated() {
                    try tools.addReferences(
                        .init(scientificName: name, commonNames: ["Test plant \(index)"], family: "Testaceae"),
                        photos: try (1...3).map { try SyntheticPlant.species(index).photo(seed: $0) })
                }
                try await bus.start(settings)
                // A debug build computes the photos' features in Swift: amid the whole suite on two
                // cores an identification takes far longer than the edge's 10 s default.
                try await body(
                    try await APITests.startAPI(on: bus) { settings in
                        settings.callTimeout = .seconds(90)
                        configure(&settings)
                    })
            }
        }

        /// A multipart/form-data body: each part a name, an optional content type, and bytes.
        static func form(_ parts: [(name: String, type: String?, bytes: [UInt8])], boundary: String = "canopy-test-boundary") -> [UInt8] {
            MultipartForm.encode(parts.map { MultipartForm.Part(name: $0.name, type: $0.type, bytes: $0.bytes) }, boundary: boundary)
        }

        func submit(_ stack: APITests.Stack, as user: String, _ parts: [(name: String, type: String?, bytes: [UInt8])]) async throws -> APITests.Answer {
            var request = HTTPClientRequest(url: stack.base + "/v1/identifications")
            request.method = .POST
            request.headers.add(name: "Authorization", value: "Bearer \(try await stack.token(user))")
            request.headers.add(name: "Content-Type", value: "multipart/form-data; boundary=canopy-test-boundary")
            request.body = .bytes(ByteBuffer(bytes: Self.form(parts)))
            let response = try await HTTPClient.shared.execute(request, timeout: .seconds(60))
            let body = try await response.body.collect(upTo: 1_048_576)
            var fields: [String: String] = [:]
            for header in response.headers { fields[header.name.lowercased()] = header.value }
            return APITests.Answer(status: Int(response.status.code), headers: fields, body: Array(body.readableBytesView))
        }

        @Test func photosUploadedAsAFormAreIdentifiedAcceptedAndListedEachPersonTheirOwn() async throws {
            try await Self.withIdentifyStack { stack in
                let photos = try (7...8).map { try SyntheticPlant.species(1).photo(seed: $0) }
                let submitted = try await submit(
                    stack, as: "alice",
                    [
                        ("photo", "image/jpeg", photos[0]), ("photo", "image/jpeg", photos[1]),
                        ("organ", nil, Array("leaf".utf8)), ("organ", nil, Array("flower".utf8)),
                        ("latitude", nil, Array("52.5163".utf8)), ("longitude", nil, Array("13.3777".utf8)),
                    ])
                #expect(submitted.status == 200, "\(String(decoding: submitted.body, as: UTF8.self))")
                let id = try #require(submitted.object["id"] as? String)
                #expect(submitted.object["organs"] as? [String] == ["leaf", "flower"])
                #expect((submitted.object["photoIDs"] as? [String])?.count == 2)
                #expect(submitted.object["latitude"] as? Double == 52.52, "coarsened to about 1 km")
                let best = try #require((submitted.object["results"] as? [[String: Any]])?.first)
                #expect(best["scientificName"] as? String == Self.species[1] && best["rank"] as? Int == 1)

                let accepted = try await stack.send(.POST, "/v1/identifications/\(id)/accept", json: #"{"rank":1,"customName":"Secundo"}"#)
                #expect(accepted.status == 200, "\(String(decoding: accepted.body, as: UTF8.self))")
                let plant = try #require(accepted.object["plant"] as? [String: Any])
                #expect(plant["customName"] as? String == "Secundo" && plant["identificationSource"] as? String == "reference")
                #expect(try await stack.send(.GET, "/v1/plants/\(plant["id"] as? String ?? "")").status == 200)
                #expect(try await stack.send(.GET, "/v1/identifications/\(id)").object["acceptedName"] as? String == Self.species[1])
                let history = try await stack.send(.GET, "/v1/identifications?limit=5")
                #expect((history.object["identifications"] as? [[String: Any]])?.map { $0["id"] as? String } == [id])

                // Bob sees and accepts none of it.
                #expect(try await stack.send(.GET, "/v1/identifications/\(id)", as: "bob").status == 404)
                #expect(try await stack.send(.POST, "/v1/identifications/\(id)/accept", as: "bob", json: #"{"rank":1}"#).status == 404)
                #expect((try await stack.send(.GET, "/v1/identifications", as: "bob").object["identifications"] as? [Any])?.isEmpty == true)

                // Bad forms: 400 naming the field, nothing stored.
                let noPhoto = try await submit(stack, as: "alice", [("organ", nil, Array("leaf".utf8))])
                #expect(noPhoto.status == 400 && (noPhoto.object["detail"] as? String)?.contains("photo") == true, "\(noPhoto.object)")
                let petal = try await submit(stack, as: "alice", [("photo", "image/jpeg", photos[0]), ("organ", nil, Array("petal".utf8))])
                #expect(petal.status == 400 && petal.object["field"] as? String == "organ")
                let half = try await submit(stack, as: "alice", [("photo", "image/jpeg", photos[0]), ("latitude", nil, Array("52.5".utf8))])
                #expect(half.status == 400 && half.object["field"] as? String == "longitude")
                let text = try await submit(stack, as: "alice", [("photo", "image/jpeg", Array("not a photo at all".utf8))])
                #expect(text.status == 400, "\(text.object)")
                let six = try await submit(stack, as: "alice", Array(repeating: ("photo", "image/jpeg", photos[0]), count: 6))
                #expect(six.status == 400 && six.object["field"] as? String == "photo")
                #expect((try await stack.send(.GET, "/v1/identifications").object["identifications"] as? [Any])?.count == 1)
            }
        }
    }
}
