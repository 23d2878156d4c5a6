import Foundation
import Glibc
import NIOCore

/// Whether a TCP address can be listened on, asked before anything starts, so that a taken
/// port stops an executable at once with a sentence instead of leaving it half started.
///
/// The check binds a socket with `SO_REUSEADDR` (as the listeners themselves do) and closes it
/// again. The answer can change before the listener binds (another process may take the port
/// in between); the listeners' own bind errors say the same sentence.
public enum PortCheck {
    /// Why an address cannot be listened on.
    public struct Taken: Error, CustomStringConvertible, Equatable {
        /// The address asked for.
        public var address: ListenAddress
        /// What holds it (`canopy-broker (pid 4242, data dir /srv/a)`), when it can be seen.
        public var holder: Holder?
        /// The system's reason when it is not "in use" (`Cannot assign requested address`).
        public var reason: String?

        /// What is wrong, without the address: `is in use by canopy-broker (pid 4242)`.
        public var problem: String {
            if let reason { return "cannot be bound: \(reason)" }
            return "is in use" + (holder.map { " by \($0)" } ?? "")
        }

        public var description: String { "\(address) \(problem)" }
    }

    /// A process seen listening on a port.
    public struct Holder: Equatable, CustomStringConvertible, Sendable {
        public var pid: Int32
        /// Its executable's name.
        public var name: String
        /// The data directory its command line names (`--data-dir`, `--capture-dir`, or the
        /// directory of `--token-key-file`), when it names one.
        public var dataDirectory: String?

        public var description: String {
            "\(name) (pid \(pid)" + (dataDirectory.map { ", data dir \($0)" } ?? "") + ")"
        }
    }

    /// Throws ``Taken`` when `address` cannot be listened on now. Port 0 (the system chooses)
    /// always can.
    public static func check(_ address: ListenAddress) throws {
        guard address.port != 0 else { return }
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_PASSIVE
        var list: UnsafeMutablePointer<addrinfo>?
        let host = address.host == "*" ? "0.0.0.0" : address.host.trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
        let found = getaddrinfo(host, String(address.port), &hints, &list)
        guard found == 0, let first = list else {
            throw Taken(address: address, holder: nil, reason: "the host name does not resolve (\(String(cString: gai_strerror(found))))")
        }
        defer { freeaddrinfo(list) }
        let descriptor = socket(first.pointee.ai_family, first.pointee.ai_socktype, first.pointee.ai_protocol)
        guard descriptor >= 0 else { return } // cannot even ask: let the listener say why
        defer { close(descriptor) }
        var one: Int32 = 1
        setsockopt(descriptor, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        guard bind(descriptor, first.pointee.ai_addr, first.pointee.ai_addrlen) != 0 else { return }
        let code = errno
        if code == EADDRINUSE {
            throw Taken(address: address, holder: holder(ofPort: address.port), reason: nil)
        }
        throw Taken(address: address, holder: nil, reason: String(cString: strerror(code)))
    }

    /// The sentence an executable stops with when `address` is taken: which address, for
    /// what, the option that moves it, and what holds it when that is known.
    ///
    /// - Parameters:
    ///   - purpose: what would have listened there (`/metrics and /health`).
    ///   - option: the flag and variable that choose the address (`--metrics-bind (CANOPY_METRICS_BIND)`).
    public static func ensureFree(_ address: ListenAddress, for purpose: String, option: String) throws {
        do {
            try check(address)
        } catch let taken as Taken {
            throw CommandFailure(sentence(taken, for: purpose, option: option))
        }
    }

    /// The sentence for a taken address (also for a listener's own bind error).
    public static func sentence(_ taken: Taken, for purpose: String, option: String) -> String {
        "cannot listen on \(taken.address) for \(purpose): it \(taken.problem); stop what holds it or choose another address with \(option)"
    }

    /// Runs a listener, turning its bind error for a taken port into the check's sentence.
    public static func translatingBindErrors(
        _ address: ListenAddress, for purpose: String, option: String,
        _ body: () async throws -> Void
    ) async throws {
        do {
            try await body()
        } catch let error as IOError where error.errnoCode == EADDRINUSE {
            throw CommandFailure(sentence(Taken(address: address, holder: holder(ofPort: address.port), reason: nil), for: purpose, option: option))
        }
    }

    // MARK: - Who holds a port (Linux /proc; processes of other users stay unknown)

    /// The process listening on TCP `port`, when this user can see it.
    public static func holder(ofPort port: Int) -> Holder? {
        let inodes = listeningInodes(port: port)
        guard !inodes.isEmpty, let processes = try? FileManager.default.contentsOfDirectory(atPath: "/proc") else { return nil }
        for entry in processes {
            guard let pid = Int32(entry), let descriptors = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(entry)/fd") else { continue }
            for descriptor in descriptors {
                guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(entry)/fd/\(descriptor)"),
                    target.hasPrefix("socket:["), inodes.contains(String(target.dropFirst(8).dropLast()))
                else { continue }
                return describe(pid: pid)
            }
        }
        return nil
    }

    /// The socket inodes listening on `port` (IPv4 and IPv6).
    static func listeningInodes(port: Int) -> Set<String> {
        var inodes = Set<String>()
        let hexPort = String(format: "%04X", port)
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            guard let text = readWhole(table) else { continue }
            for line in text.split(separator: "\n").dropFirst() {
                let fields = line.split(separator: " ", omittingEmptySubsequences: true)
                // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
                guard fields.count > 9, fields[3] == "0A", fields[1].hasSuffix(":" + hexPort) else { continue }
                inodes.insert(String(fields[9]))
            }
        }
        return inodes
    }

    /// A /proc file read to its end (they report size 0, and a read by size sees the first
    /// page at most: a machine with many sockets has a longer table).
    static func readWhole(_ path: String) -> String? {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            bytes += chunk[0..<count]
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// A process's name and the data directory its command line names.
    static func describe(pid: Int32) -> Holder {
        let raw = (try? Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/cmdline"))) ?? Data()
        let arguments = raw.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
        let name = arguments.first.map { URL(fileURLWithPath: $0).lastPathComponent } ?? "pid \(pid)"
        var directory: String?
        for (index, argument) in arguments.enumerated() where index + 1 < arguments.count {
            switch argument {
            case "--data-dir", "--capture-dir": directory = arguments[index + 1]
            case "--token-key-file": directory = directory ?? URL(fileURLWithPath: arguments[index + 1]).deletingLastPathComponent().path
            default: continue
            }
        }
        return Holder(pid: pid, name: name, dataDirectory: directory)
    }
}

extension ListenAddress {
    /// The host and port of a ZeroMQ `tcp://HOST:PORT` endpoint (`*` for every address);
    /// `nil` for other transports and for `tcp://HOST:*`.
    public init?(zeroMQEndpoint endpoint: String) {
        guard endpoint.hasPrefix("tcp://") else { return nil }
        let rest = endpoint.dropFirst(6)
        guard let colon = rest.lastIndex(of: ":"), let port = Int(rest[rest.index(after: colon)...]), (1...65_535).contains(port) else { return nil }
        self.init(host: String(rest[..<colon]), port: port)
    }
}
