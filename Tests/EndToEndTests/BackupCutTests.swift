import CanopyServiceKit
import CanopyTesting
import Foundation
import GRDB
import Synchronization
import Testing

/// `canopy backup` while a person keeps adding plants with `Idempotency-Key`s is one cut:
/// every answer canopy-api kept for a key names a plant canopy-care's copy has, every store
/// passes SQLite's integrity check; `canopy restore` makes a data directory of it that a stack
/// runs from, and a retry of a kept key there answers the kept plant, which exists. Part of
/// ``ErasureTests`` (their stacks run one at a time).
extension ErasureTests {
    /// The writers' state, shared with their tasks.
    final class Load: Sendable {
        let writing = Atomic(true)
        let added = Atomic(0)
    }

    @Test func aBackupUnderWriteLoadIsOneCutAndARestoredStackServesIt() async throws {
        let stack = try await Stack.start()
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-backup-cut-\(UUID().uuidString)").path
        let (backup, restoredData) = (root + "/backup", root + "/restored")
        defer {
            try? FileManager.default.removeItem(atPath: stack.data)
            try? FileManager.default.removeItem(atPath: root)
        }
        let token = try await stack.token("writer")
        let load = Load()
        do {
            // Two connections adding plants, each with a key, until the backup is done.
            let writers = (0..<2).map { lane in
                Task {
                    var index = 0
                    while load.writing.load(ordering: .relaxed) {
                        index += 1
                        let answer = try await stack.send(
                            .POST, "/v1/plants", token: token, json: #"{"scientificName":"Ficus lyrata","customName":"load \#(lane)-\#(index)"}"#,
                            headers: [("Idempotency-Key", "load-\(lane)-\(index)")])
                        if answer.status == 201 { load.added.add(1, ordering: .relaxed) }
                    }
                }
            }
            // Under way, however loaded the machine: a few dozen plants in before the backup.
            #expect(try await eventually(within: .seconds(120), every: .milliseconds(100)) { load.added.load(ordering: .relaxed) >= 30 })
            let backedUp = try await runExecutable("canopy", ["backup", backup, "--data-dir", stack.data], limit: 120)
            load.writing.store(false, ordering: .relaxed)
            for writer in writers { try await writer.value }
            #expect(backedUp.status == 0, "\(backedUp.output) \(backedUp.errors)")
            #expect(backedUp.output.contains("at one cut (requests held"), "\(backedUp.output)")
        } catch {
            await stack.stop()
            throw error
        }
        await stack.stop()
        #expect(load.added.load(ordering: .relaxed) >= 30, "the load ran: \(load.added.load(ordering: .relaxed)) plants")

        // Every store whole; every kept answer's plant in canopy-care's copy.
        for store in ["care/care.sqlite", "images/images.sqlite", "identify/identify.sqlite", "remind/remind.sqlite", "api/api.sqlite"] {
            let queue = try DatabaseQueue(path: "\(backup)/\(store)")
            #expect(try await queue.read { db in try String.fetchAll(db, sql: "PRAGMA integrity_check") } == ["ok"], "\(store)")
            try queue.close()
        }
        let answers = try await DatabaseQueue(path: "\(backup)/api/api.sqlite").read { db in
            try Row.fetchAll(db, sql: "SELECT key, body FROM idempotencyKeys WHERE answered = 1 AND status = 201").map { row -> (String, String) in
                let body: Data = row["body"]
                return (row["key"], (try JSONSerialization.jsonObject(with: body) as? [String: Any])?["id"] as? String ?? "")
            }
        }
        let plants = Set(try await DatabaseQueue(path: "\(backup)/care/care.sqlite").read { db in try String.fetchAll(db, sql: "SELECT id FROM plants") })
        #expect(answers.count >= 30, "answers kept at the cut: \(answers.count)")
        let orphans = answers.filter { !plants.contains($0.1) }
        #expect(orphans.isEmpty, "kept answers whose plant the backup lacks: \(orphans.prefix(5))")

        // Restored into a new data directory (with the token key), a stack serves it: every
        // plant, and a kept key's retry answers the kept plant.
        let refused = try await runExecutable("canopy", ["restore", backup, "--data-dir", stack.data, "--new-token-key"])
        #expect(refused.status != 0 && refused.errors.contains("is not empty"), "\(refused.errors)")
        let notABackup = try await runExecutable("canopy", ["restore", root, "--data-dir", restoredData, "--new-token-key"])
        #expect(notABackup.status != 0 && notABackup.errors.contains("is not a backup made by canopy backup"), "\(notABackup.errors)")
        let restored = try await runExecutable(
            "canopy", ["restore", backup, "--data-dir", restoredData, "--token-key-file", stack.data + "/token.key"], limit: 120)
        #expect(restored.status == 0, "\(restored.output) \(restored.errors)")
        let again = Stack(
            data: restoredData, endpoint: "tcp://127.0.0.1:\(FreePorts.any())", http: "127.0.0.1:\(FreePorts.any())", metricsBase: FreePorts.run(of: 16))
        try await again.restart()
        do {
            let listed = try await again.send(.GET, "/v1/plants?limit=1", token: token)
            #expect(listed.status == 200 && listed.object["total"] as? Int == plants.count, "\(listed.text)")
            let (key, plant) = try #require(answers.first)
            let parts = key.split(separator: "-")
            let retried = try await again.send(
                .POST, "/v1/plants", token: token, json: #"{"scientificName":"Ficus lyrata","customName":"load \#(parts[1])-\#(parts[2])"}"#,
                headers: [("Idempotency-Key", key)])
            #expect(retried.status == 201 && retried.headers["idempotent-replayed"] == "true" && retried.object["id"] as? String == plant, "\(retried.text)")
            #expect(try await again.send(.GET, "/v1/plants/\(plant)", token: token).status == 200)
        } catch {
            await again.stop()
            throw error
        }
        await again.stop()
    }
}
