import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Dispatch
import Foundation
import Logging

/// `canopy backup` and `canopy restore` of a stack whose stores are in PostgreSQL: the
/// database dumped by `pg_dump` from a snapshot exported at the stack's cut (``StackCut``), and
/// the photos' originals linked at it, so the dump and the photos agree as the SQLite stores
/// of a backup do.
struct PostgresBackup {
    let url: DatabaseURL
    /// Where the originals are (every canopy-images replica's `--originals-dir`).
    let originals: URL?
    let stack: StackOptions
    /// The brokers to hold (`--broker`), or nil for those of the stack `canopy up` runs.
    let brokers: [String]?
    let holdMilliseconds: Int

    /// The dump's file in a backup.
    static let dumpFile = "database.dump"

    func run(into target: URL) async throws {
        let pgDump = try Self.program("pg_dump")
        let store = try await Self.inspect(url)
        defer { store.close() }
        try FileManager.default.createDirectory(at: target, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        try FileManager.default.setAttributes([.posixPermissions: 0o700], ofItemAtPath: target.path) // it holds everyone's data
        let linked = target.appendingPathComponent("images/originals", isDirectory: true)
        var exporter: SnapshotExporter?
        do {
            if let originals { _ = try StackSnapshot.linkOriginals(from: originals, to: linked) } // most of them before the hold
            var cutAt = Date()
            let held = try await StackCut.hold(stack: stack, brokers: brokers, holdMilliseconds: holdMilliseconds) {
                // The snapshot is exported at the cut, not before: pg_dump sees what the stores held then.
                let started = SnapshotExporter(store: store)
                exporter = started
                _ = try started.waitForSnapshot()
                cutAt = Date()
                if let originals { _ = try StackSnapshot.linkOriginals(from: originals, to: linked) }
            }
            guard let exporter else { throw CommandFailure("no snapshot was exported at the cut") }
            note("dumping \(url) with pg_dump from the snapshot at the cut…")
            let dump = target.appendingPathComponent(Self.dumpFile)
            let dumped = Result {
                try Self.runProgram(
                    pgDump,
                    [
                        "--snapshot=\(try exporter.waitForSnapshot())", "--format=custom", "--no-owner", "--no-privileges",
                        "--file=\(dump.path)",
                    ], url: url)
            }
            let named = try exporter.finish() // the transaction ends once pg_dump is done
            try dumped.get()
            try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: dump.path)
            guard originals != nil || named.isEmpty else {
                throw CommandFailure(
                    "the database names \(named.count) photos, and no --originals-dir says where their files are; name canopy-images' --originals-dir (nothing was kept)"
                )
            }
            // Originals linked that the database at the cut does not name (an erased person's) go.
            var pruned = 0
            for name in ((try? FileManager.default.contentsOfDirectory(atPath: linked.path)) ?? []) where !named.contains(name) {
                try FileManager.default.removeItem(at: linked.appendingPathComponent(name))
                pruned += 1
            }
            let missing = named.filter { !FileManager.default.fileExists(atPath: linked.appendingPathComponent($0).path) }
            guard originals == nil || missing.isEmpty else {
                throw CommandFailure(
                    "\(missing.count) photos the database names are not in \(originals?.path ?? ""); name canopy-images' --originals-dir with --originals-dir")
            }
            let manifest = Backup.Manifest(
                install: try Self.install(store), cutAt: MessageCodec.string(from: cutAt), stores: [], heldMilliseconds: held ?? 0, databaseDump: Self.dumpFile)
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
            try encoder.encode(manifest).write(to: target.appendingPathComponent(Backup.Manifest.file), options: .atomic)
            let bytes = (try? FileManager.default.attributesOfItem(atPath: target.appendingPathComponent(Self.dumpFile).path)[.size] as? Int) ?? 0
            var table = Table("WHAT", "FILE", "MIB")
            table.append(["database", Self.dumpFile, String(format: "%.2f", Double(bytes) / 1_048_576)])
            table.append(["photos", "images/originals (\(named.count) photos, \(pruned) no row named left out)", ""])
            print(table.render())
            print(
                "backed up \(url) \(Backup.describe(held)) to \(target.path); restore with canopy restore \(target.path) --database-url URL --originals-dir DIR"
            )
        } catch {
            if let exporter { _ = try? exporter.finish() } // its transaction and thread end with the backup
            try? FileManager.default.removeItem(at: target)
            throw error
        }
    }

    /// The install the database was migrated from (`canopy_imports`), or a new id for a stack
    /// that began on PostgreSQL.
    static func install(_ store: PostgresStore) throws -> String {
        let recorded = try store.read { session -> String? in
            guard try session.value(Bool.self, "SELECT to_regclass('canopy_imports') IS NOT NULL") ?? false else { return nil }
            return try session.value(String.self, "SELECT to_jsonb(i)->>'install' FROM canopy_imports i WHERE to_jsonb(i)->>'install' IS NOT NULL LIMIT 1")
        }
        return recorded ?? (0..<16).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
    }

