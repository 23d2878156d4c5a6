import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Originals on disk, content-addressed: one file per photo, named by the SHA-256 of the bytes
/// uploaded, in a directory that one process owns (SQLite) or every replica mounts (a shared
/// volume: NFS, EFS, CephFS, with PostgreSQL). A file is written under a temporary name,
/// synced, renamed into place and its directory synced, so a reader (on any replica) sees
/// either no file or the whole of it, also after a crash or a power loss.
struct PhotoFiles: Sendable {
    let directory: URL
    /// Temporary files start with this; a sweep removes old ones (a writer that died).
    static let temporaryPrefix = ".tmp-"

    init(directory: URL) throws {
        self.directory = directory
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    }

    func url(_ sha256: String) -> URL {
        directory.appendingPathComponent(sha256)
    }

    func exists(_ sha256: String) -> Bool {
        FileManager.default.fileExists(atPath: url(sha256).path)
    }

    func read(_ sha256: String) throws -> [UInt8] {
        [UInt8](try Data(contentsOf: url(sha256)))
    }

    /// Writes the original durably (see the type's summary); returns its size in bytes.
    @discardableResult
    func write(_ bytes: [UInt8], as sha256: String) throws -> Int {
        let temporary = directory.appendingPathComponent(Self.temporaryPrefix + UUID().uuidString)
        let descriptor = open(temporary.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { throw Failure(description: "cannot create \(temporary.path): \(String(cString: strerror(errno)))") }
        do {
            var written = 0
            while written < bytes.count {
                let count = bytes.withUnsafeBytes { Glibc.write(descriptor, $0.baseAddress! + written, $0.count - written) }
                guard count > 0 else {
                    if count < 0 && errno == EINTR { continue }
                    throw Failure(description: "cannot write \(temporary.path): \(String(cString: strerror(errno)))")
                }
                written += count
            }
            guard fsync(descriptor) == 0 else { throw Failure(description: "cannot sync \(temporary.path): \(String(cString: strerror(errno)))") }
            close(descriptor)
        } catch {
            close(descriptor)
            unlink(temporary.path)
            throw error
        }
        guard rename(temporary.path, url(sha256).path) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(temporary.path)
            throw Failure(description: "cannot move the original into \(directory.path): \(reason)")
        }
        syncDirectory()
        return bytes.count
    }

    /// Throws, with a sentence naming the directory, unless a file can be created in it and
    /// removed again: what an upload needs (`/health` asks, so a photo volume this user
    /// cannot write is reported, not found by the first upload's 500).
    func checkWritable() throws {
        let probe = directory.appendingPathComponent(Self.temporaryPrefix + "health-" + UUID().uuidString)
        let descriptor = open(probe.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            throw Failure(
                description:
                    "cannot create files in \(directory.path) (\(String(cString: strerror(errno)))); give the service's user (uid \(getuid())) write access to it"
            )
        }
        close(descriptor)
        unlink(probe.path)
    }

    /// Removes the original (nothing when it is not there).
    func remove(_ sha256: String) {
        unlink(url(sha256).path)
    }

    /// Every file's name and when it was last changed (originals and temporary files).
    func entries() throws -> [(name: String, modified: Date)] {
        try FileManager.default.contentsOfDirectory(at: directory, includingPropertiesForKeys: [.contentModificationDateKey]).map { url in
            (url.lastPathComponent, (try? url.resourceValues(forKeys: [.contentModificationDateKey]).contentModificationDate) ?? .distantPast)
        }
    }

    /// Makes the rename durable: a directory entry survives a power loss once its directory is synced.
    private func syncDirectory() {
        let descriptor = open(directory.path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard descriptor >= 0 else { return }
        _ = fsync(descriptor)
        close(descriptor)
    }

    /// A file that could not be written or moved, with the system's reason.
    struct Failure: Error, CustomStringConvertible {
        let description: String
    }
}
