import Glibc

/// Ports for tests that start real processes, which need a port before they listen.
public enum FreePorts {
    /// A TCP port nothing on 127.0.0.1 listens on right now (the system's choice, then released).
    public static func any() -> Int {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(descriptor) }
        var address = loopback(port: 0)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, length) } }
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) } }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    /// A free port with `count` more free ports after it (for executables that take a base port).
    public static func run(of count: Int) -> Int {
        for _ in 0..<100 {
            let port = any()
            guard port + count < 65_535 else { continue }
            if (1...max(1, count)).allSatisfy({ isFree(port + $0) }) { return port }
        }
        return any()
    }

    /// Whether nothing listens on `port` of 127.0.0.1 now.
    public static func isFree(_ port: Int) -> Bool {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(descriptor) }
        var address = loopback(port: port)
        return withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } } == 0
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
