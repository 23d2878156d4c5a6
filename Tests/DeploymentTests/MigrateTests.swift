import CanopySamples
import CanopyStore
import CanopyTesting
import Foundation
import Testing

/// `canopy migrate` as an operator runs it: a single-host install moved into PostgreSQL and a
/// shared photo store, checked, safe to run again, and a replicated stack run from it. Part of
/// ``CanopyUpTests`` (its stacks run one at a time).
extension CanopyUpTests {
    @Test func aSingleHostInstallMovesIntoPostgreSQLAndAReplicatedStackRunsFromIt() async throws {
        let root = try TemporaryDirectory("canopy-migrate")
        defer { root.remove() }
        let (data, replicated, shared) = (root.path("data"), root.path("replicated"), root.path("photos"))
        let photo = root.path("photo.jpg")
        try Data(try SyntheticPlant.species(3).photo(seed: 3)).write(to: URL(fileURLWithPath: photo))

        // A single-host install with a plant and its photo, then stopped.
        let single = try await BackupStack(data: data)
        let sha: String
        do {
            let plant = try #require(
                (try await single.send("care", "plants.add", #"{"scientificName":"Monstera deliciosa","customName":"Moved"}"#) as? [String: Any])?["id"]
                    as? String)
            sha = try #require(
                (try await single.send("images", "images.put", #"{"plantID":"\#(plant)"}"#, attach: [photo]) as? [String: Any])?["sha256"] as? String)
        } catch {
            await single.down()
            throw error
        }
        await single.down()

        // Into PostgreSQL, the password from a file as compose secrets mount it.
        var url = try await PostgresServer.shared().database()
        let passwordFile = root.path("db-password")
        try Data((url.password ?? "").utf8).write(to: URL(fileURLWithPath: passwordFile))
        url.password = nil
        let arguments = ["migrate", "--from", data, "--to", url.description, "--database-password-file", passwordFile, "--originals-dir", shared]
        let moved = try await runExecutable("canopy", arguments, limit: 120)
        #expect(moved.status == 0, "\(moved.output) \(moved.errors)")
        let rows = moved.output.split(separator: "\n").map { $0.split(separator: " ", omittingEmptySubsequences: true).map(String.init) }
        #expect(rows.contains { $0.prefix(3) == ["care", "plants", "1"] && $0.suffix(2) == ["copied,", "checked"] }, "\(moved.output)")
        #expect(rows.contains { $0.prefix(3) == ["images", "photos", "1"] }, "\(moved.output)")
        #expect(moved.output.contains("photos: 1 copied"), "\(moved.output)")
        #expect(FileManager.default.fileExists(atPath: "\(shared)/\(sha)"))
        // Again: nothing to do.
        let again = try await runExecutable("canopy", arguments, limit: 120)
        #expect(again.status == 0 && again.output.contains("already there") && !again.output.contains("copied, checked"), "\(again.output) \(again.errors)")
        #expect(again.output.contains("photos: 0 copied") && again.output.contains("1 already in"), "\(again.output)")

        // A stack with two replicas of care and images runs from it: the plant and the photo.
        let stack = try await BackupStack(
            data: replicated,
            [
                "--database-url", url.description, "--database-password-file", passwordFile,
                "--originals-dir", shared, "--replicas", "care=2,images=2",
            ])
        do {
            let names = Self.rows(stack.started.output).map(\.name)
            #expect(names.contains("care-2") && names.contains("images-2"), "\(stack.started.output)")
            let plants = (try await stack.send("care", "plants.list", "{}") as? [String: Any])?["plants"] as? [[String: Any]] ?? []
            #expect(plants.map { $0["customName"] as? String } == ["Moved"], "\(plants)")
            let plant = try #require(plants.first?["id"] as? String)
            for _ in 0..<2 { // whichever replica answers
                let listed = try await stack.send("images", "images.list", #"{"plantID":"\#(plant)"}"#) as? [[String: Any]] ?? []
                #expect(listed.compactMap { $0["sha256"] as? String } == [sha])
                let thumbnail = try await stack.send("images", "images.variant", #"{"sha256":"\#(sha)","variant":"thumbnail"}"#) as? [String: Any] ?? [:]
                #expect(thumbnail["width"] as? Int ?? 0 > 0, "\(thumbnail)")
            }
            // What the stack wrote since makes the import stand: migrating again is refused.
            _ = try await stack.send("care", "plants.add", #"{"scientificName":"Ficus lyrata"}"#)
            let refused = try await runExecutable("canopy", arguments, limit: 120)
            #expect(refused.status != 0 && refused.errors.contains("changed since"), "\(refused.output) \(refused.errors)")
        } catch {
            await stack.down()
            throw error
        }
        await stack.down()
    }
}
