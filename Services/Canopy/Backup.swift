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
    @Option(help: ArgumentHelp("Where the photos' originals are, with --database-url (the directory every canopy-images replica mounts). Env: CANOPY_ORIGINALS_DIR.", valueName: "dir"))
    var originalsDir: String? = Environment.string("CANOPY_ORIGINALS_DIR")
    @Option(help: "How long the broker may hold requests while the stores are pinned, in milliseconds (1 to 60000).") var holdMs = 10_000

    func validate() throws {
        guard (1...60_000).contains(holdMs) else { throw ValidationError("--hold-ms is 1 to 60000") }
    }

    func run() async throws {
        let source = stack.layout.dataDirectory
        let target = URL(fileURLWithPath: directory, isDirectory: true).standardizedFileURL
        guard target.path != source.path else { throw ValidationError("the backup goes to a directory of its own, not the data directory itself") }
        try Self.refuseNonEmpty(target, what: "the backup")
        if let postgres = try database.postgres() {
            return try await PostgresBackup(url: postgres.url, originals: originalsDir.map { URL(fileURLWithPath: $0, isDirectory: true) }, stack: stack,
                                            holdMilliseconds: holdMs).run(into: target)
        }
        let stores = CanopyStack.services.compactMap(\.store).filter { FileManager.default.fileExists(atPath: source.appendingPathComponent($0).path) }
        guard !stores.isEmpty else {
            throw CommandFailure("no stores in \(source.path); name the stack's data directory with --data-dir (canopy status shows it)")
        }
        try Self.checkStores(in: source)
        try? FileManager.default.removeItem(at: target) // empty: StackSnapshot makes it afresh, owner-only
        var pinned = try StackSnapshot.prepare(data: source, into: target)
        let held: Double
        do {
            held = try await StackCut.hold(stack: stack, holdMilliseconds: holdMs) { try pinned.pin() }
        } catch {
            pinned.close()
            try? FileManager.default.removeItem(at: target)
            throw error
        }
        let install = try InstallID.ensure(in: source)
        let manifest = Manifest(install: install, cutAt: MessageCodec.string(from: Date()), stores: pinned.stores.map(\.relative), heldMilliseconds: held)
        var table = try StackSnapshot.finish(pinned, manifest: manifest, file: Manifest.file, pseudonyms: nil)
        try Data((install + "\n").utf8).write(to: target.appendingPathComponent(InstallID.fileName))
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: target.appendingPathComponent(InstallID.fileName).path)
        if stores.contains("images/images.sqlite") {
            let (kept, pruned, missing) = try Self.matchOriginals(in: target.appendingPathComponent("images"))
            table += "\nimages/originals: \(kept) photos (\(pruned) no store named left out)"
            if missing > 0 { note("\(missing) photos the images store named had no file; the backup leaves them out") }
        }
        print(table)
        print("backed up at one cut (requests held \(String(format: "%.1f", held)) ms) to \(target.path); make a data directory of it with canopy restore \(target.path) --data-dir NEW")
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
            let path = directory.appendingPathComponent("\(service)/\(service).sqlite").path
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
