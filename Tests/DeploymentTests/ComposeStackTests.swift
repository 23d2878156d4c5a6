import CanopyDeployment
import CanopyServiceKit
import CanopyStore
import CanopyTesting
import Foundation
import Glibc
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// docker-compose.yml's configuration run for real without a Docker engine: the secrets
/// `scripts/compose-secrets` makes, and every compose service started as a process with its
/// command, its environment and its health check, as its container would run them. Only the
/// container's view is mapped: `/run/secrets/NAME` to the secret's file, `/data` to a
/// directory of the service's own, and the compose network's addresses (`broker-a:5555`,
/// a service's own `0.0.0.0:PORT`) to free loopback ports.
@Suite(.serialized)
struct ComposeStackTests {
    /// The Dockerfile's user, whose group must read the secrets.
    static func containerUser() throws -> Int {
        let dockerfile = try String(contentsOf: ComposeFileTests.root.appendingPathComponent("Dockerfile"), encoding: .utf8)
        let uid = try #require(dockerfile.firstMatch(of: /--uid (\d+)/).flatMap { Int($0.1) })
        #expect(dockerfile.contains("USER \(uid):\(uid)"), "the containers run as the user useradd made")
        return uid
    }

    /// `scripts/compose-secrets` run in a copy of the repository's layout under `tree`, with
    /// the canopy built next to the tests making the key pairs. As root the secrets get the
    /// script's own group choice, which must be the containers'; otherwise this user's own
    /// group (CANOPY_SECRETS_GROUP, so that no sudo is asked for).
    static func makeSecrets(in tree: URL, environment: [String: String] = [:]) async throws -> ProcessResult {
        let script = tree.appendingPathComponent("scripts/compose-secrets")
        if !FileManager.default.fileExists(atPath: script.path) {
            try FileManager.default.createDirectory(at: tree.appendingPathComponent("scripts"), withIntermediateDirectories: true)
            try FileManager.default.copyItem(at: ComposeFileTests.root.appendingPathComponent("scripts/compose-secrets"), to: script)
        }
        return try await runProgram(
            at: script.path, [],
            environment: [
                "CANOPY_BIN": try LiveBus.executable("canopy").path, "CANOPY_PLANTNET_KEY": "",
                "CANOPY_SECRETS_GROUP": getuid() == 0 ? "" : "\(getgid())",
            ].merging(environment) { $1 })
    }

