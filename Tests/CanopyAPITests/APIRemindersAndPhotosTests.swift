import AsyncHTTPClient
import CanopyBus
import CanopyCare
import CanopyImages
import CanopyImaging
import CanopyMessages
import CanopyRemind
import CanopySamples
import CanopyServiceKit
import CanopyTesting
import Foundation
import NIOCore
import NIOHTTP1
import Testing

@testable import CanopyAPI

/// Devices, reminders and photos through canopy-api, with canopy-remind and canopy-images
/// behind it as `serve` builds them.
extension LiveAPITests {
    @Suite(.serialized)
    struct APIRemindersAndPhotosTests {
        /// canopy-care, canopy-remind and canopy-images behind canopy-api: on the in-process
        /// bus, or (`.live`) as `serve` builds them, through the real broker.
        static func withFullStack(
            _ mode: BusMode = .inProcess, configure: (inout APIServiceSettings) -> Void = { _ in },
            _ body: (APITests.Stack) async throws -> Void
        ) async throws {
            let directory = try TemporaryDirectory("api-full")
            defer { directory.remove() }
            try await withTestBus(mode) { bus in
                var care = CareServiceSettings(directory: directory.url.appendingPathComponent("care"), runner: bus.runnerConfiguration())
                care.outboxInterval = .milliseconds(100)
                let remind = ReminderServiceSettings(directory: directory.url.appendingPathComponent("remind"), runner: bus.runnerConfiguration())
                let images = ImageServiceSettings(directory: directory.url.appendingPathComponent("images"), runner: bus.runnerConfiguration())
                try await bus.start(care)
                try await bus.start(remind)
                try await bus.start(images)
                try await body(try await APITests.startAPI(on: bus, configure: configure))
            }
        }

