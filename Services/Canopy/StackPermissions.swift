import Foundation
import Glibc

/// A stack's data directory is its owner's alone: stores, photos, logs (which hold the demo
/// token), the token key and the stack id. New files are made so by the umask `canopy up` and
/// every service set; this brings a directory made before (0755 and 0644) to the same modes.
enum StackPermissions {
    /// Makes every directory under `root` (and `root`) 0700 and every file 0600, where group
    /// or others could read them. Symbolic links are not followed.
    static func restrict(_ root: URL) {
        tighten(root.path, directory: true)
        guard let walk = FileManager.default.enumerator(at: root, includingPropertiesForKeys: [.isDirectoryKey, .isSymbolicLinkKey]) else { return }
        for case let url as URL in walk {
            guard let values = try? url.resourceValues(forKeys: [.isDirectoryKey, .isSymbolicLinkKey]), values.isSymbolicLink != true else { continue }
            tighten(url.path, directory: values.isDirectory == true)
        }
    }

    private static func tighten(_ path: String, directory: Bool) {
        var status = stat()
        guard lstat(path, &status) == 0, status.st_mode & 0o077 != 0 else { return }
        chmod(path, directory ? 0o700 : (status.st_mode & 0o700 | 0o600))
    }
}
