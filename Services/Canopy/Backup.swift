import ArgumentParser
import CanopyDeployment
import CanopyServiceKit
import Foundation
import GRDB

/// `canopy backup DIR`: every store of a stack copied while it runs.
struct Backup: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Back up every store of a stack while it runs: each SQLite store by SQLite's online backup, and the photos' originals.",
        discussion: """
            Each service's SQLite store (images, care, identify, remind) is copied with SQLite's
            online backup while the services keep reading and writing (the stores are in WAL
            mode): the copy is the store as it was at one moment. Then the originals that the copied images
            store names are copied (photos deleted meanwhile leave the copy too, so it names no
            missing file). Variants are a cache and are made again. DIR is new (or empty), made
            readable by its owner only; it is a data directory: canopy up --data-dir DIR runs
            from it. The token signing key is a secret and is not copied.
            Example: canopy backup ./backups/2026-11-25 --data-dir ./.canopy
            """)

    @Argument(help: "The new directory the backup goes to.") var directory: String
    @OptionGroup var stack: StackOptions

    func run() throws {
        let source = stack.layout.dataDirectory
        let target = URL(fileURLWithPath: directory, isDirectory: true).standardizedFileURL
        guard target.path != source.path else { throw ValidationError("the backup goes to a directory of its own, not the data directory itself") }
        let stores = CanopyStack.services.compactMap { service in service.store.map { (service.name, $0) } }
            .filter { FileManager.default.fileExists(atPath: source.appendingPathComponent($0.1).path) }
        guard !stores.isEmpty else {
            throw CommandFailure("no stores in \(source.path); name the stack's data directory with --data-dir (canopy status shows it)")
        }
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: target.path, isDirectory: &isDirectory), !isDirectory.boolValue {
            throw CommandFailure("\(target.path) is a file; name a new directory for the backup")
        }
        if let contents = try? FileManager.default.contentsOfDirectory(atPath: target.path), !contents.isEmpty {
            throw CommandFailure("\(target.path) is not empty; name a new directory for the backup")
        }
        try FileManager.default.createDirectory(at: target, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        try FileManager.default.setAttributes([.posixPermissions: 0o700], ofItemAtPath: target.path)

        var table = Table("STORE", "FILE", "MIB", "SECONDS")
        for (name, store) in stores {
            let started = ContinuousClock.now
            let copy = target.appendingPathComponent(store)
            try FileManager.default.createDirectory(at: copy.deletingLastPathComponent(), withIntermediateDirectories: true)
            note("backing up \(name) (\(store))…")
            try Self.copyStore(from: source.appendingPathComponent(store), to: copy)
            let bytes = (try? FileManager.default.attributesOfItem(atPath: copy.path)[.size] as? Int) ?? 0
            table.append([name, store, String(format: "%.2f", Double(bytes) / 1_048_576), String(format: "%.2f", (ContinuousClock.now - started).seconds)])
        }
        if stores.contains(where: { $0.0 == "images" }) {
            let started = ContinuousClock.now
            let (copied, bytes, gone) = try Self.copyOriginals(from: source.appendingPathComponent("images"), to: target.appendingPathComponent("images"))
            table.append(["images", "images/originals (\(copied) photos)", String(format: "%.2f", Double(bytes) / 1_048_576),
                          String(format: "%.2f", (ContinuousClock.now - started).seconds)])
            if gone > 0 { note("\(gone) photos were deleted while the backup ran; the backup leaves them out too") }
        }
        print(table.render())
        print("backed up to \(target.path); run from it with canopy up --data-dir \(target.path), or stop the stack (canopy down) and copy it over the data directory")
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

    /// Copies the originals the copied images store names. Those deleted since the store was
    /// copied (their photos purged) leave the copied store too, in one transaction.
    static func copyOriginals(from images: URL, to copy: URL) throws -> (copied: Int, bytes: Int, gone: Int) {
        let database = try DatabaseQueue(path: copy.appendingPathComponent("images.sqlite").path)
        defer { try? database.close() }
        let names = try database.read { db in try String.fetchAll(db, sql: "SELECT sha256 FROM originals ORDER BY sha256") }
        let originals = copy.appendingPathComponent("originals", isDirectory: true)
        try FileManager.default.createDirectory(at: originals, withIntermediateDirectories: true)
        var (copied, bytes, gone) = (0, 0, [String]())
        var line = ProgressLine()
        for (index, name) in names.enumerated() {
            line.update("  copying originals \(ProgressLine.bar(index, of: names.count)) \(index) of \(names.count)")
            let file = images.appendingPathComponent("originals").appendingPathComponent(name)
            do {
                try FileManager.default.copyItem(at: file, to: originals.appendingPathComponent(name))
                copied += 1
                bytes += (try? FileManager.default.attributesOfItem(atPath: file.path)[.size] as? Int) ?? 0
            } catch {
                guard !FileManager.default.fileExists(atPath: file.path) else { throw error }
                gone.append(name) // purged after the store was copied
            }
        }
        line.finish()
        if !gone.isEmpty {
            try database.write { db in
                for table in ["photos", "palettes", "originals"] {
                    for name in gone { try db.execute(sql: "DELETE FROM \(table) WHERE sha256 = ?", arguments: [name]) }
                }
            }
        }
        return (copied, bytes, gone.count)
    }
}
