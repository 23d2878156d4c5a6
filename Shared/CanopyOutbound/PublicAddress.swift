import NIOCore

/// The one rule for addresses that people name (webhooks, ntfy topics, remote photos): the
/// server must not be made to call into its own network. An address is *internal* when it is
/// loopback, unspecified, private (RFC 1918, unique local), shared (CGNAT), link-local (cloud
/// metadata lives there), site-local, multicast, reserved or broadcast, and also when it is one
/// of those written as IPv6: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`),
/// NAT64 (`64:ff9b::a.b.c.d`, and the local-use `64:ff9b:1::/48` as a whole), 6to4
/// (`2002:AABB:CCDD::`) and Teredo (`2001::/32`, whose inner address cannot be trusted).
public enum PublicAddress {
    /// Whether raw address bytes (4 for IPv4, 16 for IPv6) are internal. Anything else is.
    public static func isInternal(_ bytes: some Collection<UInt8>) -> Bool {
        let bytes = Array(bytes)
        switch bytes.count {
        case 4: return isInternal(ipv4: bytes.reduce(0) { $0 << 8 | UInt32($1) })
        case 16: return isInternal(ipv6: bytes)
        default: return true
        }
    }

    /// Whether a socket address is internal (a Unix domain socket always is).
    public static func isInternal(_ address: SocketAddress) -> Bool {
        switch address {
        case .v4(let v4): isInternal(ipv4: UInt32(bigEndian: v4.address.sin_addr.s_addr))
        case .v6(let v6): isInternal(ipv6: withUnsafeBytes(of: v6.address.sin6_addr) { Array($0) })
        case .unixDomainSocket: true
        }
    }

    static func isInternal(ipv4 address: UInt32) -> Bool {
        func within(_ base: UInt32, _ bits: UInt32) -> Bool { address >> (32 - bits) == base >> (32 - bits) }
        return within(0x0000_0000, 8) // 0.0.0.0/8
            || within(0x0A00_0000, 8) // 10/8
            || within(0x6440_0000, 10) // 100.64/10 shared (CGNAT)
            || within(0x7F00_0000, 8) // 127/8 loopback
            || within(0xA9FE_0000, 16) // 169.254/16 link-local
            || within(0xAC10_0000, 12) // 172.16/12
            || within(0xC000_0000, 24) // 192.0.0/24 protocol assignments
            || within(0xC0A8_0000, 16) // 192.168/16
            || within(0xC612_0000, 15) // 198.18/15 benchmarking
            || within(0xE000_0000, 4) // multicast
            || address >= 0xF000_0000 // reserved and broadcast
    }

    static func isInternal(ipv6 bytes: [UInt8]) -> Bool {
        func embedded(_ offset: Int) -> UInt32 { bytes[offset..<offset + 4].reduce(0) { $0 << 8 | UInt32($1) } }
        let zeroPrefix = bytes[0..<10].allSatisfy { $0 == 0 }
        if zeroPrefix && bytes[10] == 0xFF && bytes[11] == 0xFF { return isInternal(ipv4: embedded(12)) } // ::ffff:a.b.c.d
        if zeroPrefix && bytes[10] == 0 && bytes[11] == 0 {
            return true // :: and ::1, and every IPv4-compatible ::a.b.c.d (deprecated; nothing public uses it)
        }
        if bytes[0..<12] == [0x00, 0x64, 0xFF, 0x9B, 0, 0, 0, 0, 0, 0, 0, 0] { return isInternal(ipv4: embedded(12)) } // NAT64 64:ff9b::/96
        if bytes[0..<6] == [0x00, 0x64, 0xFF, 0x9B, 0x00, 0x01] { return true } // local-use NAT64 64:ff9b:1::/48
        if bytes[0] == 0x20 && bytes[1] == 0x02 { return isInternal(ipv4: embedded(2)) } // 6to4 2002::/16
        if bytes[0..<4] == [0x20, 0x01, 0x00, 0x00] { return true } // Teredo 2001::/32
        if bytes[0] == 0xFE && bytes[1] & 0xC0 == 0x80 { return true } // fe80::/10 link-local
        if bytes[0] == 0xFE && bytes[1] & 0xC0 == 0xC0 { return true } // fec0::/10 site-local
        if bytes[0] & 0xFE == 0xFC { return true } // fc00::/7 unique local
        if bytes[0..<4] == [0x20, 0x01, 0x0D, 0xB8] { return true } // 2001:db8::/32 documentation
        return bytes[0] == 0xFF // multicast
    }
}
