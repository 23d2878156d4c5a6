import Crypto
import Foundation

/// How a sign-out names its person in canopy-api's store: a keyed hash of the person's id
/// (HMAC-SHA256 under a key derived from each token signing key, hex), never the id. A
/// deleted account's sign-out must outlive the person (their tokens live up to a year), but
/// must not keep who they were in a file: the digest refuses their tokens and names nobody to
/// whoever reads the store, and without the token key it cannot be checked against a guess.
public struct SignOutDigest: Sendable {
    /// One key per token signing key, the signing one first.
    private let keys: [SymmetricKey]

    /// - Parameter tokenKeys: canopy-api's token signing keys, the newest first.
    public init(tokenKeys: [[UInt8]]) {
        precondition(!tokenKeys.isEmpty, "sign-outs are digested under the token signing keys; canopy-api has one at least")
        keys = tokenKeys.map { material in
            HKDF<SHA256>.deriveKey(inputKeyMaterial: SymmetricKey(data: material), info: Data("canopy sign-out digest".utf8), outputByteCount: 32)
        }
    }

    /// What a sign-out of `person` records: the digest under the signing key.
    public func record(_ person: String) -> String {
        Self.digest(person, keys[0])
    }

    /// Every digest a sign-out of `person` may have been recorded under: one per key, so
    /// sign-outs recorded before a key rotation keep working.
    public func candidates(_ person: String) -> [String] {
        keys.map { Self.digest(person, $0) }
    }

    private static func digest(_ person: String, _ key: SymmetricKey) -> String {
        HMAC<SHA256>.authenticationCode(for: Data(person.utf8), using: key).map { String(format: "%02x", $0) }.joined()
    }
}
