import ArgumentParser
import CanopyBus
import CanopyDeployment
import CanopyServiceKit
import Foundation
import Glibc

/// `canopy keys`: CurveZMQ key pairs for the broker, its workers and clients.
struct Keys: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Make CurveZMQ key pairs for the bus.",
        subcommands: [Generate.self, Reload.self])

    /// `canopy keys reload`: the broker reads its allow-list again (SIGHUP).
    struct Reload: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Make a running broker read its allow-list (--curve-allow) again: removed keys stop working at once.",
            discussion: """
                Sends SIGHUP to the broker: the broker of the local stack in --data-dir (canopy up), or the
                process --pid names. Handshakes from then on go by the new list; workers whose key no
                longer serves their service are disconnected, and requests from keys no longer on it are
                refused. A list that does not parse is logged and the old one kept.
                In containers: docker compose kill -s HUP broker.
                Examples:
                  canopy keys reload --data-dir /srv/canopy
                  canopy keys reload --pid 4242
                """)

        @OptionGroup var stack: StackOptions
        @Option(help: ArgumentHelp("The broker's process id (instead of the local stack's broker).", valueName: "pid"))
        var pid: Int32?

        func run() throws {
            let target: Int32
            if let pid {
                target = pid
            } else {
                guard let state = stack.layout.state(), state.supervisorAlive,
                    let broker = state.services.first(where: { $0.name == CanopyStack.broker.name }), broker.pid > 0
                else {
                    throw CommandFailure("no stack runs from \(stack.layout.dataDirectory.path); give the broker's --pid, or the stack's --data-dir")
                }
                target = broker.pid
            }
            guard kill(target, SIGHUP) == 0 else {
                throw CommandFailure("cannot signal process \(target): \(String(cString: strerror(errno))); is it the broker, and yours?")
            }
            print("asked the broker (pid \(target)) to read its allow-list again; its log says what it read (broker.curve.reloaded)")
        }
    }

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
            guard !name.isEmpty, name.utf8.count <= 64, name.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" || $0 == "." }),
                !name.hasPrefix(".")
            else {
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
            try StackKeys.write(Curve.secretKeyFile(pair, name: name), to: secretFile, mode: 0o600)
            try StackKeys.write(Curve.publicKeyFile(pair, name: name), to: publicFile, mode: 0o644)
            print("wrote \(secretFile.path) (secret: keep it to this peer) and \(publicFile.path)")
            print("public key: \(pair.publicKey)")
        }
    }
}
