import CanopyMessages
import Crypto
import Foundation

/// A photo's id everywhere in Canopy: SHA-256 of its bytes as they arrived, lower-case
/// hexadecimal. canopy-images files photos under it, and canopy-identify recognises a
/// submission by it before anything is stored, so both compute it here.
public enum PhotoID {
    public static func of<Bytes: DataProtocol>(_ bytes: Bytes) -> String {
        SHA256.hash(data: bytes).lowercaseHex
    }
}
