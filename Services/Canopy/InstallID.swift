import CanopyServiceKit
import Foundation

/// Which install a data directory's data is: an id made once (16 random bytes, hex) in
/// `<data-dir>/install-id`, kept by `canopy backup` and `canopy restore` (a backup is the same
/// install's data), and recorded by `canopy migrate` in the PostgreSQL it fills, which then
/// refuses every other install. Unlike the stack id (one running stack's, never copied), it
/// travels with the data.
enum InstallID {
    static let fileName = "install-id"

    /// The id in `directory`, or nil when there is none (or it is not one).
    static func read(in directory: URL) -> String? {
        guard let text = try? String(contentsOf: directory.appendingPathComponent(fileName), encoding: .utf8) else { return nil }
        let id = text.trimmingCharacters(in: .whitespacesAndNewlines)
        return id.count == 32 && id.allSatisfy(\.isHexDigit) ? id : nil
    }

    /// The id in `directory`, made there first when it has none (an install from before ids).
    static func ensure(in directory: URL) throws -> String {
        if let id = read(in: directory) { return id }
        let existing = directory.appendingPathComponent(fileName)
        guard !FileManager.default.fileExists(atPath: existing.path) else {
            throw CommandFailure(
                "\(existing.path) is not an install id (32 hex digits); restore it from a backup of this data directory, never make a new one over it")
        }
        let id = (0..<16).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
        let file = directory.appendingPathComponent(fileName)
        guard FileManager.default.createFile(atPath: file.path, contents: Data((id + "\n").utf8), attributes: [.posixPermissions: 0o600]) else {
            throw CommandFailure("cannot create the install id \(file.path); check that \(directory.path) is writable (the id says which install its data is)")
        }
        return id
    }
}
