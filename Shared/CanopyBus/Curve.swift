import CZeroMQ
import Foundation

// CurveZMQ on the bus: key pairs, key files, the allow-list and the broker's ZAP handler.
// Secret keys are never logged or put in an error message; errors name the file instead.

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
    static func z85(_ bytes: [UInt8]) -> String? {
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

    /// A public key given as Z85 text, or read from a file with a `public-key = ...` line.
    public static func publicKey(_ textOrPath: String) throws -> String {
        if isKey(textOrPath) { return textOrPath }
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

// MARK: - Allow-list

/// Who may talk to a broker that runs with CURVE: worker keys with the services they may
/// serve, and client keys. Read from the file `--curve-allow` names, one entry a line:
///
/// ```
/// # role   public key (Z85)                            services (workers only)
/// worker   Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID   care,images
/// worker   rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7   *
/// client   JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6
/// ```
///
/// A worker key may also call (services call each other); a client key may only call.
public struct CurveAllowList: Sendable, Equatable {
    /// Services by worker key (`"*"`: any).
    public var workers: WorkerKeys
    /// Keys that may call but not serve.
    public var clients: Set<String>

    /// - Parameters:
    ///   - workers: worker keys and their services.
    ///   - clients: client keys.
    public init(workers: WorkerKeys = WorkerKeys(), clients: Set<String> = []) {
        self.workers = workers
        self.clients = clients
    }

    /// Parses an allow-list; the error names the line that is wrong.
    public init(parsing text: String) throws {
        self.init()
        for (index, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.trimmingCharacters(in: .whitespaces)
            if line.isEmpty || line.hasPrefix("#") { continue }
            let words = line.split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
            let where_ = "line \(index + 1) of the allow-list"
            guard words.count >= 2, Curve.isKey(words[1]) else {
                throw Curve.KeyError("\(where_) must be 'worker KEY SERVICES' or 'client KEY' with a 40-character Z85 public key")
            }
            switch words[0] {
            case "worker":
                guard words.count == 3 else { throw Curve.KeyError("\(where_): a worker entry names its services, comma-separated, or '*'") }
                let services = Set(words[2].split(separator: ",").map(String.init))
                guard services.allSatisfy({ $0 == "*" || Wire.isValidName(Array($0.utf8)) }) else {
                    throw Curve.KeyError("\(where_): service names are a-z, 0-9, '.', '-', '_', or '*' for any")
                }
                workers.services[words[1], default: []].formUnion(services)
            case "client":
                guard words.count == 2 else { throw Curve.KeyError("\(where_): a client entry is 'client KEY'") }
                clients.insert(words[1])
            default:
                throw Curve.KeyError("\(where_) starts with '\(words[0].prefix(20))'; use 'worker' or 'client'")
            }
        }
    }

    /// Whether a peer with `key` may connect at all.
    public func mayConnect(_ key: String) -> Bool {
        clients.contains(key) || workers.services[key] != nil
    }
}

/// How a broker runs CurveZMQ.
public struct CurveServerSettings: Sendable {
    /// The broker's own key pair; clients and workers are given its public key.
    public var keyPair: CurveKeyPair
    /// Who may connect and who may serve.
    public var allowList: CurveAllowList
    /// Let any key connect as a client (workers still need an allowed key).
    public var anyClient: Bool

    /// - Parameters:
    ///   - keyPair: the broker's key pair.
    ///   - allowList: worker and client keys.
    ///   - anyClient: whether unknown keys may call.
    public init(keyPair: CurveKeyPair, allowList: CurveAllowList, anyClient: Bool = false) {
        self.keyPair = keyPair
        self.allowList = allowList
        self.anyClient = anyClient
    }
}

/// How a client or worker connects to a broker that runs CurveZMQ.
public struct CurveClientSettings: Sendable {
    /// The broker's public key.
    public var serverKey: String
    /// This peer's key pair; its public key must be on the broker's allow-list.
    public var keyPair: CurveKeyPair

    /// - Parameters:
    ///   - serverKey: the broker's public key (Z85).
    ///   - keyPair: this peer's key pair.
    public init(serverKey: String, keyPair: CurveKeyPair) {
        self.serverKey = serverKey
        self.keyPair = keyPair
    }
}

extension ZMQSocket {
    /// Makes this socket a CURVE server with `keyPair` (before bind).
    func becomeCurveServer(_ keyPair: CurveKeyPair) throws {
        try set(ZMQ_CURVE_SERVER, 1)
        try setText(ZMQ_CURVE_SECRETKEY, keyPair.secretKey)
        try setText(ZMQ_ZAP_DOMAIN, "canopy")
    }

    /// Makes this socket a CURVE client of the server with `settings.serverKey` (before connect).
    public func becomeCurveClient(_ settings: CurveClientSettings) throws {
        try setText(ZMQ_CURVE_SERVERKEY, settings.serverKey)
        try setText(ZMQ_CURVE_PUBLICKEY, settings.keyPair.publicKey)
        try setText(ZMQ_CURVE_SECRETKEY, settings.keyPair.secretKey)
    }
}

// MARK: - ZAP

/// The broker's ZAP handler (ZeroMQ RFC 27): libzmq asks it, for every CURVE handshake,
/// whether the client's public key may connect. It answers from the allow-list and names
/// the key as the connection's User-Id, which the broker reads off every message to decide
/// who may register as a worker.
///
/// Not thread-safe: its REP socket belongs to the broker's loop thread, like the ROUTER.
final class ZAPHandler {
    /// The REP socket libzmq sends ZAP requests to.
    let socket: ZMQSocket
    private let mayConnect: (String) -> Bool
    /// Handshakes refused so far.
    private(set) var refused: UInt64 = 0

    /// Binds `inproc://zeromq.zap.01` in `context`: one ZAP handler per context.
    init(context: ZMQContext, mayConnect: @escaping (String) -> Bool) throws {
        socket = try ZMQSocket(context, type: .rep)
        do {
            try socket.bind("inproc://zeromq.zap.01")
        } catch {
            throw Curve.KeyError("this ZeroMQ context already has a ZAP handler (one CURVE broker per context)")
        }
        self.mayConnect = mayConnect
    }

    /// Answers every waiting ZAP request.
    func answerRequests() throws {
        while let request = try socket.receive() {
            // version, request id, domain, address, identity, mechanism, credentials...
            guard request.count >= 6 else { continue }
            let version = request[0], requestID = request[1]
            let mechanism = String(decoding: request[5], as: UTF8.self)
            var status = "400", text = "unknown key", userID = ""
            if mechanism == "CURVE", request.count >= 7, let key = Curve.z85(request[6]), mayConnect(key) {
                (status, text, userID) = ("200", "OK", key)
            } else {
                refused += 1
            }
            try socket.send([version, requestID, Array(status.utf8), Array(text.utf8), Array(userID.utf8), []], dontWait: false)
        }
    }

    func close() { socket.close() }
}
