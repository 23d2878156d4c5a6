import CanopyBus
import CanopyDeployment
import CanopyServiceKit
import Foundation
import Glibc

/// A local stack's CurveZMQ keys (`<data-dir>/keys`): made on its first `canopy up`, so that
/// on one machine too only the stack's own processes can serve or call. Each service serves
/// with its own key, for its own service alone; canopy-api and the operator's CLI call with
/// theirs; any other local process has none and is refused at the handshake (a worker
/// pretending to be a service, a client naming someone as the principal). Two stacks on one
/// machine each have their own keys.
struct StackKeys {
    let files: CanopyStack.CurveFiles

    init(dataDirectory: URL) {
        files = CanopyStack.CurveFiles(directory: dataDirectory.appendingPathComponent("keys", isDirectory: true).path)
    }

    /// Makes the key pairs that are missing (secret halves 0600, in a 0700 directory) and
    /// writes the brokers' allow-list anew from the public halves.
    func ensure() throws {
        try FileManager.default.createDirectory(atPath: files.directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        chmod(files.directory, 0o700)
        let names = [CanopyStack.CurveFiles.broker] + CanopyStack.CurveFiles.workers + CanopyStack.CurveFiles.clients
        for name in names where !FileManager.default.fileExists(atPath: files.secretKey(name)) || !FileManager.default.fileExists(atPath: files.publicKey(name))
        {
            let pair: CurveKeyPair
            do { pair = try CurveKeyPair.generate() } catch { throw CommandFailure("\(error)") }
            try Self.write(Curve.secretKeyFile(pair, name: name), to: URL(fileURLWithPath: files.secretKey(name)), mode: 0o600)
            try Self.write(Curve.publicKeyFile(pair, name: name), to: URL(fileURLWithPath: files.publicKey(name)), mode: 0o600)
        }
        var allow = "# Made by canopy up from the .pub files beside it; made again at every start.\n"
        for name in CanopyStack.CurveFiles.workers { allow += "worker \(try publicKey(name)) \(name)\n" }
        for name in CanopyStack.CurveFiles.clients { allow += "client \(try publicKey(name))\n" }
        try Self.write(allow, to: URL(fileURLWithPath: files.allowList), mode: 0o600)
    }

    /// The public key in `name.pub`.
    func publicKey(_ name: String) throws -> String {
        do { return try Curve.publicKey(files.publicKey(name)) } catch let error as Curve.KeyError { throw CommandFailure(error.description) }
    }

    /// The operator's client settings for the stack whose keys are in `dataDirectory`, or nil
    /// when it has none (no stack with CurveZMQ ever started there).
    static func operatorSettings(dataDirectory: URL) throws -> CurveClientSettings? {
        let keys = StackKeys(dataDirectory: dataDirectory)
        guard FileManager.default.fileExists(atPath: keys.files.secretKey("operator")) else { return nil }
        do {
            return CurveClientSettings(
                serverKeys: [try Curve.publicKey(keys.files.publicKey(CanopyStack.CurveFiles.broker))],
                keyPair: try Curve.readKeyPair(file: keys.files.secretKey("operator")))
        } catch let error as Curve.KeyError {
            throw CommandFailure("the stack's keys in \(keys.files.directory) cannot be read: \(error.description)")
        }
    }

    /// Creates the file with `mode` before anything is written to it, so a secret key is never
    /// readable by others, not even for a moment; replaces what was there.
    static func write(_ text: String, to file: URL, mode: mode_t) throws {
        unlink(file.path)
        let descriptor = open(file.path, O_WRONLY | O_CREAT | O_EXCL, mode)
        guard descriptor >= 0 else { throw CommandFailure("cannot create \(file.path): \(String(cString: strerror(errno)))") }
        defer { close(descriptor) }
        fchmod(descriptor, mode) // whatever the umask
        let bytes = Array(text.utf8)
        guard Glibc.write(descriptor, bytes, bytes.count) == bytes.count else {
            throw CommandFailure("cannot write \(file.path): \(String(cString: strerror(errno)))")
        }
    }
}

extension CommonOptions {
    /// A bus client configuration for the operator's CLI: these options', and, when they name
    /// no CurveZMQ key, the operator key of the local stack in `stack`'s data directory
    /// (`--data-dir`, `CANOPY_DATA_DIR`, `./.canopy`) when that stack's brokers are the ones
    /// addressed, so `canopy send`, `canopy stats` and the rest reach a `canopy up` stack by
    /// themselves (and never offer its key to another broker).
    func operatorConfiguration(stack: StackOptions) throws -> BusClient.Configuration {
        var configuration = try clientConfiguration()
        if configuration.curve == nil, let state = stack.layout.state(), state.curve == true,
            !Set(state.endpoint.split(separator: ",").map(String.init)).isDisjoint(with: configuration.endpoints),
            let keys = try StackKeys.operatorSettings(dataDirectory: stack.layout.dataDirectory)
        {
            configuration.curve = keys
        }
        return configuration
    }
}
