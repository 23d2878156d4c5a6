import CanopyImaging
import CanopySamples
import CanopyServiceKit
import CanopyTesting
import Foundation
import GRDB
import Testing

/// `canopy backup` as an operator runs it: a running stack's stores copied, and a stack run
/// from the copy. Part of ``CanopyUpTests``, whose tests run one at a time: their stacks of
/// six processes each would otherwise share the machine's cores at once.
extension CanopyUpTests {
    /// A stack of real processes (`canopy up --detach`) on ports of its own.
    struct BackupStack {
        let data: String
        let endpoint = "tcp://127.0.0.1:\(FreePorts.any())"

        /// Its `canopy up` output (the status table).
        let started: ProcessResult

        init(data: String, _ more: [String] = []) async throws {
            self.data = data
            started = try await runExecutable(
                "canopy",
                [
                    "up", "--detach", "--data-dir", data, "--broker", endpoint, "--http", "127.0.0.1:\(FreePorts.any())",
                    "--metrics-base", "\(FreePorts.run(of: 12))",
                ] + more, limit: 240)
            #expect(started.status == 0, "canopy up: \(started.output) \(started.errors)")
        }

        func down() async {
            _ = try? await runExecutable("canopy", ["down", "--data-dir", data], limit: 120)
        }

        /// A bus call as `canopy send` makes it, for alice; its JSON reply.
        func send(_ service: String, _ operation: String, _ json: String, attach: [String] = []) async throws -> Any? {
            let sent = try await runExecutable(
                "canopy",
                ["send", service, operation, "--principal", "alice", "--json", json, "--broker", endpoint, "--data-dir", data]
                    + attach.flatMap { ["--attach", $0] })
            #expect(sent.status == 0, "canopy send \(service) \(operation): \(sent.errors)")
            return try? JSONSerialization.jsonObject(with: Data(sent.output.utf8))
        }
    }

