import ArgumentParser
import CanopyDeployment
import CanopyImages
import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation
import GRDB

/// `canopy restore BACKUP --data-dir NEW`: a data directory made of a backup.
struct Restore: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Make a new data directory of a backup (canopy backup), every store checked first; with --database-url, fill an empty PostgreSQL from it.",
        discussion: """
            Refuses a data directory that is not empty (or a database that is not), and a
            backup whose stores are not Canopy's or fail SQLite's integrity check, with a
            sentence and nothing written. Copies each store, the photos' originals (each
            compared with the backup's) and the install id. The token signing key is not in a
            backup: give it with --token-key-file (or say --new-token-key, and people sign in
            again). Accounts deleted
            after the backup was taken come back with it: keep their list before you restore
            (canopy erasures list --digests > erased.txt) and apply it once the stack runs
            (canopy erasures apply --digests-file erased.txt).
            Examples:
              canopy restore ./backups/2026-11-25 --data-dir ./.canopy-restored
              canopy restore ./backups/2026-11-25 --database-url postgres://canopy@db:5432/canopy_new --originals-dir /mnt/photos-new
            """)

    @Argument(help: "The backup's directory (made by canopy backup).") var backup: String
    @OptionGroup var stack: StackOptions
    @OptionGroup var database: DatabaseOptions
    @Option(help: ArgumentHelp("With --database-url: where the photos' originals go (the directory canopy-images' replicas will mount).", valueName: "dir"))
    var originalsDir: String?
    @Option(
        help: ArgumentHelp(
            "The token signing key to put in the new data directory: tokens issued before still work, and canopy erasures apply can match the accounts deleted since.",
            valueName: "file"))
    var tokenKeyFile: String?
    @Flag(help: "Start with a new token key instead (everyone signs in again, and deletions recorded under the old key can no longer be applied).")
    var newTokenKey = false

    func validate() throws {
        if tokenKeyFile == nil, !newTokenKey, database.databaseURL == nil {
            throw ValidationError(
                "name the stack's token key with --token-key-file (canopy erasures apply needs it to find deleted accounts), or say --new-token-key")
        }
        if tokenKeyFile != nil, newTokenKey { throw ValidationError("--token-key-file and --new-token-key say opposite things; give one") }
    }

    func run() async throws {
        let source = URL(fileURLWithPath: backup, isDirectory: true).standardizedFileURL
        let manifest = try Self.manifest(in: source)
        if let dump = manifest.databaseDump {
            guard let postgres = try database.postgres() else {
                throw CommandFailure(
                    "\(source.path) is a backup of a stack on PostgreSQL; restore it with --database-url URL (an empty database) and --originals-dir DIR")
            }
            guard let originalsDir else {
                throw CommandFailure("a PostgreSQL backup's photos go to --originals-dir DIR; name the directory canopy-images will mount")
            }
            return try await PostgresBackup.restore(
                dump: source.appendingPathComponent(dump), originals: source.appendingPathComponent("images/originals"),
                into: postgres.url, originalsDir: URL(fileURLWithPath: originalsDir, isDirectory: true))
        }
        let target = stack.layout.dataDirectory
        guard target.path != source.path else { throw ValidationError("restore into a new data directory, not the backup itself") }
        try Backup.refuseNonEmpty(target, what: "the restore (canopy restore makes a new data directory; move the old one aside first)")
        try Backup.checkStores(in: source)
        // Each store whole before anything is written.
        var table = Table("STORE", "FILE", "MIB", "CHECK")
        for store in manifest.stores {
            guard CanopyStack.services.contains(where: { $0.store == Migrate.presentStore(store) }) else {
                throw CommandFailure("\(Backup.Manifest.file) names \(store), which is no store of Canopy's; is \(source.path) a backup?")
            }
            let path = source.appendingPathComponent(store).path
            guard FileManager.default.fileExists(atPath: path) else { throw CommandFailure("\(path) is missing; the backup \(source.path) is incomplete") }
            let check = try Self.integrity(of: path)
            guard check == "ok" else { throw CommandFailure("\(path) fails SQLite's integrity check (\(check.prefix(200))); restore another backup") }
        }
        let key = try tokenKeyFile.map { file -> Data in
            guard let key = FileManager.default.contents(atPath: file) else {
                throw CommandFailure("cannot read --token-key-file \(file); name canopy-api's token key")
            }
            return key
        }
        try FileManager.default.createDirectory(at: target, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        try FileManager.default.setAttributes([.posixPermissions: 0o700], ofItemAtPath: target.path)
        do {
            try restoreFiles(manifest, from: source, into: target, key: key, table: &table)
        } catch {
            Backup.empty(target) // half a data directory is none: emptied, so the restore can run again
            throw error
        }
        print(table.render())
        print(
            "restored the backup of \(manifest.cutAt) into \(target.path); start it with canopy up --data-dir \(target.path)"
                + (key == nil ? " (a new token key is made: people sign in again)" : ""))
    }

    /// Copies the stores, the photos, the install id and the token key.
    private func restoreFiles(_ manifest: Backup.Manifest, from source: URL, into target: URL, key: Data?, table: inout CanopyServiceKit.Table) throws {
        for store in manifest.stores {
            // A backup made before the rename has canopy-api's store as batch/batch.sqlite.
            let (from, to) = (source.appendingPathComponent(store), target.appendingPathComponent(Migrate.presentStore(store)))
            try FileManager.default.createDirectory(
                at: to.deletingLastPathComponent(), withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            note("restoring \(store)…")
            try Backup.copyStore(from: from, to: to)
            let bytes = (try? FileManager.default.attributesOfItem(atPath: to.path)[.size] as? Int) ?? 0
            table.append([store.split(separator: "/").first.map(String.init) ?? store, store, String(format: "%.2f", Double(bytes) / 1_048_576), "ok"])
        }
        if manifest.stores.contains("images/images.sqlite") {
            let copied = try Self.copyOriginals(
                from: source.appendingPathComponent("images/originals"), to: target.appendingPathComponent("images/originals"),
                named: target.appendingPathComponent("images/images.sqlite"))
            table.append(["images", "images/originals (\(copied.count) photos)", String(format: "%.2f", Double(copied.bytes) / 1_048_576), "compared"])
        }
        try Data((manifest.install + "\n").utf8).write(to: target.appendingPathComponent(InstallID.fileName))
        if let key,
            !FileManager.default.createFile(atPath: target.appendingPathComponent("token.key").path, contents: key, attributes: [.posixPermissions: 0o600])
        {
            throw CommandFailure("cannot write the token key into \(target.path); check that it is writable")
        }
    }

    /// A backup's manifest, or a sentence saying why `directory` is not a backup.
    static func manifest(in directory: URL) throws -> Backup.Manifest {
        let file = directory.appendingPathComponent(Backup.Manifest.file)
        guard let data = FileManager.default.contents(atPath: file.path) else {
            throw CommandFailure("\(directory.path) is not a backup made by canopy backup (it has no \(Backup.Manifest.file)); name the backup's directory")
        }
        do {
            return try JSONDecoder().decode(Backup.Manifest.self, from: data)
        } catch {
            throw CommandFailure("\(file.path) is not a backup's manifest (\(error)); name the backup's directory")
        }
    }

    /// SQLite's `integrity_check` of the store at `path`: "ok", or what is wrong.
    static func integrity(of path: String) throws -> String {
        var configuration = Configuration()
        configuration.readonly = true
        let queue = try DatabaseQueue(path: path, configuration: configuration)
        defer { try? queue.close() }
        return try queue.read { db in try String.fetchAll(db, sql: "PRAGMA integrity_check").joined(separator: "; ") }
    }

    /// Copies every original the images store at `named` names from `source` to `target`
    /// (``ImageTools/copyOriginals(_:from:to:progress:)``: each synced, read back and compared);
    /// a missing one is refused with a sentence.
    static func copyOriginals(from source: URL, to target: URL, named: URL) throws -> (count: Int, bytes: Int) {
        let queue = try DatabaseQueue(path: named.path)
        let names = try queue.read { db in try String.fetchAll(db, sql: "SELECT sha256 FROM originals ORDER BY sha256") }
        try queue.close()
        return try copyOriginals(names, from: source, to: target)
    }

    /// Copies the originals `names` from `source` to `target`, owner-only, each synced, read
    /// back and compared (``ImageTools/copyOriginals(_:from:to:progress:)``).
    static func copyOriginals(_ names: [String], from source: URL, to target: URL) throws -> (count: Int, bytes: Int) {
        try FileManager.default.createDirectory(at: target, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        var line = ProgressLine()
        defer { line.finish() }
        do {
            let copied = try ImageTools.copyOriginals(names, from: source, to: target) { done, total in
                line.update("copying photos \(ProgressLine.bar(done, of: total)) \(done) of \(total)")
            }
            return (names.count, copied.bytes)
        } catch let error as CanopyError {
            throw CommandFailure(
                "\(error.message); the backup \(source.deletingLastPathComponent().deletingLastPathComponent().path) is incomplete, or the disk failed")
        }
    }
}
