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
    typealias Answer = LiveAPITests.APITests.Answer
    typealias Stack = LiveAPITests.APITests.Stack

    /// Every service behind canopy-api, with canopy-api's store keeping keys.
    static func withKeyedStack(_ body: (Stack) async throws -> Void) async throws {
        let directory = try TemporaryDirectory("idempotency-stack")
        defer { directory.remove() }
        let store = try await openAPIStore(directory: directory.url, postgres: nil, logger: Logger(label: "test"))
        try await withIdentifyStack(reminders: true, configure: { $0.store = store }, body)
    }

    /// `request` twice with one key: the same answer, the second marked replayed.
    func twice(
        _ request: (_ key: [(String, String)]) async throws -> Answer, key: String = UUID().uuidString,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async throws -> Answer {
        let first = try await request([("Idempotency-Key", key)])
        let second = try await request([("Idempotency-Key", key)])
        #expect((200..<300).contains(first.status), "\(String(decoding: first.body, as: UTF8.self))", sourceLocation: sourceLocation)
        #expect(first.headers["idempotent-replayed"] == nil, sourceLocation: sourceLocation)
        #expect(second.status == first.status && second.body == first.body, "\(String(decoding: second.body, as: UTF8.self))", sourceLocation: sourceLocation)
        #expect(
            second.headers["idempotent-replayed"] == "true" && second.headers["content-type"] == first.headers["content-type"], sourceLocation: sourceLocation)
        #expect(second.headers["x-request-id"] != first.headers["x-request-id"], "the repeat's own request id", sourceLocation: sourceLocation)
        return first
    }

    /// Each POST route sent twice with one key does its work once and answers the same.
    @Test func eachPOSTRouteSentTwiceWithOneKeyDoesItsWorkOnceAndAnswersTheSame() async throws {
        try await Self.withKeyedStack { stack in
            // A plant.
            let plant = try await twice { try await stack.send(.POST, "/v1/plants", json: LiveAPITests.APITests.monstera, headers: $0) }
            let plantID = try #require(plant.object["id"] as? String)
            #expect(try await stack.send(.GET, "/v1/plants").object["total"] as? Int == 1)

            // Its tasks: completed, snoozed and skipped once each.
            let tasks = try #require(try await stack.send(.GET, "/v1/tasks/upcoming?days=60").object["tasks"] as? [[String: Any]])
            let taskID = try #require(tasks.first { $0["plantID"] as? String == plantID && $0["kind"] as? String == "water" }?["id"] as? String)
            let completed = try await twice { try await stack.send(.POST, "/v1/tasks/\(taskID)/complete", json: "{}", headers: $0) }
            let dueAfterComplete = try #require(completed.object["due"] as? String)
            #expect(try await Self.due(of: taskID, in: stack) == dueAfterComplete)
            let snoozed = try await twice {
                try await stack.send(.POST, "/v1/tasks/\(taskID)/snooze", json: #"{"until":"2031-01-01T09:00:00.000Z"}"#, headers: $0)
            }
            #expect(snoozed.object["snoozedUntil"] as? String == "2031-01-01T09:00:00.000Z")
            let skipped = try await twice { try await stack.send(.POST, "/v1/tasks/\(taskID)/skip", headers: $0) }
            let dueAfterSkip = try #require(skipped.object["due"] as? String)
            #expect(dueAfterSkip > dueAfterComplete)
            #expect(try await Self.due(of: taskID, in: stack) == dueAfterSkip, "skipped once")

            // A device, and its test notification.
            let device = try await twice {
                try await stack.send(.POST, "/v1/devices", json: #"{"channel":"log","address":"a desk","name":"desk"}"#, headers: $0)
            }
            let deviceID = try #require(device.object["id"] as? String)
            #expect((try await stack.send(.GET, "/v1/devices").object["devices"] as? [Any])?.count == 1)
            _ = try await twice { try await stack.send(.POST, "/v1/devices/\(deviceID)/test", headers: $0) }

            // A photo of the plant.
            let jpeg = try SyntheticPlant.species(3).photo(seed: 7, width: 320, height: 240)
            _ = try await twice { try await stack.send(.POST, "/v1/plants/\(plantID)/photos", bytes: jpeg, type: "image/jpeg", headers: $0) }
            #expect((try await stack.send(.GET, "/v1/plants/\(plantID)/photos").object["photos"] as? [Any])?.count == 1)

            // An identification, and accepting it: one more plant.
            let form = Self.form([("photo", "image/jpeg", try SyntheticPlant.species(1).photo(seed: 40)), ("organ", nil, Array("leaf".utf8))])
            let identified = try await twice {
                try await stack.send(.POST, "/v1/identifications", bytes: form, type: "multipart/form-data; boundary=canopy-test-boundary", headers: $0)
            }
            let identificationID = try #require(identified.object["id"] as? String)
            let accepted = try await twice { try await stack.send(.POST, "/v1/identifications/\(identificationID)/accept", json: #"{"rank":1}"#, headers: $0) }
            #expect((accepted.object["plant"] as? [String: Any])?["id"] != nil, "\(accepted.object)")
            #expect(try await stack.send(.GET, "/v1/plants").object["total"] as? Int == 2)

            // A batch that adds a plant and completes a task: each once.
            let batch =
                #"{"operations":[{"method":"POST","path":"/v1/plants","body":{"scientificName":"Epipremnum aureum"}},{"method":"POST","path":"/v1/tasks/\#(taskID)/complete","body":{}}]}"#
            let batched = try await twice { try await stack.send(.POST, "/v1/batch", json: batch, headers: $0) }
            let results = try #require(batched.object["results"] as? [[String: Any]])
            #expect(results.map { $0["status"] as? Int } == [201, 200])
            #expect(try await stack.send(.GET, "/v1/plants").object["total"] as? Int == 3)
        }
    }

    /// When the task is due now, as the upcoming list says.
    static func due(of taskID: String, in stack: Stack) async throws -> String? {
        let tasks = try await stack.send(.GET, "/v1/tasks/upcoming?days=366&limit=500").object["tasks"] as? [[String: Any]]
        return tasks?.first { $0["id"] as? String == taskID }?["due"] as? String
    }

    /// The key with another body is 422 and changes nothing; a bad key is 400; two people's
    /// keys never meet; a key works on its own route only.
    @Test func aKeyReusedWithAnotherRequestIs422AndKeysAreEachPersonsAndRoutesOwn() async throws {
        try await Self.withKeyedStack { stack in
            let key = [("Idempotency-Key", "shared-key-1")]
            let first = try await stack.send(.POST, "/v1/plants", json: LiveAPITests.APITests.monstera, headers: key)
            #expect(first.status == 201)
            let other = try await stack.send(.POST, "/v1/plants", json: #"{"scientificName":"Ficus lyrata"}"#, headers: key)
            #expect(other.status == 422 && other.headers["content-type"] == "application/problem+json")
            #expect((other.object["detail"] as? String)?.hasPrefix("idempotency key reused with another request") == true)
            #expect(other.object["field"] as? String == "Idempotency-Key")
            #expect(try await stack.send(.GET, "/v1/plants").object["total"] as? Int == 1)

            for bad in ["", String(repeating: "k", count: 256), "clé"] {
                let answer = try await stack.send(.POST, "/v1/plants", json: #"{"scientificName":"Ficus lyrata"}"#, headers: [("Idempotency-Key", bad)])
                #expect(answer.status == 400 && answer.object["field"] as? String == "Idempotency-Key", "\(bad.debugDescription): \(answer.object)")
            }
            #expect(try await stack.send(.GET, "/v1/plants").object["total"] as? Int == 1)

            // Bob's request with Alice's key is his own: his plant, not hers, not a 422.
            let bob = try await stack.send(.POST, "/v1/plants", as: "bob", json: LiveAPITests.APITests.monstera, headers: key)
            #expect(bob.status == 201 && bob.headers["idempotent-replayed"] == nil)
            #expect(bob.object["id"] as? String != first.object["id"] as? String)
            #expect(try await stack.send(.GET, "/v1/plants", as: "bob").object["total"] as? Int == 1)
            #expect(try await stack.send(.GET, "/v1/plants").object["total"] as? Int == 1)
            // The key on another route is another key.
            let device = try await stack.send(.POST, "/v1/devices", json: #"{"channel":"log","address":"a desk"}"#, headers: key)
            #expect(device.status == 201 && device.headers["idempotent-replayed"] == nil)
            // A request without a key is never replayed.
            let plain = try await stack.send(.POST, "/v1/plants", json: LiveAPITests.APITests.monstera)
            #expect(plain.status == 201 && plain.headers["idempotent-replayed"] == nil)
            #expect(try await stack.send(.GET, "/v1/plants").object["total"] as? Int == 2)
        }
    }

    /// Many copies of one request at once: one does the work; each of the others gets its
    /// answer or 409 with Retry-After.
    @Test func copiesSentAtOnceDoTheWorkOnce() async throws {
        try await Self.withKeyedStack { stack in
            let token = try await stack.token("alice")
            let answers = try await withThrowingTaskGroup(of: Answer.self) { group in
                for _ in 0..<8 {
                    group.addTask {
                        try await stack.send(.POST, "/v1/plants", token: token, json: LiveAPITests.APITests.monstera, headers: [("Idempotency-Key", "at-once")])
                    }
                }
                return try await group.reduce(into: [Answer]()) { $0.append($1) }
            }
            let created = answers.filter { $0.status == 201 }
            #expect(!created.isEmpty && Set(created.map(\.body)).count == 1, "one answer, given again")
            #expect(created.filter { $0.headers["idempotent-replayed"] == nil }.count == 1)
            for conflict in answers where conflict.status != 201 {
                #expect(conflict.status == 409 && Int(conflict.headers["retry-after"] ?? "") ?? 0 >= 1, "\(conflict.object)")
            }
            #expect(try await stack.send(.GET, "/v1/plants").object["total"] as? Int == 1)
        }
    }
}
