import ArgumentParser
import CanopyBus
import CanopyServiceKit
import Foundation

/// `canopy keys`: CurveZMQ key pairs for the broker, its workers and clients.
struct Keys: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Make CurveZMQ key pairs for the bus.",
        subcommands: [Generate.self])

    /// `canopy keys generate NAME`: writes NAME.key (secret, mode 0600) and NAME.pub.
    struct Generate: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write a new key pair: NAME.key (secret, readable by its owner only) and NAME.pub.",
            discussion: """
                The broker runs with its .key file (canopy-broker serve --curve-secret-key-file broker.key);
                every worker and client is given the broker's .pub and its own .key, and the broker's
                allow-list (--curve-allow) names each worker's public key with its services.

                Example:
                  canopy keys generate broker --directory ./keys
                  canopy keys generate care --directory ./keys
                  echo "worker $(sed -n 's/^public-key = //p' keys/care.pub) care" >> keys/allow
                """)

        @Argument(help: ArgumentHelp("The key pair's name, e.g. broker, care or edge.", valueName: "name"))
        var name: String

        @Option(help: ArgumentHelp("Where to write the files.", valueName: "directory"))
        var directory: String = "."

        @Flag(help: "Replace files that exist already.")
        var force = false

        func validate() throws {
            guard !name.isEmpty, name.utf8.count <= 64, name.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" || $0 == "." }), !name.hasPrefix(".") else {
                throw ValidationError("the name is 1 to 64 letters, digits, '-', '_' or '.', such as broker or care")
            }
        }

        func run() throws {
            let pair: CurveKeyPair
            do {
                pair = try CurveKeyPair.generate()
            } catch {
                throw CommandFailure("\(error)")
            }
            let folder = URL(fileURLWithPath: directory, isDirectory: true)
            try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
            let secretFile = folder.appendingPathComponent("\(name).key")
            let publicFile = folder.appendingPathComponent("\(name).pub")
            for file in [secretFile, publicFile] where FileManager.default.fileExists(atPath: file.path) && !force {
                throw CommandFailure("\(file.path) exists already; choose another name, or pass --force to replace it")
            }
            try write(Curve.secretKeyFile(pair, name: name), to: secretFile, mode: 0o600)
            try write(Curve.publicKeyFile(pair, name: name), to: publicFile, mode: 0o644)
            print("wrote \(secretFile.path) (secret: keep it to this peer) and \(publicFile.path)")
            print("public key: \(pair.publicKey)")
        }

        /// Creates the file with `mode` before anything is written to it, so the secret key is
        /// never readable by others, not even for a moment.
        private func write(_ text: String, to file: URL, mode: mode_t) throws {
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
}
