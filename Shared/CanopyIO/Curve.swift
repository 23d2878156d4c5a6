import CZeroMQ
import Foundation

// CurveZMQ keys for every peer of the bus: key pairs, key files and a client's settings. The
// broker's side (the allow-list and the ZAP handler) is in CanopyBroker. Secret keys are never
// logged or put in an error message; errors name the file instead.

// MARK: - Keys

/// A CurveZMQ key pair, both halves as Z85 text (40 characters each).
public struct CurveKeyPair: Sendable, Equatable {
    /// The public key: safe to share, it goes on allow-lists.
    public let publicKey: String
    /// The secret key: keep it in a file readable by its owner only.
    public let secretKey: String

    /// A fresh key pair from libzmq (`zmq_curve_keypair`).
    public static func generate() throws -> CurveKeyPair {
        guard Curve.isAvailable else { throw Curve.unavailable }
        var publicKey = [CChar](repeating: 0, count: 41)
        var secretKey = [CChar](repeating: 0, count: 41)
        guard zmq_curve_keypair(&publicKey, &secretKey) == 0 else { throw ZMQError("zmq_curve_keypair") }
        return CurveKeyPair(publicKey: Curve.text(publicKey), secretKey: Curve.text(secretKey))
    }

    /// The key pair of a secret key (the public half is derived with `zmq_curve_public`).
    ///
    /// - Throws: ``Curve/KeyError`` when `secretKey` is not 40 characters of Z85.
    public init(secretKey: String) throws {
        guard Curve.isKey(secretKey) else { throw Curve.KeyError("the secret key is not 40 characters of Z85 (canopy keys generate makes one)") }
        guard Curve.isAvailable else { throw Curve.unavailable }
        var publicKey = [CChar](repeating: 0, count: 41)
        guard zmq_curve_public(&publicKey, secretKey) == 0 else { throw Curve.KeyError("the secret key is not a valid CurveZMQ key") }
        self.init(publicKey: Curve.text(publicKey), secretKey: secretKey)
    }

    private init(publicKey: String, secretKey: String) {
        self.publicKey = publicKey
        self.secretKey = secretKey
    }
}

/// CurveZMQ helpers: availability, key text, and the key files `canopy keys generate` writes.
public enum Curve {
    /// A key, key file or allow-list that cannot be used; the message says what to fix.
    public struct KeyError: Error, CustomStringConvertible, Sendable {
        /// What is wrong and what to do.
        public let description: String
        /// - Parameter description: what is wrong and what to do.
        public init(_ description: String) { self.description = description }
    }

    /// Whether this libzmq was built with CURVE (Debian's is).
    public static var isAvailable: Bool { zmq_has("curve") == 1 }

    static let unavailable = KeyError("this libzmq was built without CURVE; install Debian's libzmq3-dev (built with libsodium)")

    private static let alphabet = Set("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#".utf8)

    /// Whether `text` looks like a Z85 key: exactly 40 characters of the Z85 alphabet.
    public static func isKey(_ text: String) -> Bool {
        text.utf8.count == 40 && text.utf8.allSatisfy { alphabet.contains($0) }
    }

    /// A 32-byte binary key as Z85 text.
    package static func z85(_ bytes: [UInt8]) -> String? {
        guard bytes.count == 32 else { return nil }
        var text = [CChar](repeating: 0, count: 41)
        guard zmq_z85_encode(&text, bytes, 32) != nil else { return nil }
        return Curve.text(text)
    }

