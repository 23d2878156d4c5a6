import CanopyCapture
import CanopyDeployment
import CanopyServiceKit
import CanopyStore
import Crypto
import Foundation
import Synchronization

/// A stack's stores as they stood at a capture's cut (`canopy capture start NAME --snapshot`),
/// kept beside the capture in `NAME.snapshot/`: a data directory of its own (each service's
/// SQLite store, the photos' originals) and `snapshot.json`. `canopy replay NAME --fresh`
/// starts a throwaway stack from it.
///
/// Taken in three steps around the broker's hold: before it, every store is opened and the
/// originals are hard-linked (their files never change, and a link keeps one the stack purges
/// later); while requests are held, a read transaction is begun on every store (nothing is
/// read yet) and the originals written since are linked; once the requests go on, each store
/// is copied through its transaction, so the copy is the store at the cut however long
/// copying takes.
enum StackSnapshot {
    /// What `snapshot.json` says.
    struct Manifest: Codable, Equatable {
        /// The captures (each broker's) the snapshot belongs to.
        var captures: [String]
        /// The broker's cut: ns since 1970 (the first broker's, with several).
        var cutAt: Int64
        /// The stores, relative to the snapshot's directory (`care/care.sqlite`).
        var stores: [String]
        var originals: Int
        var pseudonymized: Bool
        /// How long requests were held, in milliseconds.
        var heldMilliseconds: Double

        static let file = "snapshot.json"
    }

    /// The snapshot's directory beside the capture's first file.
    static func directory(forCapture path: String) -> URL {
        URL(fileURLWithPath: path + ".snapshot", isDirectory: true)
    }

    /// A snapshot's manifest, or a sentence saying why there is none.
    static func manifest(in directory: URL) throws -> Manifest {
        guard let data = FileManager.default.contents(atPath: directory.appendingPathComponent(Manifest.file).path) else {
            throw CommandFailure(
                "no snapshot at \(directory.path); capture with canopy capture start NAME --snapshot (the default for a stack canopy up started), or name one with --snapshot DIR"
            )
        }
        do {
            return try JSONDecoder().decode(Manifest.self, from: data)
        } catch {
            throw CommandFailure("\(directory.appendingPathComponent(Manifest.file).path) is not a snapshot's manifest (\(error))")
        }
    }

    /// The stores held at the cut, and the originals linked.
    struct Pinned {
        var stores: [(relative: String, store: PinnedStore)]
        var originals: Int
        let directory: URL
        let data: URL

        func close() { stores.forEach { $0.store.close() } }

        /// During the hold: begins a read transaction on each store, and links the originals
        /// written since ``StackSnapshot/prepare(data:into:)`` (a hard link keeps a file the
        /// stack purges later, which the pinned store may still name).
        mutating func pin() throws {
            for entry in stores { try entry.store.pin() }
            originals += try StackSnapshot.linkOriginals(
                from: data.appendingPathComponent("images/originals"),
                to: directory.appendingPathComponent("images/originals"))
        }
    }

