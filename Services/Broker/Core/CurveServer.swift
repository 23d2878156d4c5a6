import CZeroMQ
import CanopyIO
import CanopyWire
import Foundation

// The broker's side of CurveZMQ: the allow-list of worker and client keys, the broker's
// settings, and its ZAP handler.

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
    /// The file the allow-list was read from, read again by ``BrokerServer/reloadAllowList()``
    /// (SIGHUP); `nil` when it came from elsewhere and cannot be reloaded.
    public var allowListFile: String?

    /// - Parameters:
    ///   - keyPair: the broker's key pair.
    ///   - allowList: worker and client keys.
    ///   - anyClient: whether unknown keys may call.
    ///   - allowListFile: the file it was read from, for reloads.
    public init(keyPair: CurveKeyPair, allowList: CurveAllowList, anyClient: Bool = false, allowListFile: String? = nil) {
        self.keyPair = keyPair
        self.allowList = allowList
        self.anyClient = anyClient
        self.allowListFile = allowListFile
    }

    /// Reads an allow-list file; the error says which file and what is wrong in it.
    public static func readAllowList(_ file: String) throws -> CurveAllowList {
        guard let text = try? String(contentsOfFile: file, encoding: .utf8) else {
            throw Curve.KeyError("cannot read the allow-list \(file); check the path")
        }
        return try CurveAllowList(parsing: text)
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
    /// Whether a key may connect: the allow-list of now (replaced on reload, loop thread only).
    var mayConnect: (String) -> Bool
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
