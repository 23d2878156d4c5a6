import AsyncHTTPClient
import CanopySamples
import CanopyStore
import CanopyTesting
import Crypto
import Foundation
import Glibc
import NIOHTTP1
import Synchronization
import Testing

/// Several replicas of every service on one PostgreSQL, as a deployment past one machine runs
/// them (`canopy up --database-url … --replicas care=3,remind=2,images=2,identify=2`), driven
/// over HTTP by several people at once while one replica of each service is SIGKILLed (and
/// started again by the stack). Part of ``JourneyTests``: its stacks run one at a time.
extension JourneyTests {
    /// What one person did and what the stack answered OK.
    struct Person: Sendable {
        let name: String
        let token: String
        /// Plants added (answered 201), by id, with their custom names.
        var plants: [String: String] = [:]
        /// Plants deleted (answered 204).
        var deleted: Set<String> = []
        /// Photos stored (answered 201), by plant.
        var photos: [String: Set<String>] = [:]
        /// Tasks snoozed to fire within the run (answered 200), by task id.
        var snoozed: Set<String> = []
        var requests = 0, failures = 0
    }

    @Test func aReplicatedStackOnPostgreSQLLosesNothingWhenAReplicaOfEachServiceIsKilled() async throws {
        let root = try TemporaryDirectory("canopy-replicated")
        defer { root.remove() }
        var url = try await PostgresServer.shared().database()
        let passwordFile = root.path("db-password")
        try Data((url.password ?? "").utf8).write(to: URL(fileURLWithPath: passwordFile))
        url.password = nil
        // A receiver that takes a moment to answer, so a replica is killed mid-delivery too.
        let webhook = RecordingServer(delay: .milliseconds(300))
        let server = Task { try await webhook.application.run() }
        defer { server.cancel() }
        let hook = try await webhook.url("/hooks")
        let stack = try await Stack.start(
            environment: ["CANOPY_ALLOW_HOSTS": "127.0.0.1"],
            database: ["--database-url", url.description, "--database-password-file", passwordFile],
            ["--replicas", "care=3,remind=2,images=2,identify=2"])
        defer { try? FileManager.default.removeItem(atPath: stack.data) }
        do {
            try await Self.driveAndKill(stack, hook: hook, webhook: webhook)
        } catch {
            await stack.stop()
            throw error
        }
        await stack.stop()
    }

