import Foundation

/// A directory of its own under the system's temporary directory, for one test's files;
/// `remove()` deletes it with everything in it.
public struct TemporaryDirectory: Sendable {
    public let url: URL

    /// Creates `canopy-<label>-<uuid>`.
    public init(_ label: String) throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-\(label)-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    /// The path of `name` in it.
    public func path(_ name: String) -> String { url.appendingPathComponent(name).path }

    public func remove() { try? FileManager.default.removeItem(at: url) }
}
