import CanopyMessages
import CanopyWire

extension BrokerState {
    /// Who may do what by the CurveZMQ key a peer authenticated with: call, make a request as
    /// a service, serve a service; and which service names a worker may register. Pure: read
    /// from the allow-list in force (``BrokerConfiguration/workerKeys`` and
    /// ``BrokerConfiguration/clientKeys``; without CURVE, everyone may).
    struct KeyPolicy {
        let workerKeys: WorkerKeys?
        let clientKeys: Set<String>?

        /// Why a request from the peer that authenticated with `key` is refused, or `nil` when
        /// it may call (always without CURVE, or when any client may).
        func unauthorizedCaller(_ key: String?) -> String? {
            guard let clients = clientKeys, let key else { return nil }
            if clients.contains(key) || workerKeys?.services[key] != nil { return nil }
            return "this key is no longer on the broker's allow-list; the operator adds it again (--curve-allow, then SIGHUP)"
        }

        /// Why a request that says a service made it (``RequestHeader/Flag/derived``: operations of
        /// ``Access/service`` take only those) is refused from the peer that authenticated with
        /// `key`: with an allow-list in force, only a worker's key may say so. `nil` when it may.
        func unauthorizedService(_ key: String?, flags: UInt8) -> String? {
            guard flags & RequestHeader.Flag.derived != 0, let workers = workerKeys else { return nil }
            if let key, workers.services[key] != nil { return nil }
            return "only a service's worker key may make a request as a service (the derived flag); this key is a client's"
        }

        /// Why the peer that authenticated with `key` may not serve `service`, or `nil` when it may
        /// (always, when the broker runs without an allow-list).
        func unauthorizedWorker(_ key: String?, service: String) -> String? {
            guard let allowList = workerKeys, !allowList.allows(key, service: service) else { return nil }
            return key == nil
                ? "this broker takes workers only over CURVE with an allowed key; give the worker --curve-server-key and --curve-secret-key-file"
                : "this worker's CURVE key may not serve '\(service)'; the operator adds its public key to the broker's allow-list (--curve-allow) as a worker of it"
        }

        /// Whether an allow-list of worker keys is in force: only then does a worker's key say
        /// who it is, and may a peer with another key pose as it.
        var checksWorkerKeys: Bool { workerKeys != nil }

        /// Whether a message for `worker` came with another CurveZMQ key than the worker registered
        /// with: a peer that took over its routing identity. Only with an allow-list in force.
        func impersonates(_ worker: Worker, key: String?) -> Bool {
            workerKeys != nil && worker.key != key
        }

        /// A valid service name a worker may register, or `nil`.
        static func serviceName(_ frame: [UInt8]) -> String? {
            guard Wire.isValidName(frame) else { return nil }
            let name = String(decoding: frame, as: UTF8.self)
            guard name != Broker.service, !name.hasPrefix(Broker.service + "."), !name.hasPrefix(Majordomo.managementPrefix) else { return nil }
            return name
        }
    }
}