    /// Before the hold: opens each of the stack's SQLite stores in `data` and links the
    /// originals there now into `directory` (made here, owner-only), so that what the hold
    /// waits for is only the pin: a transaction begun on each store and the newest originals
    /// linked. An original deleted before the cut leaves a file the copied store does not
    /// name; canopy-images never serves such a file.
    static func prepare(data: URL, into directory: URL, orEmpty: Bool = false) throws -> Pinned {
        // canopy-care's first: its outbox's follow-ups go on during the hold (they are a
        // service's own), so a follow-up is pinned in its source before its target could
        // have done it and the source deleted it (at worst it is sent again, which every
        // follow-up takes), never lost between the two.
        let present = Migrate.sqliteStores(in: data)
        let stores = present.filter { $0.relative.hasPrefix("care/") } + present.filter { !$0.relative.hasPrefix("care/") }
        guard !stores.isEmpty else {
            throw CommandFailure(
                "no SQLite stores in \(data.path) to snapshot (a stack on PostgreSQL is snapshotted with pg_dump, not here); capture without --snapshot, or name the stack with --data-dir"
            )
        }
        let empty = ((try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? ["?"]).isEmpty
        guard !FileManager.default.fileExists(atPath: directory.path) || (orEmpty && empty) else {
            throw CommandFailure("\(directory.path) exists already; remove it or capture under another name")
        }
        try Backup.checkStores(in: data)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        var pinned = Pinned(stores: [], originals: 0, directory: directory, data: data)
        do {
            for store in stores { pinned.stores.append((store.relative, try PinnedStore(path: store.file.path))) }
            pinned.originals = try linkOriginals(
                from: data.appendingPathComponent("images/originals"), to: directory.appendingPathComponent("images/originals"))
        } catch {
            pinned.close()
            try? FileManager.default.removeItem(at: directory)
            throw error
        }
        return pinned
    }

    /// Hard-links every original (a copy where a link cannot be made: another file system).
    /// Links the originals not linked yet; returns how many it linked.
    static func linkOriginals(from source: URL, to target: URL) throws -> Int {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: source.path) else { return 0 }
        try FileManager.default.createDirectory(at: target, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        var count = 0
        for name in names where !name.hasPrefix(".") && !name.hasSuffix(".tmp") {
            let from = source.appendingPathComponent(name).path, to = target.appendingPathComponent(name).path
            if link(from, to) != 0 {
                switch errno {
                case EEXIST: continue // linked before the hold
                case EXDEV: try FileManager.default.copyItem(atPath: from, toPath: to)
                default: continue // purged meanwhile: not in the pinned store either
                }
            }
            count += 1
        }
        return count
    }

    /// After the hold: copies each pinned store, renames its people by `pseudonyms` when
    /// given, and writes the manifest (as `file`) when there is one. Returns a table of what
    /// was copied.
    static func finish<Written: Encodable>(_ pinned: Pinned, manifest: Written?, file: String = Manifest.file, pseudonyms: PseudonymBox?) throws -> String {
        defer { pinned.close() }
        var table = Table("STORE", "FILE", "MIB", "SECONDS")
        var progress = ProgressLine()
        for (index, entry) in pinned.stores.enumerated() {
            progress.update("copying \(entry.relative) (\(index + 1) of \(pinned.stores.count))…")
            let started = ContinuousClock.now
            let copy = pinned.directory.appendingPathComponent(entry.relative)
            try FileManager.default.createDirectory(
                at: copy.deletingLastPathComponent(), withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            try entry.store.copy(to: copy.path)
            if let pseudonyms { try StoreOwners.rename(inStoreAt: copy.path) { pseudonyms.principal($0) } }
            let bytes = (try? FileManager.default.attributesOfItem(atPath: copy.path)[.size] as? Int) ?? 0
            table.append([
                entry.relative.split(separator: "/").first.map(String.init) ?? entry.relative, entry.relative,
                String(format: "%.2f", Double(bytes) / 1_048_576), String(format: "%.2f", (ContinuousClock.now - started).seconds),
            ])
        }
        progress.finish()
        if let manifest {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
            try encoder.encode(manifest).write(to: pinned.directory.appendingPathComponent(file), options: .atomic)
        }
        return table.render()
    }
}

/// A capture's pseudonyms, shared with the snapshot's renaming (the same key, so a person
/// has one pseudonym in the records and in the stores).
final class PseudonymBox: Sendable {
    let key: [UInt8]
    private let pseudonyms: Mutex<Pseudonyms>

    init() {
        var bytes = [UInt8](repeating: 0, count: 32)
        for index in bytes.indices { bytes[index] = UInt8.random(in: 0...255) }
        key = bytes
        pseudonyms = Mutex(Pseudonyms(key: SymmetricKey(data: bytes)))
    }

    func principal(_ name: String) -> String { pseudonyms.withLock { $0.principal(name) } }
}
