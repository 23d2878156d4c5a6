import CanopyBus
import CanopyTesting
import Foundation
import Testing

/// A public key is given as its Z85 text or as the path of its `.pub` file.
struct CurveKeyFileTests {
    /// A path of exactly 40 characters is all Z85 characters too (`canopy up --data-dir
    /// "$(mktemp -d)/data"` made one: `/tmp/tmp.XXXXXXXXXX/data/keys/broker.pub`); the file it
    /// names is read, not the path taken for a key.
    @Test func aKeyFileWhosePathHasFortyCharactersIsReadAsAFile() throws {
        let root = URL(fileURLWithPath: "/tmp/cnp-\(UUID().uuidString.prefix(8).lowercased())")
        defer { try? FileManager.default.removeItem(at: root) }
        let pair = try CurveKeyPair.generate()
        let file = root.appendingPathComponent("keys/broker.pub").path
        let padding = 40 - file.count
        let path = root.appendingPathComponent("keys" + String(repeating: "k", count: max(0, padding)) + "/broker.pub").path
        try #require(path.count == 40, "\(path)")
        try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        try Data(Curve.publicKeyFile(pair, name: "broker").utf8).write(to: URL(fileURLWithPath: path))
        #expect(try Curve.publicKey(path) == pair.publicKey)
        #expect(try Curve.publicKey(pair.publicKey) == pair.publicKey, "the key itself still is one")
    }
}