    static func text(_ characters: [CChar]) -> String {
        String(decoding: characters.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    // MARK: Key files

    /// The text of a secret key file: both keys, one `name = value` per line.
    public static func secretKeyFile(_ pair: CurveKeyPair, name: String) -> String {
        """
        # Canopy CurveZMQ key pair "\(name)". Keep this file secret: it holds the secret key.
        public-key = \(pair.publicKey)
        secret-key = \(pair.secretKey)

        """
    }

    /// The text of a public key file.
    public static func publicKeyFile(_ pair: CurveKeyPair, name: String) -> String {
        """
        # Canopy CurveZMQ public key "\(name)": put it on the broker's allow-list.
        public-key = \(pair.publicKey)

        """
    }

    /// Reads the key pair from a secret key file (as `canopy keys generate` writes it).
    public static func readKeyPair(file path: String) throws -> CurveKeyPair {
        guard let secret = try field("secret-key", in: path) else {
            throw KeyError("\(path) has no 'secret-key = ...' line; make one with canopy keys generate")
        }
        do {
            return try CurveKeyPair(secretKey: secret)
        } catch let error as KeyError {
            throw KeyError("\(path): \(error.description)")
        }
    }

    /// A public key given as Z85 text, or read from a file with a `public-key = ...` line. A
    /// file that exists wins: a 40-character path (`/tmp/tmp.AbCdEfGhIj/data/keys/broker.pub`)
    /// is all Z85 characters too.
    public static func publicKey(_ textOrPath: String) throws -> String {
        if isKey(textOrPath) && !FileManager.default.fileExists(atPath: textOrPath) { return textOrPath }
        guard let key = try field("public-key", in: textOrPath), isKey(key) else {
            throw KeyError("'\(textOrPath)' is neither a 40-character Z85 public key nor a file with a 'public-key = ...' line")
        }
        return key
    }

    private static func field(_ name: String, in path: String) throws -> String? {
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw KeyError("cannot read the key file \(path); check the path and that this user may read it")
        }
        for line in text.split(whereSeparator: \.isNewline) {
            let parts = line.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
            if parts.count == 2, parts[0] == name { return parts[1] }
        }
        return nil
    }
}

/// How a client or worker connects to a broker that runs CurveZMQ.
public struct CurveClientSettings: Sendable {
    /// The brokers' public keys, in the order of their endpoints: each broker has a key pair
    /// of its own (one key for all when they share one).
    public var serverKeys: [String]
    /// This peer's key pair; its public key must be on every broker's allow-list.
    public var keyPair: CurveKeyPair

    /// The first broker's public key; setting it names that key alone.
    public var serverKey: String {
        get { serverKeys[0] }
        set { serverKeys = [newValue] }
    }

    /// - Parameters:
    ///   - serverKey: the broker's public key (Z85).
    ///   - keyPair: this peer's key pair.
    public init(serverKey: String, keyPair: CurveKeyPair) {
        serverKeys = [serverKey]
        self.keyPair = keyPair
    }

    /// - Parameters:
    ///   - serverKeys: the brokers' public keys (Z85), in the order of their endpoints.
    ///   - keyPair: this peer's key pair.
    public init(serverKeys: [String], keyPair: CurveKeyPair) {
        precondition(!serverKeys.isEmpty, "at least one broker key")
        self.serverKeys = serverKeys
        self.keyPair = keyPair
    }

    /// The public key of broker `index` (the only key when there is one for all).
    public func serverKey(forBroker index: Int) -> String {
        index < serverKeys.count ? serverKeys[index] : serverKeys[0]
    }
}

extension ZMQSocket {
    /// Makes this socket a CURVE server with `keyPair` (before bind).
    package func becomeCurveServer(_ keyPair: CurveKeyPair) throws {
        try set(ZMQ_CURVE_SERVER, 1)
        try setText(ZMQ_CURVE_SECRETKEY, keyPair.secretKey)
        try setText(ZMQ_ZAP_DOMAIN, "canopy")
    }

    /// Makes this socket a CURVE client of the server with `settings.serverKey` (before connect).
    public func becomeCurveClient(_ settings: CurveClientSettings, broker: Int = 0) throws {
        try setText(ZMQ_CURVE_SERVERKEY, settings.serverKey(forBroker: broker))
        try setText(ZMQ_CURVE_PUBLICKEY, settings.keyPair.publicKey)
        try setText(ZMQ_CURVE_SECRETKEY, settings.keyPair.secretKey)
    }
}
