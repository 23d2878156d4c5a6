import Crypto
import Foundation

/// Stable pseudonyms for one capture: a keyed hash (HMAC-SHA-256 under a key made for the
/// capture and never written down) of a socket identity or a principal. The same peer or
/// person gets the same pseudonym throughout the capture, and different ones stay
/// different, so replay still keeps people apart; without the key nobody can go back.
/// A snapshot taken with the capture (`canopy capture start --snapshot --pseudonymize`)
/// names people by the same pseudonyms: its caller gives the key to both.
public struct Pseudonyms {
    private let key: SymmetricKey
    private var peers: [[UInt8]: String] = [:]
    private var principals: [String: String] = [:]
    /// Most names remembered of each kind (then forgotten and hashed again).
    private static let remembered = 65_536

    public init(key: SymmetricKey = SymmetricKey(size: .bits256)) {
        self.key = key
    }

    /// A client's or worker's pseudonym: `prefix` and 12 hexadecimal characters.
    mutating func peer(_ identity: [UInt8], prefix: String) -> String {
        guard !identity.isEmpty else { return "" }
        if let known = peers[identity] { return known }
        if peers.count >= Self.remembered { peers.removeAll(keepingCapacity: true) }
        let name = prefix + hex(identity, characters: 12)
        peers[identity] = name
        return name
    }

    /// A principal's pseudonym: `p-` and 24 hexadecimal characters (a valid principal
    /// itself). The empty principal stays empty.
    public mutating func principal(_ principal: String) -> String {
        guard !principal.isEmpty else { return "" }
        if let known = principals[principal] { return known }
        if principals.count >= Self.remembered { principals.removeAll(keepingCapacity: true) }
        let name = "p-" + hex(Array(principal.utf8), characters: 24)
        principals[principal] = name
        return name
    }

    /// `body` with every person named in it replaced by their pseudonym: the request's
    /// principal, and the values of `principal` and `owner` fields anywhere in a JSON body
    /// (multi-key lookups name one person per key). Bodies that name nobody are returned
    /// as they are.
    mutating func body(_ body: [UInt8], principal: String) -> [UInt8] {
        var names: Set<String> = principal.isEmpty ? [] : [principal]
        if Self.mayNamePeople(body), let json = try? JSONSerialization.jsonObject(with: Data(body), options: [.fragmentsAllowed]) {
            Self.collectPeople(json, into: &names)
        }
        guard !names.isEmpty else { return body }
        var out = body
        // Longest first: a principal that contains another is replaced whole.
        for name in names.sorted(by: { $0.utf8.count > $1.utf8.count }) {
            let pseudonym = Array("\"\(self.principal(name))\"".utf8)
            for form in Self.jsonForms(of: name) { out = Self.replacing(form, with: pseudonym, in: out) }
        }
        return out
    }

    private func hex(_ bytes: [UInt8], characters: Int) -> String {
        let mac = HMAC<SHA256>.authenticationCode(for: bytes, using: key)
        return mac.prefix(characters / 2).map { byte in
            let text = String(byte, radix: 16)
            return text.count == 1 ? "0" + text : text
        }.joined()
    }

    private static let fieldMarkers = [Array("\"principal\"".utf8), Array("\"owner\"".utf8)]

    private static func mayNamePeople(_ body: [UInt8]) -> Bool {
        fieldMarkers.contains { marker in body.firstRange(of: marker) != nil }
    }

    private static func collectPeople(_ json: Any, into names: inout Set<String>) {
        if let object = json as? [String: Any] {
            for (key, value) in object {
                if key == "principal" || key == "owner", let name = value as? String, !name.isEmpty {
                    names.insert(name)
                } else {
                    collectPeople(value, into: &names)
                }
            }
        } else if let array = json as? [Any] {
            for element in array { collectPeople(element, into: &names) }
        }
    }

    /// How a principal appears as a JSON string: quoted, with `"` and `\` escaped (the
    /// codec does not escape `/`; another encoder might).
    private static func jsonForms(of name: String) -> [[UInt8]] {
        var escaped = ""
        for character in name.unicodeScalars {
            switch character {
            case "\"": escaped += "\\\""
            case "\\": escaped += "\\\\"
            default: escaped.unicodeScalars.append(character)
            }
        }
        var forms = [Array("\"\(escaped)\"".utf8)]
        if escaped.contains("/") { forms.append(Array("\"\(escaped.replacingOccurrences(of: "/", with: "\\/"))\"".utf8)) }
        return forms
    }

    private static func replacing(_ target: [UInt8], with replacement: [UInt8], in bytes: [UInt8]) -> [UInt8] {
        guard bytes.firstRange(of: target) != nil else { return bytes }
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var rest = bytes[...]
        while let range = rest.firstRange(of: target) {
            out.append(contentsOf: rest[..<range.lowerBound])
            out.append(contentsOf: replacement)
            rest = rest[range.upperBound...]
        }
        out.append(contentsOf: rest)
        return out
    }
}
