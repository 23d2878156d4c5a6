import CanopySamples
import CanopyServiceKit
import CanopyStore
import CanopyTesting
import Foundation
import GRDB
import Glibc
import Testing

/// `canopy migrate` never loses data: a database another install filled is refused and left
/// as it was (no table, no row, no photo touched); a source that is not Canopy's is refused
/// with a sentence before anything is written; a migrate killed at any point finishes when
/// run again, without duplicates. Part of ``CanopyUpTests`` (its stacks run one at a time).
extension CanopyUpTests {
    /// A stopped single-host install in `data`: one plant named `name` with a photo, for alice.
    static func install(_ data: String, plant name: String, photo seed: Int, root: TemporaryDirectory) async throws -> String {
        let photo = root.path("photo-\(seed).jpg")
        try Data(try SyntheticPlant.species(seed % 3).photo(seed: seed)).write(to: URL(fileURLWithPath: photo))
        let stack = try await BackupStack(data: data)
        do {
            let plant = try #require(
                (try await stack.send("care", "plants.add", #"{"scientificName":"Monstera deliciosa","customName":"\#(name)"}"#) as? [String: Any])?["id"]
                    as? String)
            let sha = try #require(
                (try await stack.send("images", "images.put", #"{"plantID":"\#(plant)"}"#, attach: [photo]) as? [String: Any])?["sha256"] as? String)
            await stack.down()
            return sha
        } catch {
            await stack.down()
            throw error
        }
    }

    /// A new database on the test server, as `canopy migrate --to` takes it: the URL without
    /// its password, and the password in a file (`--database-password-file`).
    static func target(in root: TemporaryDirectory) async throws -> (url: DatabaseURL, arguments: [String]) {
        let url = try await PostgresServer.shared().database()
        let file = root.path("db-password-\(url.database)")
        try Data((url.password ?? "").utf8).write(to: URL(fileURLWithPath: file))
        var bare = url
        bare.password = nil
        return (url, ["--to", bare.description, "--database-password-file", file])
    }

    @Test func migrateRefusesADatabaseAnotherInstallFilledAndChangesNothing() async throws {
        let root = try TemporaryDirectory("canopy-migrate-foreign")
        defer { root.remove() }
        let (first, second, photos) = (root.path("first"), root.path("second"), root.path("photos"))
        _ = try await Self.install(first, plant: "First's", photo: 1, root: root)
        let secondPhoto = try await Self.install(second, plant: "Second's", photo: 2, root: root)
        let (url, to) = try await Self.target(in: root)

        let moved = try await runExecutable("canopy", ["migrate", "--from", first, "--originals-dir", photos] + to, limit: 120)
        #expect(moved.status == 0, "\(moved.output) \(moved.errors)")
        let photosBefore = try FileManager.default.contentsOfDirectory(atPath: photos).sorted()

        // Another install into the same database: refused, naming it; nothing changed there.
        let refused = try await runExecutable("canopy", ["migrate", "--from", second, "--originals-dir", photos] + to, limit: 120)
        #expect(refused.status != 0, "\(refused.output)")
        #expect(refused.errors.contains("migrated from another install") && refused.errors.contains("nothing was migrated"), "\(refused.errors)")
        #expect(try await PostgresServer.query(url, "SELECT 1 FROM plants WHERE customName = 'First''s'") == 1, "the first install's plant is kept")
        #expect(try await PostgresServer.query(url, "SELECT 1 FROM plants WHERE customName = 'Second''s'") == 0)
        #expect(try FileManager.default.contentsOfDirectory(atPath: photos).sorted() == photosBefore, "no photo of the second install copied")
        #expect(!FileManager.default.fileExists(atPath: "\(photos)/\(secondPhoto)"))

        // The first install again: its own, unchanged, so nothing to do.
        let again = try await runExecutable("canopy", ["migrate", "--from", first, "--originals-dir", photos] + to, limit: 120)
        #expect(again.status == 0 && again.output.contains("already there") && !again.output.contains("copied, checked"), "\(again.output) \(again.errors)")
    }

    @Test func aSourceThatIsNotCanopysIsRefusedWithASentenceAndTheTargetStaysEmpty() async throws {
        let root = try TemporaryDirectory("canopy-migrate-source")
        defer { root.remove() }
        let data = root.path("data")
        try FileManager.default.createDirectory(atPath: "\(data)/care", withIntermediateDirectories: true)
        let care = "\(data)/care/care.sqlite"
        // Another program's database where canopy-care's store belongs.
        let other = try DatabaseQueue(path: care)
        try await other.write { db in try db.execute(sql: "CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)") }
        try other.close()
        let (url, to) = try await Self.target(in: root)
        let foreign = try await runExecutable("canopy", ["migrate", "--from", data] + to, limit: 60)
        #expect(foreign.status != 0, "\(foreign.output)")
        #expect(
            foreign.errors.contains("\(care) is an SQLite database but not canopy-care's store") && foreign.errors.contains("it has no table plants"),
            "\(foreign.errors)")
        #expect(!foreign.errors.contains("SQLite error"), "\(foreign.errors)")
        // A file that is not SQLite at all.
        try Data("this is not a database, it is a shopping list\n".utf8).write(to: URL(fileURLWithPath: care))
        let garbage = try await runExecutable("canopy", ["migrate", "--from", data] + to, limit: 60)
        #expect(garbage.status != 0 && garbage.errors.contains("\(care) is not an SQLite database"), "\(garbage.errors)")
        #expect(!garbage.errors.contains("SQLite error"), "\(garbage.errors)")
        // Nothing was made in the target: not even the migrations' table.
        #expect(try await PostgresServer.query(url, "SELECT 1 FROM information_schema.tables WHERE table_schema = 'public'") == 0)
    }

    @Test func aMigrateKilledAtAnyPointFinishesWhenRunAgain() async throws {
        let root = try TemporaryDirectory("canopy-migrate-killed")
        defer { root.remove() }
        let (data, photos) = (root.path("data"), root.path("photos"))
        let sha = try await Self.install(data, plant: "Kept once", photo: 4, root: root)
        let (url, to) = try await Self.target(in: root)
        let arguments = ["migrate", "--from", data, "--originals-dir", photos] + to

        // Killed (SIGKILL) as each store's import begins, one run after the other.
        for stage in ["moving care", "moving remind", "moving identify", "moving images", "moving api"] {
            let killed = try await Self.run(arguments, killingWhenItSays: stage)
            #expect(killed, "the migrate said '\(stage)' before it ended")
        }
        let finished = try await runExecutable("canopy", arguments, limit: 120)
        #expect(finished.status == 0, "\(finished.output) \(finished.errors)")
        #expect(FileManager.default.fileExists(atPath: "\(photos)/\(sha)"))
        let again = try await runExecutable("canopy", arguments, limit: 120)
        #expect(again.status == 0 && !again.output.contains("copied, checked") && again.output.contains("photos: 0 copied"), "\(again.output) \(again.errors)")
        #expect(try await PostgresServer.query(url, "SELECT 1 FROM plants") == 1, "one plant, not one a run")
        #expect(try await PostgresServer.query(url, "SELECT 1 FROM photos") == 1)
    }

    /// Runs `canopy ARGUMENTS` and kills it (SIGKILL) the moment its standard error has
    /// `text`; whether it was killed so (false: it ended first).
    static func run(_ arguments: [String], killingWhenItSays text: String) async throws -> Bool {
        let process = Process()
        process.executableURL = try LiveBus.executable("canopy")
        process.arguments = arguments
        let errors = Pipe()
        process.standardError = errors
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        let reader = errors.fileHandleForReading
        let pid = process.processIdentifier
        // Read on a thread of its own until the pipe closes (the process ended, or was killed).
        let killed = try await offThePool { () -> Bool in
            var said = "", killed = false
            while case let chunk = reader.availableData, !chunk.isEmpty { // what is there, as soon as it is
                said += String(decoding: chunk, as: UTF8.self)
                if !killed, said.contains(text) {
                    kill(pid, SIGKILL)
                    killed = true
                }
            }
            return killed
        }
        try await offThePool { process.waitUntilExit() }
        return killed && process.terminationReason == .uncaughtSignal
    }
}

extension CanopyUpTests {
    /// A stack on PostgreSQL backed up at one cut (pg_dump from the snapshot exported at the
    /// cut, the originals linked at it) and restored into an empty database and photo
    /// directory, as the operations docs say; a stack runs from the restore.
    @Test func aStackOnPostgreSQLIsBackedUpAndRestoredAsTheDocsSay() async throws {
        let root = try TemporaryDirectory("canopy-pg-backup")
        defer { root.remove() }
        let (url, to) = try await Self.target(in: root)
        let database = ["--database-url", to[1], "--database-password-file", to[3]]
        let (photos, backup) = (root.path("photos"), root.path("backup"))
        let photo = root.path("photo.jpg")
        try Data(try SyntheticPlant.species(1).photo(seed: 9)).write(to: URL(fileURLWithPath: photo))

        let stack = try await BackupStack(data: root.path("data"), database + ["--originals-dir", photos])
        let sha: String
        do {
            let plant = try #require(
                (try await stack.send("care", "plants.add", #"{"scientificName":"Monstera deliciosa","customName":"Dumped"}"#) as? [String: Any])?["id"]
                    as? String)
            sha = try #require(
                (try await stack.send("images", "images.put", #"{"plantID":"\#(plant)"}"#, attach: [photo]) as? [String: Any])?["sha256"] as? String)
            let backedUp = try await runExecutable("canopy", ["backup", backup, "--data-dir", stack.data, "--originals-dir", photos] + database, limit: 120)
            #expect(backedUp.status == 0 && backedUp.output.contains("at one cut"), "\(backedUp.output) \(backedUp.errors)")
        } catch {
            await stack.down()
            throw error
        }
        await stack.down()
        #expect(FileManager.default.fileExists(atPath: "\(backup)/database.dump"))
        #expect(FileManager.default.fileExists(atPath: "\(backup)/images/originals/\(sha)"))

        // Into an empty database and photo directory; a second time into the same is refused.
        let (restoredURL, restoredTo) = try await Self.target(in: root)
        let restoredDatabase = ["--database-url", restoredTo[1], "--database-password-file", restoredTo[3]]
        let restoredPhotos = root.path("photos-restored")
        let restored = try await runExecutable("canopy", ["restore", backup, "--originals-dir", restoredPhotos] + restoredDatabase, limit: 120)
        #expect(restored.status == 0, "\(restored.output) \(restored.errors)")
        let twice = try await runExecutable("canopy", ["restore", backup, "--originals-dir", root.path("elsewhere")] + restoredDatabase, limit: 60)
        #expect(twice.status != 0 && twice.errors.contains("is not empty"), "\(twice.errors)")
        #expect(try await PostgresServer.query(restoredURL, "SELECT 1 FROM plants WHERE customName = 'Dumped'") == 1)
        #expect(try await PostgresServer.query(url, "SELECT 1 FROM plants") == 1, "the source is untouched")

        let again = try await BackupStack(data: root.path("data-restored"), restoredDatabase + ["--originals-dir", restoredPhotos])
        do {
            let plants = (try await again.send("care", "plants.list", "{}") as? [String: Any])?["plants"] as? [[String: Any]] ?? []
            #expect(plants.map { $0["customName"] as? String } == ["Dumped"], "\(plants)")
            let thumbnail = try await again.send("images", "images.variant", #"{"sha256":"\#(sha)","variant":"thumbnail"}"#) as? [String: Any] ?? [:]
            #expect(thumbnail["width"] as? Int ?? 0 > 0, "\(thumbnail)")
        } catch {
            await again.down()
            throw error
        }
        await again.down()
    }
}