    /// Fills the empty database `url` from a backup's `dump` with `pg_restore`, and copies the
    /// backup's originals into `originalsDir`.
    static func restore(dump: URL, originals: URL, into url: DatabaseURL, originalsDir: URL) async throws {
        let pgRestore = try program("pg_restore")
        let store = try await inspect(url)
        let tables = try store.read { session in
            try session.value(Int.self, "SELECT COUNT(*)::BIGINT FROM information_schema.tables WHERE table_schema = current_schema()") ?? 0
        }
        store.close()
        guard tables == 0 else {
            throw CommandFailure(
                "\(url) is not empty (\(tables) tables); canopy restore fills an empty database only: create one (CREATE DATABASE …) and name it")
        }
        try Backup.refuseNonEmpty(originalsDir, what: "the restored photos")
        note("restoring \(url) with pg_restore…")
        try runProgram(pgRestore, ["--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction", dump.path], url: url)
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: originals.path)) ?? []).filter { !$0.hasPrefix(".") }.sorted()
        let count = try Restore.copyOriginals(names, from: originals, to: originalsDir).count
        print(
            "restored \(url) (\(dump.lastPathComponent)) and \(count) photos into \(originalsDir.path); run the stack with --database-url \(url) --originals-dir \(originalsDir.path)"
        )
    }

    /// A connection to `url` that changes nothing; its failure as a sentence.
    static func inspect(_ url: DatabaseURL) async throws -> PostgresStore {
        var logger = Logger(label: "canopy")
        logger.logLevel = .error
        do {
            return try await PostgresStore.inspect(url: url, logger: logger)
        } catch {
            throw Migrate.sentence(error)
        }
    }

    /// A PostgreSQL client program: on the PATH, else the newest of Debian's
    /// /usr/lib/postgresql/N/bin; a sentence when neither has it.
    static func program(_ name: String) throws -> URL {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        for directory in path.split(separator: ":") {
            let candidate = URL(fileURLWithPath: String(directory)).appendingPathComponent(name)
            if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
        }
        let root = URL(fileURLWithPath: "/usr/lib/postgresql")
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: root.path)) ?? []).compactMap(Int.init).sorted()
        for version in versions.reversed() {
            let candidate = root.appendingPathComponent("\(version)/bin/\(name)")
            if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
        }
        throw CommandFailure(
            "\(name) is not installed; install PostgreSQL's client programs (apt-get install postgresql-client), at least the server's version")
    }

    /// `url` as libpq's key=value string, each value quoted; with TLS, the server's
    /// certificate verified against the system's roots, as the services verify it.
    static func connectionString(_ url: DatabaseURL) -> String {
        func quoted(_ value: String) -> String { "'" + value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "'", with: "\\'") + "'" }
        var pairs = [("host", url.host), ("port", "\(url.port)"), ("user", url.user), ("dbname", url.database)]
        if url.requiresTLS {
            pairs.append(("sslmode", "verify-full"))
            pairs.append(("sslrootcert", "/etc/ssl/certs/ca-certificates.crt"))
        } else {
            pairs.append(("sslmode", "disable"))
        }
        return pairs.map { "\($0.0)=\(quoted($0.1))" }.joined(separator: " ")
    }

    /// Runs `program` against `url` (the password in the environment, never on the command
    /// line); its standard error in the sentence when it fails.
    static func runProgram(_ program: URL, _ arguments: [String], url: DatabaseURL) throws {
        let process = Process()
        process.executableURL = program
        process.arguments = arguments + ["--no-password", "--dbname=\(connectionString(url))"]
        var environment = ProcessInfo.processInfo.environment
        environment["PGPASSWORD"] = url.password ?? ""
        process.environment = environment
        let errors = Pipe()
        process.standardError = errors
        try process.run()
        let said = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw CommandFailure(
                "\(program.lastPathComponent) failed (exit \(process.terminationStatus)): \(String(decoding: said.prefix(600), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))"
            )
        }
    }
}

/// A read transaction that exports its snapshot (`pg_export_snapshot()`) for `pg_dump
/// --snapshot`, held on a thread of its own until ``finish()``: pg_dump sees the database as
/// this transaction does, and so do the originals' names read at the end.
final class SnapshotExporter: @unchecked Sendable { // its fields are written before the semaphores that publish them
    private let exported = DispatchSemaphore(value: 0)
    private let dumped = DispatchSemaphore(value: 0)
    private let ended = DispatchSemaphore(value: 0)
    private var id: String?
    private var names: Set<String> = []
    private var failure: Error?

    init(store: PostgresStore) {
        let thread = Thread { [self] in
            do {
                try store.read { session in
                    id = try session.value(String.self, "SELECT pg_export_snapshot()")
                    exported.signal()
                    dumped.wait()
                    if try session.value(Bool.self, "SELECT to_regclass('originals') IS NOT NULL") ?? false {
                        names = Set(try session.rows("SELECT sha256 FROM originals").map { try $0.column("sha256").decode(String.self) })
                    }
                }
            } catch {
                failure = error
                if id == nil { exported.signal() }
            }
            ended.signal()
        }
        thread.name = "canopy-backup-snapshot"
        thread.start()
    }

    /// The snapshot's id, once exported (waits for it; every call after the first at once).
    func waitForSnapshot() throws -> String {
        exported.wait()
        exported.signal() // for the next caller: the fields are published by the semaphore
        guard let id else { throw Migrate.sentence(failure ?? CommandFailure("no snapshot could be exported")) }
        return id
    }

    /// Ends the transaction; the originals the database named at the cut.
    func finish() throws -> Set<String> {
        dumped.signal()
        ended.wait()
        ended.signal() // a second call (the backup's failure after its end) passes too
        if let failure { throw Migrate.sentence(failure) }
        return names
    }
}
