import ArgumentParser
import CanopyDeployment
import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation
import GRDB

/// `canopy backup DIR`: every store of a stack copied at one cut while it runs.
struct Backup: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Back up every store of a stack at one moment while it runs: the stores agree with each other, and the photos' originals with them.",
        discussion: """
            The backup is one cut across the stores, as a capture's snapshot is: each store is
            opened and the originals hard-linked first; then the broker (each, with several)
            holds new requests until those in the air are answered, a read transaction is begun
            on every store and the newest originals are linked (milliseconds), and the requests
            go on; each store is then copied through its transaction, so every store is as it
            was at the cut, however long copying takes. No answer kept for an idempotency key
            names a plant the copy lacks, no follow-up a deleted plant. A stopped stack is copied
            as it lies. Originals the copied images store does not name are left out. DIR is new
            (or empty), readable by its owner only; canopy restore DIR --data-dir NEW makes a
            data directory of it. The token signing key is a secret and is not copied.
            With PostgreSQL (--database-url), the database is dumped with pg_dump from a
            snapshot exported at the cut, and the originals of --originals-dir linked at it.
            Examples:
              canopy backup ./backups/2026-11-25 --data-dir ./.canopy
              canopy backup ./backups/2026-11-25 --database-url postgres://canopy@db:5432/canopy --originals-dir /mnt/photos
            """)

    @Argument(help: "The new directory the backup goes to.") var directory: String
    @OptionGroup var stack: StackOptions
    @OptionGroup var database: DatabaseOptions
    @Option(
        help: ArgumentHelp(
            "Where the photos' originals are, with --database-url (the directory every canopy-images replica mounts). Env: CANOPY_ORIGINALS_DIR.",
            valueName: "dir"))
    var originalsDir: String? = Environment.string("CANOPY_ORIGINALS_DIR")
    @Option(help: "How long the broker may hold requests while the stores are pinned, in milliseconds (1 to 60000).") var holdMs = 10_000
    @Option(
        name: .customLong("broker"),
        help: ArgumentHelp(
            "A broker of the stack to hold for the cut (repeat for several), for a stack canopy up does not run from --data-dir (compose, several hosts); default: the brokers of the stack canopy up runs from --data-dir.",
            valueName: "endpoint"))
    var brokers: [String] = []

    func validate() throws {
        guard (1...60_000).contains(holdMs) else { throw ValidationError("--hold-ms is 1 to 60000") }
    }

    func run() async throws {
        let source = stack.layout.dataDirectory
        let target = URL(fileURLWithPath: directory, isDirectory: true).standardizedFileURL
        guard target.path != source.path else { throw ValidationError("the backup goes to a directory of its own, not the data directory itself") }
        try Self.refuseNonEmpty(target, what: "the backup")
        if let postgres = try database.postgres() {
            return try await PostgresBackup(
                url: postgres.url, originals: originalsDir.map { URL(fileURLWithPath: $0, isDirectory: true) }, stack: stack,
                brokers: brokers, holdMilliseconds: holdMs
            ).run(into: target)
        }
        guard !Migrate.sqliteStores(in: source).isEmpty else {
            throw CommandFailure("no stores in \(source.path); name the stack's data directory with --data-dir (canopy status shows it)")
        }
        try Self.checkStores(in: source)
        if FileManager.default.fileExists(atPath: target.path) {
            try FileManager.default.setAttributes([.posixPermissions: 0o700], ofItemAtPath: target.path) // an empty directory (a mount point) is used as it is
        }
        var pinned = try StackSnapshot.prepare(data: source, into: target, orEmpty: true)
        let held: Double?
        var cutAt = Date()
        do {
            held = try await StackCut.hold(stack: stack, brokers: brokers, holdMilliseconds: holdMs) {
                try pinned.pin()
                cutAt = Date()
            }
        } catch {
            pinned.close()
            Self.empty(target)
            throw error
        }
        do {
            let install = try InstallID.ensure(in: source)
            var table = try StackSnapshot.finish(pinned, manifest: nil as Manifest?, pseudonyms: nil)
            try Data((install + "\n").utf8).write(to: target.appendingPathComponent(InstallID.fileName))
            try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: target.appendingPathComponent(InstallID.fileName).path)
            if pinned.stores.contains(where: { $0.relative == "images/images.sqlite" }) {
                let (kept, pruned, missing) = try Self.matchOriginals(in: target.appendingPathComponent("images"))
                table += "\nimages/originals: \(kept) photos (\(pruned) no store named left out)"
                if missing > 0 { note("\(missing) photos the images store named had no file; the backup leaves them out") }
            }
            // The manifest last: a directory with one is a whole backup.
            let manifest = Manifest(
                install: install, cutAt: MessageCodec.string(from: cutAt), stores: pinned.stores.map(\.relative), heldMilliseconds: held ?? 0)
            try Self.write(manifest, to: target)
            print(table)
            print("backed up \(Self.describe(held)) to \(target.path); make a data directory of it with canopy restore \(target.path) --data-dir NEW")
        } catch {
            Self.empty(target)
            throw error
        }
    }

    /// How the cut was made, for the last line.
    static func describe(_ held: Double?) -> String {
        guard let held else {
            return "as it lies (no stack runs from --data-dir and no --broker was named, so no requests were held: stop the stack first, or name its brokers)"
        }
        return "at one cut (requests held \(String(format: "%.1f", held)) ms)"
    }

    /// Writes `backup.json`.
    static func write(_ manifest: Manifest, to directory: URL) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        try encoder.encode(manifest).write(to: directory.appendingPathComponent(Manifest.file), options: .atomic)
    }

    /// Empties `directory` (a backup that failed), leaving the directory itself.
    static func empty(_ directory: URL) {
        for name in (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? [] {
            try? FileManager.default.removeItem(at: directory.appendingPathComponent(name))
        }
    }

    /// What `backup.json` says of a backup.
    struct Manifest: Codable, Equatable {
        /// The install the data is (``InstallID``).
        var install: String
        /// When the cut was made.
        var cutAt: String
        /// The stores, relative to the backup's directory (`care/care.sqlite`).
        var stores: [String]
        /// How long requests were held, in milliseconds (0: the stack was stopped).
        var heldMilliseconds: Double
        /// With PostgreSQL: the dump's file (pg_dump's custom format), relative.
        var databaseDump: String?

        static let file = "backup.json"
    }

    /// Refuses a `target` that is a file or a directory with something in it.
    static func refuseNonEmpty(_ target: URL, what: String) throws {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: target.path, isDirectory: &isDirectory), !isDirectory.boolValue {
            throw CommandFailure("\(target.path) is a file; name a new directory for \(what)")
        }
        if let contents = try? FileManager.default.contentsOfDirectory(atPath: target.path), !contents.isEmpty {
            throw CommandFailure("\(target.path) is not empty; name a new directory for \(what)")
        }
    }

    /// Every SQLite store in `directory` checked to be Canopy's (``StoreFile``), with a sentence.
    static func checkStores(in directory: URL) throws {
        for (service, plan) in Migrate.stores {
            let path = Migrate.storeFile(service, in: directory).path
            guard FileManager.default.fileExists(atPath: path) else { continue }
            do {
                try StoreFile.check(path: path, store: service, tables: plan.tables.map(\.name))
            } catch {
                throw CommandFailure(error.description)
            }
        }
    }

    /// Leaves in `images/originals` exactly the originals the copied `images.sqlite` names:
    /// the files no row names go (an erased person's, linked before the cut); rows whose file
    /// is missing go too, in one transaction. Returns (kept, files removed, rows removed).
    static func matchOriginals(in images: URL) throws -> (kept: Int, pruned: Int, missing: Int) {
        let database = try DatabaseQueue(path: images.appendingPathComponent("images.sqlite").path)
        defer { try? database.close() }
        let named = Set(try database.read { db in try String.fetchAll(db, sql: "SELECT sha256 FROM originals") })
        let originals = images.appendingPathComponent("originals", isDirectory: true)
        try FileManager.default.createDirectory(at: originals, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let present = Set((try? FileManager.default.contentsOfDirectory(atPath: originals.path)) ?? [])
        var pruned = 0
        for name in present.subtracting(named) {
            try FileManager.default.removeItem(at: originals.appendingPathComponent(name))
            pruned += 1
        }
        let missing = named.subtracting(present)
        if !missing.isEmpty {
            try database.write { db in
                for table in ["photos", "palettes", "originals"] {
                    for name in missing { try db.execute(sql: "DELETE FROM \(table) WHERE sha256 = ?", arguments: [name]) }
                }
            }
        }
        return (named.count - missing.count, pruned, missing.count)
    }

    /// `store` copied to `copy` by SQLite's online backup in one step: one read of the store
    /// as it is at that moment. The stores are in WAL mode, so the services keep writing
    /// meanwhile (a backup in several steps would start again after each of their writes,
    /// and might never end on a busy store).
    static func copyStore(from store: URL, to copy: URL) throws {
        // A connection that only reads, as the sqlite3 shell's .backup has (a read-only one
        // could not open a stopped stack's store in WAL mode without its -shm file).
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        let source = try DatabaseQueue(path: store.path, configuration: configuration)
        let destination = try DatabaseQueue(path: copy.path)
        try source.backup(to: destination)
        try destination.close()
        try source.close()
    }
}
