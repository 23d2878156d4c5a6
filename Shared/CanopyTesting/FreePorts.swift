import Glibc
import Synchronization

/// Ports for tests that start real processes, which need a port before they listen.
public enum FreePorts {
    /// A TCP port nothing on 127.0.0.1 uses right now, below the system's ephemeral range
    /// (`ip_local_port_range`): a port from that range may be given to any process's outgoing
    /// connection between the choice and the listen, and a service of a test stack would then
    /// stop at start with its port taken.
    public static func any() -> Int {
        run(of: 0)
    }

    /// A free port with `count` more free ports after it (for executables that take a base port).
    /// A port handed out once is not handed out again by this process: two tests running at
    /// once would otherwise both be given a port neither listens on yet.
    public static func run(of count: Int) -> Int {
        let floor = 10_000
        let ceiling = max(floor + 1_000, ephemeralStart() - count - 1)
        for _ in 0..<1_000 {
            let port = Int.random(in: floor..<ceiling)
            let ports = port...(port + count)
            guard (0...count).allSatisfy({ isFree(port + $0) }) else { continue }
            let taken = handedOut.withLock { handedOut in
                guard !ports.contains(where: handedOut.contains) else { return true }
                handedOut.formUnion(ports)
                return false
            }
            if !taken { return port }
        }
        return systemChoice()
    }

    /// Every port ``run(of:)`` handed out in this process.
    private static let handedOut = Mutex<Set<Int>>([])

    /// The first port of the system's ephemeral range (32768 when it cannot be read).
    static func ephemeralStart() -> Int {
        guard let file = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r") else { return 32_768 }
        defer { fclose(file) }
        var line = [CChar](repeating: 0, count: 64)
        guard fgets(&line, Int32(line.count), file) != nil else { return 32_768 }
        let text = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return text.split(whereSeparator: { $0 == " " || $0 == "\t" }).first.flatMap { Int($0) } ?? 32_768
    }

    /// The system's choice of a free port (from the ephemeral range), then released.
    private static func systemChoice() -> Int {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(descriptor) }
        var address = loopback(port: 0)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, length) } }
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) } }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    /// Whether nothing listens on `port` of 127.0.0.1 now.
    public static func isFree(_ port: Int) -> Bool {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(descriptor) }
        var address = loopback(port: port)
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        } == 0
    }

    /// A port of 127.0.0.1 this process listens on until ``Held/release()``: a port taken, as
    /// another program would take it.
    /// - Parameter port: the port to hold, 0 for one the system chooses.
    public static func hold(_ port: Int = 0) -> Held {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = loopback(port: port)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, length) } }
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) } }
        listen(descriptor, 8)
        return Held(port: Int(UInt16(bigEndian: address.sin_port)), descriptor: descriptor)
    }

    /// A listening port held by this process.
    public final class Held: Sendable {
        public let port: Int
        private let descriptor: Int32

        init(port: Int, descriptor: Int32) {
            self.port = port
            self.descriptor = descriptor
        }

        /// Stops listening.
        public func release() { close(descriptor) }
    }

    private static func loopback(port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = UInt16(port).bigEndian
        return address
    }
}