    private static func driveAndKill(_ stack: Stack, hook: String, webhook: RecordingServer) async throws {
        let names = ["ana", "ben", "cleo", "dev"]
        var people: [Person] = []
        for name in names { people.append(Person(name: name, token: try await stack.token(name))) }
        // One photo every person stores: kept once, and kept while anyone holds it.
        let common = try SyntheticPlant.species(2).photo(seed: 7)
        let rounds = 14

        // Everyone at once, while one replica of each service is killed a moment in.
        let killer = Task {
            try await Task.sleep(for: .seconds(1))
            for name in ["care-2", "images", "identify-2", "remind"] {
                kill(try stack.pid(name), SIGKILL)
                try await Task.sleep(for: .milliseconds(700))
            }
        }
        people = try await withThrowingTaskGroup(of: Person.self) { group in
            for (index, person) in people.enumerated() {
                group.addTask {
                    try await Self.drive(person, index: index, rounds: rounds, common: common, hook: hook, stack: stack)
                }
            }
            var done: [Person] = []
            for try await person in group { done.append(person) }
            return done.sorted { $0.name < $1.name }
        }
        try await killer.value
        // Every killed replica is running again.
        #expect(
            try await eventually(within: .seconds(90), every: .milliseconds(300)) {
                let state = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: stack.data + "/stack.json"))) as? [String: Any]
                let services = state?["services"] as? [[String: Any]] ?? []
                return ["care-2", "images", "identify-2", "remind"].allSatisfy { name in
                    services.contains { $0["name"] as? String == name && ($0["restarts"] as? Int ?? 0) >= 1 && $0["state"] as? String == "running" }
                }
            }, "every killed replica was started again")

        for person in people {
            // Most calls went through while replicas died: a run where everything failed proves nothing.
            #expect(person.failures * 4 < person.requests, "\(person.name): \(person.failures) of \(person.requests) calls failed")
            #expect(person.plants.count >= rounds / 2 && !person.snoozed.isEmpty, "\(person.name) added \(person.plants.count) plants")
        }

        // Nothing answered OK is lost; nobody sees another's plants or photos.
        var held = Set<String>()
        for person in people {
            let listed = try await stack.send(.GET, "/v1/plants?limit=100", token: person.token)
            let plants = listed.object["plants"] as? [[String: Any]] ?? []
            let ids = Set(plants.compactMap { $0["id"] as? String })
            let kept = Set(person.plants.keys).subtracting(person.deleted)
            #expect(kept.isSubset(of: ids), "\(person.name) lost \(kept.subtracting(ids))")
            #expect(ids.isDisjoint(with: person.deleted), "\(person.name)'s deleted plants are back")
            for plant in plants {
                let name = plant["customName"] as? String ?? ""
                #expect(name.hasPrefix(person.name + "-"), "\(person.name) sees \(name)")
            }
            for id in ids {
                let photos = try await stack.send(.GET, "/v1/plants/\(id)/photos", token: person.token)
                let stored = Set((photos.object["photos"] as? [[String: Any]] ?? []).compactMap { $0["photoID"] as? String })
                let answered = person.photos[id] ?? []
                #expect(answered.isSubset(of: stored), "\(person.name)'s plant \(id) lost photos \(answered.subtracting(stored))")
                held.formUnion(stored)
            }
            for photo in person.photos.filter({ kept.contains($0.key) }).values.flatMap({ $0 }) {
                let thumbnail = try await stack.send(.GET, "/v1/photos/\(photo)/variants/thumbnail", token: person.token)
                #expect(thumbnail.status == 200 && thumbnail.body.prefix(2) == [0xFF, 0xD8], "\(person.name)'s photo \(photo): \(thumbnail.status)")
            }
            // Identifications hold their photos under plant ids of their own until accepted.
            let identifications = try await stack.send(.GET, "/v1/identifications?limit=100", token: person.token)
            for record in identifications.object["identifications"] as? [[String: Any]] ?? [] {
                guard let plantID = record["plantID"] as? String, !ids.contains(plantID) else { continue }
                held.formUnion(record["photoIDs"] as? [String] ?? [])
            }
        }
        let (ana, ben) = (people[0], people[1])
        if let plant = ana.plants.keys.first(where: { !ana.deleted.contains($0) }), let photo = ana.photos[plant]?.first {
            #expect(try await stack.send(.GET, "/v1/plants/\(plant)", token: ben.token).status == 404)
            #expect(try await stack.send(.PUT, "/v1/plants/\(plant)", token: ben.token, json: #"{"scientificName":"Ficus lyrata"}"#).status == 404)
            #expect(
                try await stack.send(.GET, "/v1/photos/\(photo)/variants/thumbnail", token: ben.token).status
                    == (ben.photos.values.contains { $0.contains(photo) } ? 200 : 404))

            // Two phones editing one plant at once, on whichever care replicas: one edit wins, the other is told.
            let read = try await stack.send(.GET, "/v1/plants/\(plant)", token: ana.token)
            let tag = try #require(read.headers["etag"])
            async let first = stack.send(
                .PUT, "/v1/plants/\(plant)", token: ana.token, json: #"{"scientificName":"Monstera deliciosa","customName":"ana-kitchen"}"#,
                headers: [("If-Match", tag)])
            async let second = stack.send(
                .PUT, "/v1/plants/\(plant)", token: ana.token, json: #"{"scientificName":"Monstera deliciosa","customName":"ana-hall"}"#,
                headers: [("If-Match", tag)])
            let statuses = [try await first.status, try await second.status].sorted()
            #expect(statuses == [200, 412], "\(statuses)")
        }

        // Every snoozed task's reminder arrives, each under one webhook-id whichever replica sent
        // it. One whose follow-up or send a killed replica held goes within seconds (its
        // presence ended); the wait is long because on a starved machine a failed sync or
        // delivery backs off (1, 2, 4 … s) before it is tried again.
        let snoozed = people.reduce(into: Set<String>()) { $0.formUnion($1.snoozed) }
        var deliveries: [String: Set<String>] = [:]
        let arrived = try await eventually(within: .seconds(300), every: .milliseconds(250)) {
            deliveries = [:]
            for received in webhook.received {
                guard let id = received.headers["webhook-id"],
                    let payload = try? JSONSerialization.jsonObject(with: Data(received.body)) as? [String: Any],
                    let reminders = (payload["data"] as? [String: Any])?["reminders"] as? [[String: Any]]
                else { continue }
                for reminder in reminders {
                    let key = "\(reminder["taskID"] as? String ?? "") at \(reminder["due"] as? String ?? "")"
                    deliveries[key, default: []].insert(id)
                }
            }
            let tasks = Set(deliveries.keys.map { String($0.prefix { $0 != " " }) })
            return snoozed.isSubset(of: tasks)
        }
        #expect(arrived, "never delivered: \(snoozed.subtracting(deliveries.keys.map { String($0.prefix { $0 != " " }) }))")
        for (reminder, ids) in deliveries {
            #expect(ids.count == 1, "\(reminder) was delivered under \(ids.count) ids: \(ids)")
        }

        // No photo orphaned or lost: the shared originals are exactly the photos someone holds.
        let originals = stack.data + "/images/originals"
        var files = Set<String>()
        let settled = try await eventually(within: .seconds(60), every: .milliseconds(500)) {
            files = Set(try FileManager.default.contentsOfDirectory(atPath: originals).filter { $0.count == 64 })
            return files == held
        }
        #expect(settled, "files nobody holds: \(files.subtracting(held)); photos without a file: \(held.subtracting(files))")
        let commonID = SHA256.hash(data: common).map { String(format: "%02x", $0) }.joined()
        #expect(held.contains(commonID) && files.contains(commonID), "the photo everyone stored stays while anyone holds it")
    }

    /// One person's session: plants added, photos stored, some plants deleted, a photo
    /// identified and accepted, a webhook registered and tasks snoozed to fire in seconds.
    private static func drive(_ person: Person, index: Int, rounds: Int, common: [UInt8], hook: String, stack: Stack) async throws -> Person {
        var person = person
        func call(_ method: HTTPMethod, _ path: String, json: String? = nil, body: [UInt8]? = nil, type: String? = nil) async -> Answer? {
            person.requests += 1
            do {
                let answer = try await stack.send(method, path, token: person.token, json: json, body: body, type: type)
                if answer.status >= 500 { person.failures += 1 }
                return answer
            } catch {
                person.failures += 1
                return nil
            }
        }
        let secret = "whsec_" + Data(repeating: UInt8(index + 1), count: 24).base64EncodedString()
        let device = await call(.POST, "/v1/devices", json: #"{"channel":"webhook","address":"\#(hook)/\#(person.name)","secret":"\#(secret)"}"#)
        #expect(device?.status == 201, "\(person.name)'s webhook: \(device?.text ?? "no answer")")
        for round in 0..<rounds {
            let species = Stack.species[round % Stack.species.count]
            let name = "\(person.name)-\(round)"
            guard let added = await call(.POST, "/v1/plants", json: #"{"scientificName":"\#(species)","customName":"\#(name)"}"#), added.status == 201,
                let plant = added.object["id"] as? String
            else { continue }
            person.plants[plant] = name
            let photo = round == 0 ? common : try SyntheticPlant.species(round % 3).photo(seed: 1_000 * (index + 1) + round)
            if let stored = await call(.POST, "/v1/plants/\(plant)/photos", body: photo, type: "image/jpeg"), stored.status == 201,
                let id = stored.object["photoID"] as? String
            {
                person.photos[plant, default: []].insert(id)
            }
            // Every third plant goes again, photos and all.
            if round % 3 == 2, await call(.DELETE, "/v1/plants/\(plant)")?.status == 204 {
                person.deleted.insert(plant)
            }
            // A task of two plants fires a few seconds from now, people apart.
            if round == 1 || round == 4, let upcoming = await call(.GET, "/v1/tasks/upcoming?days=60"),
                let task = (upcoming.object["tasks"] as? [[String: Any]])?.first(where: { $0["plantID"] as? String == plant })?["id"] as? String
            {
                let due = Date(timeIntervalSinceNow: Double(3 + 2 * index + (round == 4 ? 4 : 0)))
                let until = due.formatted(Date.ISO8601FormatStyle(includingFractionalSeconds: true))
                if await call(.POST, "/v1/tasks/\(task)/snooze", json: #"{"until":"\#(until)"}"#)?.status == 200 { person.snoozed.insert(task) }
            }
            // A photo identified, then accepted as a plant of its own.
            if round == 1 {
                let form = MultipartForm.encode(
                    [
                        .init(name: "photo", type: "image/jpeg", bytes: try SyntheticPlant.species(1).photo(seed: 40 + index)),
                        .init(name: "organ", bytes: Array("leaf".utf8)),
                    ], boundary: "replicas")
                if let identified = await call(.POST, "/v1/identifications", body: form, type: "multipart/form-data; boundary=replicas"),
                    identified.status == 200, let id = identified.object["id"] as? String,
                    let accepted = await call(.POST, "/v1/identifications/\(id)/accept", json: #"{"rank":1,"customName":"\#(person.name)-identified"}"#),
                    accepted.status == 200, let plant = (accepted.object["plant"] as? [String: Any])?["id"] as? String
                {
                    person.plants[plant] = "\(person.name)-identified"
                }
            }
        }
        // The first person lets go of the photo everyone stored; the others still hold it.
        if index == 0, let first = person.plants.first(where: { $0.value == "\(person.name)-0" })?.key,
            await call(.DELETE, "/v1/plants/\(first)")?.status == 204
        {
            person.deleted.insert(first)
        }
        return person
    }
}
