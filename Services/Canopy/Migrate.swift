import ArgumentParser
import CanopyAPI
import CanopyCare
import CanopyDeployment
import CanopyIdentify
import CanopyImages
import CanopyMessages
import CanopyRemind
import CanopyServiceKit
import CanopyStore
import Foundation
import GRDB
import Logging

/// `canopy migrate`: a single-host install's stores moved into PostgreSQL, its photos into
/// the shared photo store. The path from one machine to many (docs/SCALING.md).
struct Migrate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Move a single-host install into PostgreSQL and a shared photo store, checked by counts and checksums.",
        discussion: """
            Every SQLite store in --from (care, remind, identify, images, api) is copied into the
            database --to names, one transaction a store: its tables emptied and filled, then
            counted and checksummed against the source before anything commits. The stores are
            read through SQLite's online backup (as canopy backup does), so the stack may run
            meanwhile, but what it writes after that moment stays behind: stop it first
            (canopy down), or migrate a backup. The photos' originals go to --originals-dir,
            each synced and compared. Every store is checked before anything is written: a
            database holding data that this install (its install id, kept in --from) did not
            put there, or that changed since, is refused with a sentence and left as it was,
            and no photo is copied. Running it again is safe, also after it was killed: a
            store already imported from the same data is left alone, a newer copy of the same
            install is imported again, and what was not finished is done.
            Examples:
              canopy migrate --from ./.canopy --to postgres://canopy@db:5432/canopy --database-password-file ./secrets/db --originals-dir /mnt/photos
              canopy migrate --from ./backups/monday --to postgres://canopy@127.0.0.1:5432/canopy
            """)

    @Option(help: ArgumentHelp("The data directory (or a backup of it) to move.", valueName: "dir"))
    var from: String
    @Option(help: ArgumentHelp("The PostgreSQL to move it into: postgres://USER@HOST:5432/DATABASE.", valueName: "url"))
    var to: String
    @Option(help: ArgumentHelp("A file holding the database password, instead of one in the URL. Env: CANOPY_DATABASE_PASSWORD_FILE.", valueName: "path"))
    var databasePasswordFile: String? = Environment.string("CANOPY_DATABASE_PASSWORD_FILE")
    @Option(
        help: ArgumentHelp(
            "Where the photos' originals go: the directory every canopy-images replica mounts (default: where they are, <from>/images/originals). Env: CANOPY_ORIGINALS_DIR.",
            valueName: "dir"))
    var originalsDir: String? = Environment.string("CANOPY_ORIGINALS_DIR")

    /// Every store `canopy migrate` moves, by the directory it lives in.
    static let stores: [(service: String, plan: StoreImport)] = [
        ("care", careStoreImport), ("remind", remindStoreImport), ("identify", identifyStoreImport), ("images", imagesStoreImport),
        ("api", apiStoreImport),
    ]

    /// Where `service`'s SQLite store is in a data directory or a backup: `<service>/<service>.sqlite`,
    /// or canopy-api's under its former name (`batch/batch.sqlite`) in one made before the
    /// rename, read where it is (a source is never changed).
    static func storeFile(_ service: String, in directory: URL) -> URL {
        let file = directory.appendingPathComponent("\(service)/\(service).sqlite")
        guard service == CanopyAPIStore.directoryName, !FileManager.default.fileExists(atPath: file.path) else { return file }
        let old = directory.appendingPathComponent(CanopyAPIStore.formerPath)
        return FileManager.default.fileExists(atPath: old.path) ? old : file
    }

    /// A store's path relative to a data directory as this Canopy names it: a backup made
    /// before the rename lists canopy-api's as `batch/batch.sqlite`.
    static func presentStore(_ relative: String) -> String {
        relative == CanopyAPIStore.formerPath ? "\(CanopyAPIStore.directoryName)/\(CanopyAPIStore.fileName)" : relative
    }

    /// The stack's SQLite stores in `directory` (a data directory or a backup): each by its
    /// present path (`api/api.sqlite`) and the file it is (canopy-api's may still be under its
    /// former name).
    static func sqliteStores(in directory: URL) -> [(relative: String, file: URL)] {
        CanopyStack.services.filter(\.keepsData).compactMap { service in
            let file = storeFile(service.name, in: directory)
            return FileManager.default.fileExists(atPath: file.path) ? ("\(service.name)/\(service.name).sqlite", file) : nil
        }
    }

    func run() async throws {
        let url: DatabaseURL
        do {
            url = try DatabaseURL(parsing: to, passwordFile: databasePasswordFile)
        } catch {
            throw ValidationError(error.description)
        }
        let source = URL(fileURLWithPath: from, isDirectory: true).standardizedFileURL
        let present = Self.stores.filter { FileManager.default.fileExists(atPath: Self.storeFile($0.service, in: source).path) }
        guard !present.isEmpty else {
            throw CommandFailure("no stores in \(source.path); name a data directory (canopy status shows it) or a backup of one")
        }
        if let state = StackLayout(dataDirectory: source).state(), state.services.contains(where: { $0.state == "running" }) {
            note("the stack in \(source.path) runs: what it writes from now on stays behind; stop it (canopy down) and run this again to bring the rest")
        }
        // Each source is this store's, before anything is read from it.
        for (service, plan) in present {
            do {
                try StoreFile.check(path: Self.storeFile(service, in: source).path, store: service, tables: plan.tables.map(\.name))
            } catch {
                throw CommandFailure("\(error.description); nothing was migrated")
            }
        }
        let install = try InstallID.ensure(in: source)
        // A snapshot of every store first (SQLite's online backup): one moment of each.
        let snapshot = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-migrate-\(UUID().uuidString)", isDirectory: true)
        try FileManager.default.createDirectory(at: snapshot, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        defer { try? FileManager.default.removeItem(at: snapshot) }
        var logger = Logger(label: "canopy-migrate")
        logger.logLevel = .error
        for (service, _) in present {
            try Backup.copyStore(from: Self.storeFile(service, in: source), to: snapshot.appendingPathComponent("\(service).sqlite"))
        }
        // Every store checked against the target before anything is written to it: one
        // refusal leaves the database (and the photos) as they were.
        try await Self.refuseForeignTarget(present, snapshot: snapshot, url: url, install: install)
        var table = Table("STORE", "TABLE", "ROWS", "CHECKSUM", "RESULT")
        var progress = ProgressLine()
        for (service, plan) in present {
            let copy = snapshot.appendingPathComponent("\(service).sqlite")
            note("moving \(service) into \(url)…")
            let report: StoreImport.Report
            do {
                report = try await plan.run(from: copy.path, into: url, source: source.path, install: install, logger: logger) { table, done, total in
                    progress.update("\(table) \(ProgressLine.bar(done, of: total)) \(done)/\(total) rows")
                }
            } catch {
                progress.finish()
                throw Self.sentence(error)
            }
            progress.finish()
            for entry in report.tables {
                table.append([
                    service, entry.table, "\(entry.rows)", String(entry.checksum.prefix(16)), report.outcome == .imported ? "copied, checked" : "already there",
                ])
            }
        }
        print(table.render())
        if present.contains(where: { $0.service == "images" }) {
            let originals =
                originalsDir.map { URL(fileURLWithPath: $0, isDirectory: true) } ?? source.appendingPathComponent("images/originals", isDirectory: true)
            let index = try DatabaseQueue(path: snapshot.appendingPathComponent("images.sqlite").path)
            let names = try await index.read { (db: Database) in try String.fetchAll(db, sql: "SELECT sha256 FROM originals ORDER BY sha256") }
            try index.close()
            let copied: ImageTools.OriginalsCopy
            do {
                copied = try ImageTools.copyOriginals(names, from: source.appendingPathComponent("images/originals", isDirectory: true), to: originals) {
                    done, total in
                    progress.update("photos \(ProgressLine.bar(done, of: total)) \(done)/\(total)")
                }
            } catch let error as CanopyError {
                progress.finish()
                throw CommandFailure(error.message)
            }
            progress.finish()
            print("photos: \(copied.copied) copied (\(copied.bytes >> 20) MiB), \(copied.present) already in \(originals.path), each compared with its source")
        }
        let images = originalsDir.map { " --originals-dir \($0)" } ?? ""
        print(
            "moved into \(url); run each service with --database-url \(url)\(databasePasswordFile.map { " --database-password-file \($0)" } ?? "") (canopy-images also\(images.isEmpty ? " with --originals-dir where the originals are" : images)), or canopy up --database-url \(url)"
        )
    }

    /// Refuses, with every reason at once, when any store's target holds what this install
    /// did not put there (``StoreImport/check(from:into:install:)``); changes nothing.
    static func refuseForeignTarget(_ present: [(service: String, plan: StoreImport)], snapshot: URL, url: DatabaseURL, install: String) async throws {
        let target = try await PostgresBackup.inspect(url)
        defer { target.close() }
        var refusals: [String] = []
        do {
            refusals = try StoreImport.foreignImports(in: target, install: install).filter { sentence in
                !present.contains { sentence.hasPrefix("the \($0.service) store") }
            }
        } catch {
            throw sentence(error)
        }
        for (service, plan) in present {
            do {
                _ = try plan.check(from: snapshot.appendingPathComponent("\(service).sqlite").path, into: target, install: install)
            } catch let refused as StoreImport.Refused {
                refusals.append(refused.description)
            } catch {
                throw sentence(error)
            }
        }
        guard refusals.isEmpty else {
            throw CommandFailure(refusals.joined(separator: "\n") + "\nnothing was migrated, and \(url) was left as it was")
        }
    }

    /// An error of the import as the sentence it carries.
    static func sentence(_ error: Error) -> Error {
        switch error {
        case let refused as StoreImport.Refused: CommandFailure(refused.description)
        case let failure as PostgresStore.Failure: CommandFailure(failure.description)
        case let failure as PostgresMigrator.Failure: CommandFailure(failure.description)
        case let refused as StoreFile.Refused: CommandFailure(refused.description)
        default: error
        }
    }
}
