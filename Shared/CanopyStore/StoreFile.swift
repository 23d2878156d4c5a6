import Foundation
import GRDB

/// Whether a file is the Canopy SQLite store an operator command expects, before it reads
/// anything from it: a missing file, a file that is not SQLite, or another program's database
/// is refused with a sentence naming the file and what was expected, never SQLite's own error.
public enum StoreFile {
    /// A file that is not the store expected, with a sentence.
    public struct Refused: Error, CustomStringConvertible {
        public let description: String
    }

    /// Checks that `path` is `store`'s SQLite store: a SQLite database with every one of
    /// `tables`. Opens it read-only and closes it again.
    public static func check(path: String, store: String, tables: [String]) throws(Refused) {
        let expected = "canopy-\(store)'s store (\(store)/\(store).sqlite)"
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw Refused(description: "\(path) does not exist; expected \(expected)")
        }
        guard !isDirectory.boolValue else { throw Refused(description: "\(path) is a directory; expected \(expected), a file") }
        guard FileManager.default.isReadableFile(atPath: path) else {
            throw Refused(description: "\(path) cannot be read by this user; expected \(expected) (run as the stack's user)")
        }
        // SQLite's own first bytes: anything else is not a database at all.
        let header = (try? FileHandle(forReadingFrom: URL(fileURLWithPath: path)).read(upToCount: 16)) ?? nil ?? Data()
        guard header.count == 16 || header.isEmpty, header.isEmpty || header == Data("SQLite format 3\u{0}".utf8) else {
            throw Refused(description: "\(path) is not an SQLite database (its first bytes are not SQLite's); expected \(expected)")
        }
        guard !header.isEmpty else { throw Refused(description: "\(path) is empty; expected \(expected)") }
        let present: Set<String>
        do {
            var configuration = Configuration()
            configuration.readonly = true
            let queue = try DatabaseQueue(path: path, configuration: configuration)
            defer { try? queue.close() }
            present = Set(try queue.read { db in try String.fetchAll(db, sql: "SELECT lower(name) FROM sqlite_master WHERE type = 'table'") })
        } catch {
            throw Refused(description: "\(path) cannot be read as an SQLite database (\(Self.reason(error))); expected \(expected)")
        }
        let missing = tables.filter { !present.contains($0.lowercased()) }
        guard missing.isEmpty else {
            let has = present.filter { !$0.hasPrefix("sqlite_") && !$0.hasPrefix("grdb_") }.sorted()
            throw Refused(
                description:
                    "\(path) is an SQLite database but not \(expected): it has no table \(missing.prefix(3).joined(separator: ", "))\(has.isEmpty ? " (it has no tables)" : " (it has \(has.prefix(6).joined(separator: ", ")))")"
            )
        }
    }

    private static func reason(_ error: Error) -> String {
        if let error = error as? DatabaseError { return error.message ?? "\(error.resultCode)" }
        return "\(error)"
    }
}

extension StoreFile {
    /// Moves a store a data directory keeps under a service's former name into its present
    /// one, once: `<data>/<former>/<former>.sqlite` (with its `-wal` and `-shm`) becomes
    /// `<data>/<name>/<name>.sqlite`, so an install made before the rename keeps its data.
    /// Nothing happens when the present store exists already or there is no former one.
    ///
    /// - Returns: whether it moved the store.
    @discardableResult
    public static func adopt(formerName former: String, as name: String, in dataDirectory: URL) throws -> Bool {
        let manager = FileManager.default
        let (old, new) = (dataDirectory.appendingPathComponent(former), dataDirectory.appendingPathComponent(name))
        let oldStore = old.appendingPathComponent("\(former).sqlite")
        guard manager.fileExists(atPath: oldStore.path), !manager.fileExists(atPath: new.appendingPathComponent("\(name).sqlite").path) else { return false }
        try manager.createDirectory(at: new, withIntermediateDirectories: true)
        // The write-ahead log first and the database last: a move cut short leaves the
        // database where it was, found and adopted again at the next start.
        for suffix in ["-shm", "-wal", ""] {
            let from = old.appendingPathComponent("\(former).sqlite\(suffix)")
            guard manager.fileExists(atPath: from.path) else { continue }
            try manager.moveItem(at: from, to: new.appendingPathComponent("\(name).sqlite\(suffix)"))
        }
        if (try? manager.contentsOfDirectory(atPath: old.path))?.isEmpty == true { try? manager.removeItem(at: old) }
        return true
    }
}