    static func temporaryTree() throws -> URL {
        let tree = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-compose-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: tree, withIntermediateDirectories: true)
        return tree
    }

    /// Compose mounts secret files with their host owner and mode, and the containers run as
    /// the Dockerfile's user: every secret ends readable by that user's group (and its owner)
    /// and by nobody else; the token key and key pairs are made once; a Pl@ntNet key is written
    /// when given; the allow-list names each service's key for its own service alone.
    @Test func composeSecretsMakesEverySecretTheFileNamesReadableByTheContainersUser() async throws {
        let uid = try Self.containerUser()
        let group = getuid() == 0 ? uid : Int(getgid())
        let tree = try Self.temporaryTree()
        defer { try? FileManager.default.removeItem(at: tree) }
        try FileManager.default.createDirectory(at: tree.appendingPathComponent("secrets"), withIntermediateDirectories: true)
        try Data("apple's key".utf8).write(to: tree.appendingPathComponent("secrets/apns.p8")) // one of the operator's own

        let made = try await Self.makeSecrets(in: tree)
        #expect(made.status == 0, "\(made.errors)")
        func file(_ name: String) throws -> (mode: Int, group: Int, bytes: Data) {
            let path = tree.appendingPathComponent("secrets/\(name)").path
            let attributes = try FileManager.default.attributesOfItem(atPath: path)
            return (
                attributes[.posixPermissions] as? Int ?? -1, (attributes[.groupOwnerAccountID] as? NSNumber)?.intValue ?? -1,
                try Data(contentsOf: URL(fileURLWithPath: path))
            )
        }
        // Every secret the compose files name, and the operator's own, exist and are readable so.
        var names = ["apns.p8"]
        for compose in ["docker-compose.yml", "deploy/docker-compose.apns.yml"] {
            let secrets = try #require(try ComposeFileTests.compose(compose)["secrets"] as? [String: [String: String]])
            names += secrets.values.compactMap { $0["file"]?.replacingOccurrences(of: "./secrets/", with: "") }
        }
        for name in Set(names) {
            let secret = try file(name)
            #expect(secret.mode == 0o640 && secret.group == group, "secrets/\(name): mode \(String(secret.mode, radix: 8)), group \(secret.group)")
        }
        let token = try file("token.key").bytes, emptyKey = try file("plantnet.key").bytes, brokerKey = try file("broker-a.key").bytes
        #expect(token.count >= 64 && emptyKey.isEmpty)

        // The allow-list: each worker's public key for its own service, the edge and the operator as clients.
        let allow = String(decoding: try file("curve.allow").bytes, as: UTF8.self)
        func publicKey(_ name: String) throws -> String {
            let pub = String(decoding: try file("\(name).pub").bytes, as: UTF8.self)
            return try #require(pub.firstMatch(of: /public-key = (\S+)/).map { String($0.1) })
        }
        for service in ["images", "care", "identify", "remind"] { #expect(allow.contains("worker \(try publicKey(service)) \(service)\n")) }
        for client in ["api", "operator"] { #expect(allow.contains("client \(try publicKey(client))\n")) }
        let brokerPublics = [try publicKey("broker-a"), try publicKey("broker-b")]
        #expect(brokerPublics[0] != brokerPublics[1], "each broker has a key pair of its own")
        let lines = allow.split(separator: "\n").filter { !$0.hasPrefix("#") }.map { $0.split(separator: " ") }
        #expect(
            lines.count == 6 && brokerPublics.allSatisfy { !allow.contains($0) } && !lines.contains { $0.count > 2 && $0[2].contains("*") },
            "six keys, and none serves every service: \(allow)")

        let again = try await Self.makeSecrets(in: tree, environment: ["CANOPY_PLANTNET_KEY": "pn-key-1"])
        #expect(again.status == 0, "\(again.errors)")
        let tokenAgain = try file("token.key").bytes, brokerKeyAgain = try file("broker-a.key").bytes
        #expect(tokenAgain == token && brokerKeyAgain == brokerKey, "keys are made once")
        let plantNet = try file("plantnet.key")
        #expect(plantNet.bytes == Data("pn-key-1\n".utf8) && plantNet.mode == 0o640 && plantNet.group == group)
    }

    /// One compose service as the process its container runs.
    struct Launched {
        let name: String
        let process: Process
        let environment: [String: String]
        let health: [String]
        let log: URL
    }

    @Test func theComposeStackRunsAsProcessesOverCurveZMQWithItsSecrets() async throws {
        let tree = try Self.temporaryTree()
        defer { try? FileManager.default.removeItem(at: tree) }
        let made = try await Self.makeSecrets(in: tree)
        try #require(made.status == 0, "\(made.errors)")

        let compose = try ComposeFileTests.compose()
        let services = try ComposeFileTests.services(compose)
        let secretFiles = try #require(compose["secrets"] as? [String: [String: String]])
        /// A free loopback port for each compose host and port (`broker-b:5555`); a service's
        /// own `0.0.0.0:PORT` is its host's.
        var ports: [String: Int] = [:]
        func port(_ host: String, _ number: Int) -> Int {
            if let known = ports["\(host):\(number)"] { return known }
            let free = FreePorts.any()
            ports["\(host):\(number)"] = free
            return free
        }
        // The postgres service: a throwaway server with the compose file's user, database and
        // the password the secret holds.
        let postgres = try await PostgresServer()
        defer { postgres.stop() }
        let password = try String(contentsOf: tree.appendingPathComponent("secrets/db_password"), encoding: .utf8)
        #expect(password.count >= 40 && password.allSatisfy { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" }, "a random password")
        try await PostgresServer.query(postgres.url, "ALTER USER canopy PASSWORD '\(password)'")
        var superuser = postgres.url
        superuser.password = password
        try await PostgresServer.query(superuser, "CREATE DATABASE canopy")
        ports["postgres:5432"] = postgres.url.port

        /// A value as the container sees it, as the process must.
        func local(_ value: String, service: String, mounted: [String]) throws -> String {
            // A list (one broker key per endpoint): each item as the container sees it.
            if value.contains(","), value.hasPrefix("/run/secrets/") {
                return try value.split(separator: ",").map { try local(String($0), service: service, mounted: mounted) }.joined(separator: ",")
            }
            // Compose's interpolation, none of these variables set where it runs: the default.
            if let interpolated = value.wholeMatch(of: /\$\{[A-Z_]+:-(.*)\}/) { return String(interpolated.1) }
            if value == "/data" { return tree.appendingPathComponent("data/\(service)").path }
            if value == "/photos" { return tree.appendingPathComponent("photos").path } // the shared volume
            if value.hasPrefix("/run/secrets/") {
                let name = String(value.dropFirst("/run/secrets/".count))
                #expect(mounted.contains(name), "\(service) reads /run/secrets/\(name) but does not mount it")
                let file = try #require(secretFiles[name]?["file"], "no secret \(name)")
                return tree.appendingPathComponent(String(file.dropFirst(2))).path
            }
            return value.replacing(/(0\.0\.0\.0|127\.0\.0\.1|broker-a|broker-b|postgres):(\d+)/) { match in
                let host = match.1 == "0.0.0.0" || match.1 == "127.0.0.1" ? service : String(match.1)
                return "127.0.0.1:\(port(host, Int(match.2)!))"
            }
        }

        var launched: [Launched] = []
        defer {
            for service in launched where service.process.isRunning { service.process.terminate() }
            for service in launched { service.process.waitUntilExit() }
        }
        func start(_ name: String) throws -> Launched {
            let definition = try #require(services[name])
            let mounted = definition["secrets"] as? [String] ?? []
            var environment: [String: String] = [:]
            for (variable, value) in definition["environment"] as? [String: Any] ?? [:] {
                environment[variable] = try local("\(value)", service: name, mounted: mounted)
            }
            try FileManager.default.createDirectory(at: tree.appendingPathComponent("data/\(name)"), withIntermediateDirectories: true)
            let command = try #require(definition["command"] as? [String]).map { try local($0, service: name, mounted: mounted) }
            let health = try #require((definition["healthcheck"] as? [String: Any])?["test"] as? [String]).dropFirst()
                .map { try local($0, service: name, mounted: mounted) }
            let process = Process()
            process.executableURL = try LiveBus.executable(command[0])
            process.arguments = Array(command.dropFirst())
            // The container's environment: the image's and the compose file's, none of this machine's CANOPY_*.
            process.environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("CANOPY_") }
                .merging(["CANOPY_DATA_DIR": tree.appendingPathComponent("data/\(name)").path]) { $1 }
                .merging(environment) { $1 }
            let log = tree.appendingPathComponent("\(name).log")
            try #require(FileManager.default.createFile(atPath: log.path, contents: nil))
            let handle = try FileHandle(forWritingTo: log)
            process.standardOutput = handle
            process.standardError = handle
            try process.run()
            let service = Launched(name: name, process: process, environment: process.environment ?? [:], health: health, log: log)
            launched.append(service)
            return service
        }
        /// Waits until the service's own health check passes, as compose's `service_healthy` does.
        func waitHealthy(_ service: Launched) async throws {
            var last: ProcessResult?
            let healthy = try await eventually(within: .seconds(90), every: .milliseconds(200)) {
                guard service.process.isRunning else {
                    Issue.record("\(service.name) exited: \((try? String(contentsOf: service.log, encoding: .utf8))?.suffix(2_000) ?? "")")
                    throw CancellationError()
                }
                let result = try await runExecutable(service.health[0], Array(service.health.dropFirst()), environment: service.environment)
                last = result
                return result.status == 0
            }
            if healthy { return }
            let log = (try? String(contentsOf: service.log, encoding: .utf8))?.suffix(2_000) ?? ""
            Issue.record("\(service.name) never became healthy: \(last?.output ?? "") \(last?.errors ?? "")\n\(log)")
            throw CancellationError()
        }

        // In compose's order: the brokers healthy first, then the services, then the edge that needs them all.
        let brokers = CanopyStack.composeNames(CanopyStack.broker)
        for broker in brokers { try await waitHealthy(try start(broker)) }
        let workers = CanopyStack.services.map(\.name).filter { $0 != CanopyStack.broker.name && $0 != "api" }
        let started = try workers.map(start)
        for service in started { try await waitHealthy(service) }
        try await waitHealthy(try start("api"))

        // The operator's CLI with the operator key sees every service registered with each broker over CURVE...
        let secrets = tree.appendingPathComponent("secrets")
        let endpoints = brokers.map { "tcp://127.0.0.1:\(port($0, 5555))" }
        let operatorEnvironment = [
            "CANOPY_ENDPOINT": endpoints.joined(separator: ","),
            "CANOPY_CURVE_SERVER_KEY": brokers.map { secrets.appendingPathComponent("\($0).pub").path }.joined(separator: ","),
            "CANOPY_CURVE_SECRET_KEY_FILE": secrets.appendingPathComponent("operator.key").path,
        ]
        let listed = try await runExecutable("canopy", ["services"], environment: operatorEnvironment)
        #expect(listed.status == 0, "\(listed.errors)")
        // Each broker's rows: from the row naming it to the next.
        var rows: [String: [[Substring]]] = [:]
        var current = ""
        for line in listed.output.split(separator: "\n").dropFirst() {
            let cells = line.split(separator: " ")
            if let first = cells.first, first.hasPrefix("tcp://") { current = String(first) }
            rows[current, default: []].append(cells)
        }
        for endpoint in endpoints {
            for worker in workers {
                #expect(rows[endpoint]?.contains { $0.contains(Substring(worker)) } == true, "\(worker) is not registered with \(endpoint): \(listed.output)")
            }
        }
        // ...and a key not on the allow-list is refused.
        var stranger = operatorEnvironment
        stranger["CANOPY_CURVE_SECRET_KEY_FILE"] = nil
        let refused = try await runExecutable("canopy", ["services"], environment: stranger)
        #expect(refused.status != 0 && refused.errors.contains("unauthorized"), "\(refused.output) \(refused.errors)")

        // An app over HTTP, with a token signed by the secret key canopy-api reads.
        let issued = try await runExecutable(
            "canopy-api",
            [
                "token", "issue", "--user", "alice", "--token-key-file",
                secrets.appendingPathComponent("token.key").path,
            ])
        let token = issued.output.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(issued.status == 0 && !token.isEmpty, "\(issued.errors)")
        func send(_ method: String, _ path: String, json: String? = nil) async throws -> (Int, String) {
            var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port("api", 8080))\(path)")!)
            request.httpMethod = method
            request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
            if let json {
                request.setValue("application/json", forHTTPHeaderField: "Content-Type")
                request.httpBody = Data(json.utf8)
            }
            let (data, response) = try await URLSession.shared.data(for: request)
            return ((response as? HTTPURLResponse)?.statusCode ?? 0, String(decoding: data, as: UTF8.self))
        }
        let (created, plant) = try await send("POST", "/v1/plants", json: #"{"scientificName":"Monstera deliciosa"}"#)
        #expect(created == 201, "\(plant)")
        let (listedStatus, plants) = try await send("GET", "/v1/plants")
        #expect(listedStatus == 200 && plants.contains("Monstera deliciosa") && plants.contains(#""total":1"#), "\(plants)")
        // Thirty days: a week's window may end before a seven-day task's preferred hour.
        let (tasksStatus, tasks) = try await send("GET", "/v1/tasks/upcoming?days=30")
        let plantID = try #require((try JSONSerialization.jsonObject(with: Data(plant.utf8)) as? [String: Any])?["id"] as? String)
        #expect(tasksStatus == 200 && tasks.contains(#""plantID":"\#(plantID)""#), "its care is scheduled: \(tasks)")
    }
}