        @Test func devicesAndRemindersOverHTTPEachPersonTheirOwn() async throws {
            try await Self.withFullStack { stack in
                let device = try await stack.send(.POST, "/v1/devices", json: #"{"channel":"log","address":"alice's desk","name":"desk"}"#)
                #expect(device.status == 201, "\(String(decoding: device.body, as: UTF8.self))")
                let deviceID = try #require(device.object["id"] as? String)
                let listed = try await stack.send(.GET, "/v1/devices")
                #expect((listed.object["devices"] as? [[String: Any]])?.map { $0["id"] as? String } == [deviceID])
                let test = try await stack.send(.POST, "/v1/devices/\(deviceID)/test")
                #expect(test.status == 200 && test.object["accepted"] as? Bool == true)

                _ = try await stack.send(.POST, "/v1/plants", json: APITests.monstera)
                var pending: [[String: Any]] = []
                _ = try await eventually(within: .seconds(20)) { // canopy-care's outbox hands the window over
                    pending = try await stack.send(.GET, "/v1/reminders/pending?limit=10").object["reminders"] as? [[String: Any]] ?? []
                    return !pending.isEmpty
                }
                #expect(pending.count == 10 && pending.first?["state"] as? String == "pending")
                #expect(try await stack.send(.GET, "/v1/reminders/failures").status == 200)

                // Bob sees none of it and cannot use or remove Alice's device.
                #expect((try await stack.send(.GET, "/v1/devices", as: "bob").object["devices"] as? [Any])?.isEmpty == true)
                #expect((try await stack.send(.GET, "/v1/reminders/pending", as: "bob").object["reminders"] as? [Any])?.isEmpty == true)
                #expect(try await stack.send(.POST, "/v1/devices/\(deviceID)/test", as: "bob").status == 404)
                _ = try await stack.send(.DELETE, "/v1/devices/\(deviceID)", as: "bob")
                #expect((try await stack.send(.GET, "/v1/devices").object["devices"] as? [Any])?.count == 1)

                let webhook = try await stack.send(
                    .POST, "/v1/devices",
                    json: #"{"channel":"webhook","address":"http://169.254.169.254/hook","secret":"whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}"#)
                #expect(webhook.status == 400, "an address inside the network is refused")
                let unknown = try await stack.send(.POST, "/v1/devices", json: #"{"channel":"pigeon","address":"roof"}"#)
                #expect(unknown.status == 400)
                #expect(try await stack.send(.DELETE, "/v1/devices/\(deviceID)").status == 204)
                #expect((try await stack.send(.GET, "/v1/devices").object["devices"] as? [Any])?.isEmpty == true)
            }
        }

        @Test func photosAsACDNServesThemWithETagsAnd304AndWebPWhenAccepted() async throws {
            try await Self.withFullStack { stack in
                let plant = try #require(try await stack.send(.POST, "/v1/plants", json: APITests.monstera).object["id"] as? String)
                let jpeg = try SyntheticPlant.species(3).photo(seed: 7, width: 640, height: 480)
                var upload = HTTPClientRequest(url: stack.base + "/v1/plants/\(plant)/photos")
                upload.method = .POST
                upload.headers.add(name: "Authorization", value: "Bearer \(try await stack.token("alice"))")
                upload.headers.add(name: "Content-Type", value: "image/jpeg")
                upload.body = .bytes(ByteBuffer(bytes: jpeg))
                let uploaded = try await HTTPClient.shared.execute(upload, timeout: .seconds(30))
                #expect(uploaded.status.code == 201)
                let photo = try JSONSerialization.jsonObject(with: Data(try await uploaded.body.collect(upTo: 65_536).readableBytesView)) as? [String: Any]
                let photoID = try #require(photo?["photoID"] as? String)
                #expect(photoID.count == 64)
                let listed = try await stack.send(.GET, "/v1/plants/\(plant)/photos")
                #expect((listed.object["photos"] as? [[String: Any]])?.first?["photoID"] as? String == photoID)

                let thumbnail = try await stack.send(.GET, "/v1/photos/\(photoID)/variants/thumbnail")
                #expect(thumbnail.status == 200 && thumbnail.headers["content-type"] == "image/jpeg")
                #expect(thumbnail.body.prefix(3) == [0xFF, 0xD8, 0xFF])
                let eTag = try #require(thumbnail.headers["etag"])
                #expect(eTag == "\"\(photoID)-thumbnail-jpeg\"" && thumbnail.headers["cache-control"] == "private, max-age=31536000, immutable")
                let again = try await stack.send(.GET, "/v1/photos/\(photoID)/variants/thumbnail", headers: [("If-None-Match", eTag)])
                #expect(again.status == 304 && again.body.isEmpty && again.headers["etag"] == eTag)
                let webp = try await stack.send(.GET, "/v1/photos/\(photoID)/variants/gallery", headers: [("Accept", "image/webp,image/*;q=0.8")])
                #expect(webp.status == 200 && webp.headers["content-type"] == "image/webp" && webp.body.prefix(4).elementsEqual("RIFF".utf8))
                #expect(webp.headers["etag"] == "\"\(photoID)-gallery-webp\"")
                let palette = try await stack.send(.GET, "/v1/photos/\(photoID)/palette")
                #expect(palette.status == 200 && !((palette.object["swatches"] as? [Any]) ?? []).isEmpty)

                // Bytes are not batched; the palette, JSON, is.
                let batched = try await stack.send(
                    .POST, "/v1/batch",
                    json: """
                        {"operations":[{"method":"GET","path":"/v1/photos/\(photoID)/variants/thumbnail"},{"method":"GET","path":"/v1/photos/\(photoID)/palette"}]}
                        """)
                let results = try #require(batched.object["results"] as? [[String: Any]])
                #expect(results.map { $0["status"] as? Int } == [400, 200])
                #expect(((results[0]["body"] as? [String: Any])?["detail"] as? String)?.contains("bytes") == true)

                // Bob cannot see Alice's photo, not even as a 304.
                #expect(try await stack.send(.GET, "/v1/photos/\(photoID)/variants/thumbnail", as: "bob").status == 404)
                #expect(try await stack.send(.GET, "/v1/photos/\(photoID)/variants/thumbnail", as: "bob", headers: [("If-None-Match", eTag)]).status == 404)
                #expect(try await stack.send(.GET, "/v1/photos/\(photoID)/palette", as: "bob").status == 404)
                // Not a photo: refused, nothing stored.
                var text = upload
                text.headers.replaceOrAdd(name: "Authorization", value: "Bearer \(try await stack.token("alice"))")
                text.body = .bytes(ByteBuffer(string: "this is not a photo"))
                #expect(try await HTTPClient.shared.execute(text, timeout: .seconds(30)).status.code == 400)
                #expect((try await stack.send(.GET, "/v1/plants/\(plant)/photos").object["photos"] as? [Any])?.count == 1)
                #expect(try await stack.send(.GET, "/v1/photos/\(String(repeating: "z", count: 64))/variants/thumbnail").status == 400)

                // A photo for a plant that does not exist, or is another person's: 404, nothing stored.
                for (target, token) in [("0", "alice"), (plant, "bob")] {
                    var stray = upload
                    stray.url = stack.base + "/v1/plants/\(target)/photos"
                    stray.headers.replaceOrAdd(name: "Authorization", value: "Bearer \(try await stack.token(token))")
                    #expect(try await HTTPClient.shared.execute(stray, timeout: .seconds(30)).status.code == 404, "\(target) as \(token)")
                    #expect((try await stack.send(.GET, "/v1/plants/\(target)/photos", as: token).object["photos"] as? [Any])?.isEmpty != false)
                }
                #expect((try await stack.send(.GET, "/v1/plants/\(plant)/photos").object["photos"] as? [Any])?.count == 1)
            }
        }
    }
}
