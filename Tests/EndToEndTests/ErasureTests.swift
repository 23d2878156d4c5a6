import AsyncHTTPClient
import CanopySamples
import CanopyTesting
import Foundation
import NIOHTTP1
import Testing

/// A deleted account leaves nothing: after `DELETE /v1/account` and the stack stopped, no
/// file of its data directory holds a byte of the person (their id, their notes, their
/// photos' hashes and bytes, their webhook secret), while another person's data is all there;
/// and the edge that answered the deletion refuses the person's token at once.
@Suite(.serialized)
struct ErasureTests {
    typealias Stack = JourneyTests.Stack

    /// Files under `data` that hold `needle` byte for byte.
    static func files(holding needle: [UInt8], in data: String) throws -> [String] {
        let root = URL(fileURLWithPath: data)
        guard let walker = FileManager.default.enumerator(at: root, includingPropertiesForKeys: [.isRegularFileKey]) else { return [] }
        var found: [String] = []
        for case let file as URL in walker where (try? file.resourceValues(forKeys: [.isRegularFileKey]).isRegularFile) == true {
            let bytes = try Data(contentsOf: file)
            if bytes.range(of: Data(needle)) != nil { found.append(String(file.path.dropFirst(root.path.count))) }
        }
        return found
    }

    @Test func aDeletedAccountLeavesNoByteOfThePersonInAnyFile() async throws {
        let stack = try await Stack.start(environment: ["CANOPY_ALLOW_HOSTS": "127.0.0.1", "CANOPY_ERASURE_SECOND_PASS": "2"])
        defer { try? FileManager.default.removeItem(atPath: stack.data) }
        let tag = UUID().uuidString.prefix(8).lowercased()
        let (erased, kept) = ("erased-person-\(tag)", "kept-person-\(tag)")
        let (erasedNote, keptNote) = ("the-erased-persons-notes-\(tag)", "the-kept-persons-notes-\(tag)")
        let secret =
            "whsec_" + (0..<32).map { _ in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789".randomElement()! }.map(String.init).joined()
        var needles: [(what: String, bytes: [UInt8])] = []
        do {
            let x = try await stack.token(erased), y = try await stack.token(kept)
            for (token, note, seed) in [(x, erasedNote, 7), (y, keptNote, 8)] {
                // A plant with notes, added with an idempotency key; a photo of it; an identification.
                let added = try await stack.send(
                    .POST, "/v1/plants", token: token, json: #"{"scientificName":"Ficus lyrata","customName":"Fig","notes":"\#(note)"}"#,
                    headers: [("Idempotency-Key", "key-\(note)")])
                #expect(added.status == 201, "\(added.text)")
                let plant = try #require(added.object["id"] as? String)
                let upload = try await stack.send(
                    .POST, "/v1/plants/\(plant)/photos", token: token, body: try SyntheticPlant.species(0).photo(seed: seed), type: "image/jpeg")
                #expect(upload.status == 201, "\(upload.text)")
                let photo = try #require(upload.object["photoID"] as? String, "\(upload.text)")
                let thumbnail = try await stack.send(.GET, "/v1/photos/\(photo)/variants/thumbnail", token: token)
                #expect(thumbnail.status == 200)
                let form = MultipartForm.encode(
                    [
                        .init(name: "photo", type: "image/jpeg", bytes: try SyntheticPlant.species(2).photo(seed: seed)),
                        .init(name: "organ", bytes: Array("leaf".utf8)),
                    ], boundary: "erasure")
                #expect(
                    try await stack.send(.POST, "/v1/identifications", token: token, body: form, type: "multipart/form-data; boundary=erasure").status == 200)
                // A task done.
                let upcoming = try await stack.send(.GET, "/v1/tasks/upcoming?days=60", token: token)
                let task = try #require((upcoming.object["tasks"] as? [[String: Any]])?.first?["id"] as? String, "\(upcoming.text)")
                #expect(try await stack.send(.POST, "/v1/tasks/\(task)/complete", token: token, json: "{}").status == 200)
                if token == x {
                    let device = try await stack.send(
                        .POST, "/v1/devices", token: x,
                        json: #"{"channel":"webhook","address":"http://127.0.0.1:9/hooks","secret":"\#(secret)"}"#)
                    #expect(device.status == 201, "\(device.text)")
                    let middle = thumbnail.body.count / 2
                    needles = [
                        ("the person's id", Array(erased.utf8)), ("their notes", Array(erasedNote.utf8)), ("their photo's hash", Array(photo.utf8)),
                        ("their thumbnail's bytes", Array(thumbnail.body[middle..<(middle + 48)])), ("their webhook secret", Array(secret.utf8)),
                    ]
                }
            }

            // Deleted: the same edge refuses the token at once, for reads and writes alike.
            let deleted = try await stack.send(.DELETE, "/v1/account", token: x)
            #expect(deleted.status == 204, "\(deleted.text)")
            #expect(try await stack.send(.GET, "/v1/plants", token: x).status == 401)
            #expect(try await stack.send(.POST, "/v1/plants", token: x, json: #"{"scientificName":"Ficus lyrata"}"#).status == 401)
            // A request for them another edge let through before it saw the sign-out (here: the
            // operator's client, naming them) is refused, and adds nothing.
            let late = try await runExecutable(
                "canopy",
                [
                    "send", "care", "plants.add", "--principal", erased, "--json", #"{"scientificName":"Ficus lyrata","notes":"late-\#(tag)"}"#,
                    "--broker", stack.endpoint, "--data-dir", stack.data,
                ])
            #expect(late.status == 1 && late.errors.contains("this account was deleted"), "\(late.output) \(late.errors)")
            // The deletion is listed by its digest, never the person.
            let listed = try await runExecutable("canopy", ["erasures", "list", "--data-dir", stack.data])
            #expect(listed.status == 0 && listed.output.contains("1 account deleted") && !listed.output.contains(erased), "\(listed.output) \(listed.errors)")
            // Every service's follow-up done, the second pass too: no row names them (canopy-care's outbox emptied).
            #expect(
                try await eventually(within: .seconds(60), every: .milliseconds(250)) {
                    try JourneyTests.mentions(of: erased, in: stack.data).isEmpty
                }, "still named: \((try? JourneyTests.mentions(of: erased, in: stack.data)) ?? [])")
            try await Task.sleep(for: .seconds(1)) // the checkpointers' next tick, for a log a reader held
        } catch {
            await stack.stop()
            throw error
        }
        await stack.stop()

        // Byte for byte, in every file the stack keeps (stores, their logs, originals, caches, logs).
        for needle in needles {
            let holding = try Self.files(holding: needle.bytes, in: stack.data)
            #expect(holding.isEmpty, "\(needle.what) is still in \(holding)")
        }
        #expect(!(try Self.files(holding: Array(keptNote.utf8), in: stack.data)).isEmpty, "the other person's notes are kept")
        #expect(!(try Self.files(holding: Array(kept.utf8), in: stack.data)).isEmpty, "the other person's data is kept")
    }

