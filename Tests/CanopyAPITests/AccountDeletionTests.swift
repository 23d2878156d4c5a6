import AsyncHTTPClient
import CanopyMessages
import CanopySamples
import CanopyTesting
import Foundation
import Logging
import NIOCore
import Testing

@testable import CanopyAPI

extension LiveAPITests.APIIdentificationTests {
    /// `DELETE /v1/account`: everything the person owns goes from every service (plants,
    /// tasks, preferences, devices, reminders, identifications, photos), another person's
    /// stays, and every token the person was issued is refused from then on; a request
    /// another edge let through before it saw the sign-out is refused by the services for
    /// their erasure window.
    @Test func deletingAnAccountRemovesEverythingThePersonOwnsAndSignsThemOut() async throws {
        let directory = try TemporaryDirectory("account-deletion")
        defer { directory.remove() }
        let store = try await openAPIStore(directory: directory.url, postgres: nil, logger: Logger(label: "test"))
        let window = Duration.seconds(10) // the refusals are checked well inside it, however loaded the machine
        try await Self.withIdentifyStack(reminders: true, erasureWindow: window, configure: { $0.store = store }) { stack in
            var tokens: [String: String] = [:]
            for person in ["alice", "bob"] {
                let token = try await stack.token(person)
                tokens[person] = token
                // A photo identified and accepted (a plant with photos and tasks), another left unaccepted,
                // a device, preferences.
                let first = try await submit(stack, token: token, try SyntheticPlant.species(1).photo(seed: 30))
                let id = try #require(first.object["id"] as? String, "\(first.object)")
                #expect(try await stack.send(.POST, "/v1/identifications/\(id)/accept", token: token, json: #"{"rank":1}"#).status == 200)
                _ = try await submit(stack, token: token, try SyntheticPlant.species(2).photo(seed: 31))
                #expect(try await stack.send(.POST, "/v1/devices", token: token, json: #"{"channel":"log","address":"a desk","name":"desk"}"#).status == 201)
                #expect(try await stack.send(.PUT, "/v1/preferences", token: token, json: #"{"timeZone":"Europe/Berlin","preferredMinute":480}"#).status == 200)
            }
            let alice = try #require(tokens["alice"])
            let plants = try await stack.send(.GET, "/v1/plants", token: alice)
            let plantID = try #require((plants.object["plants"] as? [[String: Any]])?.first?["id"] as? String)

            let another = try await stack.token("alice") // her other phone's
            let deleted = try await stack.send(.DELETE, "/v1/account", token: alice)
            #expect(deleted.status == 204, "\(String(decoding: deleted.body, as: UTF8.self))")
            // Her token, and any other issued to her before, are refused at once.
            #expect(try await eventually { try await stack.send(.GET, "/v1/plants", token: alice).status == 401 })
            #expect(try await stack.send(.GET, "/v1/plants", token: another).status == 401, "every token issued to her before")

            // A request for her that another edge let through late is refused, and adds nothing:
            // by canopy-care at once, by the others once their follow-up came.
            let client = try stack.bus.client()
            let late = ContinuousClock.now
            let refused = await #expect(throws: CanopyError.self) {
                try await client.call(Care.AddPlant.self, Care.Plant(scientificName: "Ficus lyrata"), principal: "alice")
            }
            #expect(refused?.code == .unauthorized && refused?.message.contains("deleted") == true, "\(String(describing: refused))")
            #expect(
                try await eventually {
                    do {
                        _ = try await client.call(Reminders.ListDevices.self, Empty(), principal: "alice")
                        return false
                    } catch let error as CanopyError { return error.code == .unauthorized }
                })

            // What every service kept of her is gone, asked as her once their windows passed
            // (over the bus: the services' own answers).
            try await Task.sleep(until: late + window + .milliseconds(500))
            #expect(try await client.call(Care.ListPlants.self, .init(), principal: "alice").plants.isEmpty)
            #expect(try await eventually { try await client.call(Reminders.ListDevices.self, Empty(), principal: "alice").isEmpty })
            #expect(try await eventually { try await client.call(Reminders.Pending.self, .init(), principal: "alice").isEmpty })
            #expect(try await eventually { try await client.call(Identification.History.self, .init(), principal: "alice").items.isEmpty })
            #expect(try await eventually { try await client.call(Images.List.self, .init(plantID: plantID), principal: "alice").isEmpty })

            // Bob's all stay.
            let bob = try #require(tokens["bob"])
            #expect((try await stack.send(.GET, "/v1/plants", token: bob).object["plants"] as? [Any])?.count == 1)
            #expect(try await client.call(Reminders.ListDevices.self, Empty(), principal: "bob").count == 1)
            #expect(try await client.call(Identification.History.self, .init(), principal: "bob").items.count == 2)
        }
    }

    func submit(_ stack: LiveAPITests.APITests.Stack, token: String, _ photo: [UInt8]) async throws -> LiveAPITests.APITests.Answer {
        var request = HTTPClientRequest(url: stack.base + "/v1/identifications")
        request.method = .POST
        request.headers.add(name: "Authorization", value: "Bearer \(token)")
        request.headers.add(name: "Content-Type", value: "multipart/form-data; boundary=canopy-test-boundary")
        request.body = .bytes(ByteBuffer(bytes: Self.form([("photo", "image/jpeg", photo), ("organ", nil, Array("leaf".utf8))])))
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(60))
        let body = try await response.body.collect(upTo: 1_048_576)
        return LiveAPITests.APITests.Answer(status: Int(response.status.code), headers: [:], body: Array(body.readableBytesView))
    }
}