    @Test func aRunningStackIsBackedUpAndRestoredAndAStackRunsFromIt() async throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-backup-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: root) }
        let (data, backup, later) = (
            root.appendingPathComponent("data").path, root.appendingPathComponent("backup").path, root.appendingPathComponent("later").path
        )
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        var photos: [String] = []
        for seed in 1...2 {
            let file = root.appendingPathComponent("photo-\(seed).jpg").path
            try Data(try SyntheticPlant.species(seed).photo(seed: seed)).write(to: URL(fileURLWithPath: file))
            photos.append(file)
        }

        // A plant with two photos, then a backup while the stack runs.
        let stack = try await BackupStack(data: data)
        var shas: [String] = []
        do {
            let plant = try #require(
                (try await stack.send("care", "plants.add", #"{"scientificName":"Monstera deliciosa","customName":"Kept"}"#) as? [String: Any])?["id"]
                    as? String)
            for photo in photos {
                shas.append(
                    try #require(
                        (try await stack.send("images", "images.put", #"{"plantID":"\#(plant)"}"#, attach: [photo]) as? [String: Any])?["sha256"] as? String))
            }
            let backedUp = try await runExecutable("canopy", ["backup", backup, "--data-dir", data], limit: 60)
            #expect(backedUp.status == 0, "\(backedUp.errors)")
            for store in [
                "images/images.sqlite", "care/care.sqlite", "identify/identify.sqlite", "remind/remind.sqlite", "api/api.sqlite", "images/originals: 2 photos",
            ] {
                #expect(backedUp.output.contains(store), "the table names \(store): \(backedUp.output)")
            }
            let mode = try FileManager.default.attributesOfItem(atPath: backup)[.posixPermissions] as? Int
            #expect(mode == 0o700, "people's data: readable by its owner only")
            let again = try await runExecutable("canopy", ["backup", backup, "--data-dir", data])
            #expect(again.status != 0 && again.errors.contains("is not empty"), "\(again.errors)")
            let file = root.appendingPathComponent("photo-1.jpg").path
            let onAFile = try await runExecutable("canopy", ["backup", file, "--data-dir", data])
            #expect(onAFile.status != 0 && onAFile.errors.contains("is a file; name a new directory"), "\(onAFile.errors)")
        } catch {
            await stack.down()
            throw error
        }
        await stack.down()

        // A photo whose file is gone while its row stays (removed by hand from the stopped
        // stack): the backup leaves it out, row and all.
        try FileManager.default.removeItem(atPath: "\(data)/images/originals/\(shas[1])")
        let partial = try await runExecutable("canopy", ["backup", later, "--data-dir", data], limit: 60)
        #expect(partial.status == 0 && partial.errors.contains("1 photos the images store named had no file"), "\(partial.output) \(partial.errors)")
        #expect(partial.output.contains("as it lies"), "a stopped stack is not held: \(partial.output)")
        let kept = try await DatabaseQueue(path: "\(later)/images/images.sqlite").read { db in try String.fetchAll(db, sql: "SELECT sha256 FROM photos") }
        #expect(kept == [shas[0]])

        // Restored into a new data directory, a stack has the plant and both photos, bytes and all.
        let restoredData = root.appendingPathComponent("restored").path
        let restoring = try await runExecutable("canopy", ["restore", backup, "--data-dir", restoredData, "--new-token-key"], limit: 60)
        #expect(restoring.status == 0 && restoring.output.contains("images/originals (2 photos)"), "\(restoring.output) \(restoring.errors)")
        #expect(
            FileManager.default.contents(atPath: "\(restoredData)/install-id") == FileManager.default.contents(atPath: "\(data)/install-id"), "the same install"
        )
        let restored = try await BackupStack(data: restoredData)
        do {
            let plants = (try await restored.send("care", "plants.list", "{}") as? [String: Any])?["plants"] as? [[String: Any]] ?? []
            #expect(plants.map { $0["customName"] as? String } == ["Kept"], "\(plants)")
            let plant = try #require(plants.first?["id"] as? String)
            let listed = try await restored.send("images", "images.list", #"{"plantID":"\#(plant)"}"#) as? [[String: Any]] ?? []
            #expect(Set(listed.compactMap { $0["sha256"] as? String }) == Set(shas), "\(listed)")
            let thumbnail = try await restored.send("images", "images.variant", #"{"sha256":"\#(shas[1])","variant":"thumbnail"}"#) as? [String: Any] ?? [:]
            #expect(thumbnail["width"] as? Int ?? 0 > 0, "\(thumbnail)")
        } catch {
            await restored.down()
            throw error
        }
        await restored.down()

        // A backup made before canopy-batch was named canopy-api lists its store as
        // batch/batch.sqlite: restored as api/api.sqlite; and a data directory that still has
        // it there is backed up whole.
        let old = root.appendingPathComponent("before-the-rename").path
        try FileManager.default.copyItem(atPath: later, toPath: old)
        try FileManager.default.createDirectory(atPath: "\(old)/batch", withIntermediateDirectories: true)
        try FileManager.default.moveItem(atPath: "\(old)/api/api.sqlite", toPath: "\(old)/batch/batch.sqlite")
        try FileManager.default.removeItem(atPath: "\(old)/api")
        let manifest = try #require(FileManager.default.contents(atPath: "\(old)/backup.json"))
        try Data(
            String(decoding: manifest, as: UTF8.self).replacingOccurrences(of: "api\\/api.sqlite", with: "batch\\/batch.sqlite")
                .replacingOccurrences(of: "api/api.sqlite", with: "batch/batch.sqlite").utf8
        ).write(to: URL(fileURLWithPath: "\(old)/backup.json"))
        #expect(String(decoding: try #require(FileManager.default.contents(atPath: "\(old)/backup.json")), as: UTF8.self).contains("batch"))
        let oldData = root.appendingPathComponent("restored-old").path
        let fromOld = try await runExecutable("canopy", ["restore", old, "--data-dir", oldData, "--new-token-key"], limit: 60)
        #expect(fromOld.status == 0, "\(fromOld.output) \(fromOld.errors)")
        #expect(FileManager.default.fileExists(atPath: "\(oldData)/api/api.sqlite") && !FileManager.default.fileExists(atPath: "\(oldData)/batch"))
        try FileManager.default.createDirectory(atPath: "\(oldData)/batch", withIntermediateDirectories: true)
        try FileManager.default.moveItem(atPath: "\(oldData)/api/api.sqlite", toPath: "\(oldData)/batch/batch.sqlite")
        let again = root.appendingPathComponent("backup-of-old").path
        let backingOld = try await runExecutable("canopy", ["backup", again, "--data-dir", oldData], limit: 60)
        #expect(backingOld.status == 0, "\(backingOld.output) \(backingOld.errors)")
        #expect(FileManager.default.fileExists(atPath: "\(again)/api/api.sqlite"), "canopy-api's store is in the backup under its present name")
    }
}