    /// A backup taken before an account's deletion still holds the person; restored, the
    /// stack holds them again until `canopy erasures apply` deletes them once more, from every
    /// store and the photos, leaving the other person's data.
    @Test func anErasureIsAppliedAgainToStoresRestoredFromAnOlderBackup() async throws {
        let environment = ["CANOPY_ERASURE_SECOND_PASS": "1"]
        let stack = try await Stack.start(environment: environment)
        let backup = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-erasure-backup-\(UUID().uuidString)").path
        defer {
            try? FileManager.default.removeItem(atPath: stack.data)
            try? FileManager.default.removeItem(atPath: backup)
            try? FileManager.default.removeItem(atPath: backup + ".erasures")
        }
        let tag = UUID().uuidString.prefix(8).lowercased()
        let (erased, kept) = ("restored-erased-\(tag)", "restored-kept-\(tag)")
        let (erasedNote, keptNote) = ("restored-erased-notes-\(tag)", "restored-kept-notes-\(tag)")
        var photo = ""
        do {
            for (person, note, seed) in [(erased, erasedNote, 11), (kept, keptNote, 12)] {
                let token = try await stack.token(person)
                let added = try await stack.send(.POST, "/v1/plants", token: token, json: #"{"scientificName":"Ficus lyrata","notes":"\#(note)"}"#)
                #expect(added.status == 201, "\(added.text)")
                let plant = try #require(added.object["id"] as? String)
                let upload = try await stack.send(
                    .POST, "/v1/plants/\(plant)/photos", token: token, body: try SyntheticPlant.species(1).photo(seed: seed), type: "image/jpeg")
                #expect(upload.status == 201, "\(upload.text)")
                if person == erased { photo = try #require(upload.object["photoID"] as? String) }
            }
            let backedUp = try await runExecutable("canopy", ["backup", backup, "--data-dir", stack.data], limit: 120)
            #expect(backedUp.status == 0, "\(backedUp.output) \(backedUp.errors)")
            #expect(try await stack.send(.DELETE, "/v1/account", token: try await stack.token(erased)).status == 204)
            #expect(try await eventually(within: .seconds(60), every: .milliseconds(250)) { try JourneyTests.mentions(of: erased, in: stack.data).isEmpty })
            // What a restore of canopy-api's store would lose, kept aside first.
            let listed = try await runExecutable("canopy", ["erasures", "list", "--digests", "--data-dir", stack.data])
            #expect(listed.status == 0 && listed.output.split(separator: "\n").count == 1, "\(listed.output) \(listed.errors)")
            try Data(listed.output.utf8).write(to: URL(fileURLWithPath: backup + ".erasures"))
        } catch {
            await stack.stop()
            throw error
        }
        await stack.stop()

        // Restored into a new data directory (canopy-api's store too: its erasures are lost),
        // with the stack's token key.
        let restoredData = backup + ".restored"
        defer { try? FileManager.default.removeItem(atPath: restoredData) }
        let restoring = try await runExecutable(
            "canopy", ["restore", backup, "--data-dir", restoredData, "--token-key-file", stack.data + "/token.key"], limit: 120)
        #expect(restoring.status == 0, "\(restoring.output) \(restoring.errors)")
        #expect(!(try JourneyTests.mentions(of: erased, in: restoredData)).isEmpty, "the backup holds the person again")
        let restored = Stack(data: restoredData, endpoint: stack.endpoint, http: stack.http, metricsBase: stack.metricsBase)

        try await restored.restart(environment: environment)
        do {
            let lost = try await runExecutable("canopy", ["erasures", "list", "--data-dir", restored.data])
            #expect(lost.output.contains("no account was deleted"), "the restored canopy-api store predates the deletion: \(lost.output)")
            let applied = try await runExecutable(
                "canopy",
                [
                    "erasures", "apply", "--digests-file", backup + ".erasures", "--data-dir", restored.data,
                    "--broker", restored.endpoint,
                ], limit: 60)
            #expect(applied.status == 0 && applied.output.contains("1 account deleted again"), "\(applied.output) \(applied.errors)")
            #expect(!applied.output.contains(erased))
            #expect(
                try await eventually(within: .seconds(60), every: .milliseconds(250)) { try JourneyTests.mentions(of: erased, in: restored.data).isEmpty },
                "still named: \((try? JourneyTests.mentions(of: erased, in: restored.data)) ?? [])")
            // The erasure is recorded again, and applying it again finds nobody.
            let recorded = try await runExecutable("canopy", ["erasures", "list", "--data-dir", restored.data])
            #expect(recorded.output.contains("1 account deleted"), "\(recorded.output)")
            let again = try await runExecutable("canopy", ["erasures", "apply", "--data-dir", restored.data, "--broker", restored.endpoint], limit: 60)
            #expect(again.status == 0 && again.output.contains("nothing to do"), "\(again.output) \(again.errors)")
            try await Task.sleep(for: .seconds(1)) // the checkpointers' next tick
        } catch {
            await restored.stop()
            throw error
        }
        await restored.stop()
        for needle in [erased, erasedNote, photo] {
            let holding = try Self.files(holding: Array(needle.utf8), in: restored.data)
            #expect(holding.isEmpty, "\(needle) is still in \(holding)")
        }
        #expect(!(try Self.files(holding: Array(keptNote.utf8), in: restored.data)).isEmpty, "the other person's notes are kept")
    }
}
