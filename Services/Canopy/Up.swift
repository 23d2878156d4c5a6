import ArgumentParser
import CanopyBus
import CanopyDeployment
import CanopyServiceKit
import CanopyStore
import Dispatch
import Foundation
import Glibc
import Logging

/// Options every stack command shares: where the stack keeps its data (and its state).
struct StackOptions: ParsableArguments {
    @Option(help: ArgumentHelp("Where the stack keeps its stores, logs and state. Env: CANOPY_DATA_DIR.", valueName: "dir"))
    var dataDir: String = Environment.string("CANOPY_DATA_DIR") ?? "./.canopy"

    var layout: StackLayout { StackLayout(dataDirectory: URL(fileURLWithPath: dataDir, isDirectory: true).standardizedFileURL) }
}

/// `canopy up`: the whole stack as local processes.
struct Up: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the whole stack as local processes: the broker and every service, restarted when they crash.",
        discussion: """
            Builds what is missing (swift build -c release, when run from the repository), starts
            the broker and every service (the list docker-compose.yml runs) with their stores in
            --data-dir, waits until each is healthy, prints a status table, the HTTP address and a
            demo token, and keeps them running; Ctrl-C stops them all gracefully. The bus runs
            over CurveZMQ with the stack's own keys (made in <data-dir>/keys at the first start):
            no other process can serve or call; the canopy subcommands find the keys there.
            Examples:
              canopy up
              canopy up --detach && canopy status && canopy logs care && canopy down
              canopy up --http 0.0.0.0:8080 --data-dir /srv/canopy
              canopy up --database-url postgres://canopy@127.0.0.1:5432/canopy --replicas care=3,remind=2,images=2,identify=2
              canopy up --brokers 2
              canopy up --traces ./traces.jsonl && canopy trace
            """)

    @OptionGroup var stack: StackOptions
    @Option(
        name: [.customLong("broker"), .customLong("endpoint")],
        help: ArgumentHelp("Where the broker listens (the first one's, with --brokers; or a list A,B). Env: CANOPY_ENDPOINT.", valueName: "endpoint"))
    var broker: String = Environment.string("CANOPY_ENDPOINT") ?? "tcp://127.0.0.1:5555"
    @Option(
        help: ArgumentHelp(
            "Live brokers, 1 to 4: every service registers with each, clients fail over between them; the second listens on the --broker port plus one, and so on. Env: CANOPY_BROKERS.",
            valueName: "count"))
    var brokers: Int = Environment.int("CANOPY_BROKERS", default: 1)
    @Option(help: ArgumentHelp("Where the HTTP API listens. Env: CANOPY_HTTP.", valueName: "host:port"))
    var http: String = Environment.string("CANOPY_HTTP") ?? "127.0.0.1:8080"
    @Option(
        help: ArgumentHelp(
            "The broker's /metrics port; the services take the next five (9400: 9401 images … 9405 api). Env: CANOPY_METRICS_BASE.", valueName: "port"))
    var metricsBase: Int = Environment.int("CANOPY_METRICS_BASE", default: 9400)
    @Option(help: ArgumentHelp("The clock every service goes by (system, fixed:…, from:…; see --help of a service). Env: CANOPY_CLOCK.", valueName: "clock"))
    var clock: String = Environment.string("CANOPY_CLOCK") ?? "system"
    @Option(
        help: ArgumentHelp(
            "PostgreSQL for every service's store, shared by their replicas: postgres://USER@HOST:5432/DATABASE (without it: SQLite in --data-dir). Env: CANOPY_DATABASE_URL.",
            valueName: "url"))
    var databaseURL: String? = Environment.string("CANOPY_DATABASE_URL")
    @Option(help: ArgumentHelp("A file holding the database password. Env: CANOPY_DATABASE_PASSWORD_FILE.", valueName: "path"))
    var databasePasswordFile: String? = Environment.string("CANOPY_DATABASE_PASSWORD_FILE")
    @Option(
        help: ArgumentHelp(
            "With --database-url: where canopy-images keeps originals, shared by its replicas (default <data-dir>/images/originals). Env: CANOPY_ORIGINALS_DIR.",
            valueName: "dir"))
    var originalsDir: String? = Environment.string("CANOPY_ORIGINALS_DIR")
    @Option(
        help: ArgumentHelp(
            "Processes per service, such as care=3,remind=2,images=2,identify=2 (needs --database-url). Env: CANOPY_REPLICAS.", valueName: "name=count,…"))
    var replicas: String = Environment.string("CANOPY_REPLICAS") ?? ""
    @Option(
        help: ArgumentHelp(
            "Record every request's spans (every service, the broker, the HTTP edge) and append them to FILE, one JSON object per line; canopy trace lists them and prints one as a tree.",
            valueName: "file"))
    var traces: String?
    @Flag(help: "Run the bus without CurveZMQ: any local process can then serve as a service or call as anyone (for debugging only).")
    var noCurve = false
    @Flag(help: "Start the stack in the background and return once it is healthy; canopy down stops it.") var detach = false
    @Flag(help: .hidden) var supervise = false

    func validate() throws {
        try Environment.validate()
        guard (1...65_530).contains(metricsBase) else { throw ValidationError("--metrics-base must be a port from 1 to 65530") }
        _ = try brokerEndpoints()
        guard ServiceClock(parsing: clock) != nil else { throw ValidationError("--clock is system, fixed:2026-11-24T09:00:00Z or from:2026-11-24T09:00:00Z") }
        _ = try OperatingOptions.parse(http)
        let counts = try replicaCounts()
        if counts.values.contains(where: { $0 > 1 }) && databaseURL == nil {
            throw ValidationError("--replicas needs --database-url: replicas share their stores in PostgreSQL (SQLite serves one process a store)")
        }
        if let databaseURL {
            do { _ = try DatabaseURL(parsing: databaseURL, passwordFile: databasePasswordFile) } catch { throw ValidationError(error.description) }
        }
    }

    /// Every broker's endpoint: the list `--broker` names, or `--brokers` endpoints from the
    /// first's port up.
    func brokerEndpoints() throws -> [String] {
        guard (1...4).contains(brokers) else { throw ValidationError("--brokers is 1 to 4") }
        let named = BusClient.Configuration(endpoint: broker).endpoints
        if named.count > 1 {
            guard brokers == 1 || brokers == named.count else {
                throw ValidationError("--broker names \(named.count) brokers but --brokers says \(brokers); give one of them")
            }
            return named
        }
        guard brokers > 1 else { return named }
        guard let first = ListenAddress(zeroMQEndpoint: broker), first.port + brokers - 1 <= 65_535 else {
            throw ValidationError(
                "--brokers \(brokers) needs --broker tcp://HOST:PORT with the ports after it free (or a list: --broker tcp://HOST:A,tcp://HOST:B)")
        }
        return (0..<brokers).map { "tcp://\(first.host):\(first.port + $0)" }
    }

    /// `--replicas care=3,remind=2` as counts by service.
    func replicaCounts() throws -> [String: Int] {
        var counts: [String: Int] = [:]
        for item in replicas.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !item.isEmpty {
            let parts = item.split(separator: "=", maxSplits: 1).map(String.init)
            guard parts.count == 2, let count = Int(parts[1]), (1...16).contains(count) else {
                throw ValidationError("--replicas takes name=count pairs with counts from 1 to 16, such as care=3,remind=2; got '\(item.prefix(40))'")
            }
            guard let service = CanopyStack.services.first(where: { $0.name == parts[0] }), service.scales else {
                let scaling = CanopyStack.services.filter(\.scales).map(\.name).joined(separator: ", ")
                throw ValidationError("--replicas: '\(parts[0].prefix(40))' does not run as replicas; these do: \(scaling)")
            }
            counts[service.name] = count
        }
        return counts
    }

    func run() throws {
        let layout = stack.layout
        // Stores, photos, logs (the demo token) and keys are the owner's alone: what this
        // process and every service it starts creates is 0600 (directories 0700).
        umask(0o077)
        try FileManager.default.createDirectory(at: layout.logs, withIntermediateDirectories: true)
        if let state = layout.state(), state.supervisorAlive {
            throw CommandFailure(
                "a stack runs already from \(layout.dataDirectory.path) (supervisor \(state.supervisor)); see canopy status, or stop it with canopy down")
        }
        try refuseTakenPorts(layout)
        StackPermissions.restrict(layout.dataDirectory)
        let executables = try Self.executables()
        try Self.makeTokenKey(layout.tokenKey)
        let stackID = try Self.stackID(layout.stackIDFile)
        _ = try InstallID.ensure(in: layout.dataDirectory)
        let keys = StackKeys(dataDirectory: layout.dataDirectory)
        if noCurve {
            if !supervise { note("warning: --no-curve: the bus runs without CurveZMQ; any local process can register as a service or call as any person") }
        } else {
            try keys.ensure()
        }
        if detach && !supervise { return try startDetached(layout) }

        var environment = ["CANOPY_CLOCK": clock, "CANOPY_STACK": stackID]
        environment["CANOPY_LOG_LEVEL"] = Environment.string("CANOPY_LOG_LEVEL") ?? "info"
        if let databaseURL {
            // Every store in PostgreSQL; canopy-images' replicas share the originals.
            environment["CANOPY_DATABASE_URL"] = databaseURL
            environment["CANOPY_DATABASE_PASSWORD_FILE"] = databasePasswordFile
            environment["CANOPY_ORIGINALS_DIR"] = originalsDir ?? layout.dataDirectory.appendingPathComponent("images/originals").path
        }
        var traceFile: String?
        if let traces {
            // A receiver in this process, as a collector would be: every service exports its
            // spans to it (OTLP/JSON), and it appends them to the file.
            let (endpoint, path) = try Self.receiveTraces(into: traces)
            environment["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
            environment["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/json"
            environment["OTEL_TRACES_SAMPLER"] = "parentbased_always_on"
            environment["OTEL_BSP_SCHEDULE_DELAY"] = "500"
            traceFile = path
        }
        var settings = StackSupervisor.Settings(
            layout: layout, executables: executables, endpoint: try brokerEndpoints().joined(separator: ","), http: http,
            metricsBase: metricsBase, environment: environment, replicas: try replicaCounts())
        settings.traces = traceFile
        settings.curve = noCurve ? nil : keys.files
        let supervisor = StackSupervisor(settings: settings)
        // Ctrl-C and SIGTERM end the supervision; the children are then stopped in order.
        signal(SIGINT, SIG_IGN)
        signal(SIGTERM, SIG_IGN)
        signal(SIGHUP, SIG_IGN)
        let signals = [SIGINT, SIGTERM].map { number in
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { supervisor.requestStop() }
            source.resume()
            return source
        }
        defer { signals.forEach { $0.cancel() } }
        do {
            try supervisor.startAll { note($0) }
        } catch {
            supervisor.stopAll()
            throw error
        }
        let token = try Self.demoToken(executables, key: layout.tokenKey)
        print(StackSupervisor.table(layout.state()!))
        print("")
        print("the HTTP API: http://\(http)  (try: curl -H 'Authorization: Bearer \(token)' http://\(http)/v1/plants)")
        print("demo token (user demo, 7 days): \(token)")
        if let traceFile { print("traces: every request's spans in \(traceFile) (canopy trace lists them; canopy trace ID prints one)") }
        print(supervise ? "supervising; canopy down stops the stack" : "Ctrl-C stops the stack; canopy status and canopy logs SERVICE from another terminal")
        fflush(nil)
        supervisor.supervise { note($0) }
        note("stopping…")
        supervisor.stopAll()
        note("stopped")
    }

    /// `--detach`: the same command, supervising in a session of its own, its output in the logs.
    private func startDetached(_ layout: StackLayout) throws {
        let log = layout.log("canopy-up")
        _ = FileManager.default.createFile(atPath: log.path, contents: nil)
        let output = try FileHandle(forWritingTo: log)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/setsid")
        // --wait: setsid forks (the child leads its own process group) and answers the
        // supervisor's exit status, so a stack that fails to start is seen at once.
        var arguments: [String] = [
            "--wait", Self.selfPath(), "up", "--supervise", "--detach", "--data-dir", stack.dataDir, "--broker", broker, "--http", http,
            "--metrics-base", "\(metricsBase)", "--clock", clock, "--replicas", replicas, "--brokers", "\(brokers)",
        ]
        let optional: [(String, String?)] = [
            ("--database-url", databaseURL), ("--database-password-file", databasePasswordFile), ("--originals-dir", originalsDir),
            ("--traces", traces.map { URL(fileURLWithPath: $0).standardizedFileURL.path }),
        ]
        for case let (option, value?) in optional { arguments += [option, value] }
        if noCurve { arguments.append("--no-curve") }
        process.arguments = arguments
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = output
        process.standardError = output
        try process.run()
        // Wait until every service is running (the supervisor writes the state as they come up).
        let deadline = ContinuousClock.now + .seconds(180)
        while ContinuousClock.now < deadline {
            Thread.sleep(forTimeInterval: 0.1)
            if let state = layout.state(), state.services.allSatisfy({ $0.state == "running" }), state.supervisorAlive,
                (try? String(contentsOf: log, encoding: .utf8))?.contains("demo token") == true
            {
                print(StackSupervisor.table(state))
                let text = (try? String(contentsOf: log, encoding: .utf8)) ?? ""
                for line in text.split(separator: "\n") where line.hasPrefix("the HTTP API") || line.hasPrefix("demo token") || line.hasPrefix("traces:") {
                    print(line)
                }
                print("running in the background; canopy status, canopy logs SERVICE, canopy down")
                return
            }
            if !process.isRunning {
                throw CommandFailure("the stack did not start: \(String(((try? String(contentsOf: log, encoding: .utf8)) ?? "").suffix(2_000)))")
            }
        }
        throw CommandFailure("the stack did not become healthy within 3 minutes; see \(log.path) and canopy logs SERVICE")
    }

    /// Starts an OTLP/HTTP receiver on a free loopback port that appends every span it gets to
    /// `file`; returns its endpoint and the file's full path. It lives as long as this process
    /// (the supervisor), which stops the services, and so gets their last spans, first.
    static func receiveTraces(into file: String) throws -> (endpoint: String, path: String) {
        let path = URL(fileURLWithPath: file).standardizedFileURL.path
        let spans = try SpanFile(path: path) {
            note("\(path) reached \(SpanFile.maximumBytes >> 20) MiB, or could not be written (is the disk full?); further spans are not written")
        }
        var logger = Logger(label: "canopy-traces")
        logger.logLevel = .warning
        let receiver = OTLPReceiver(logger: logger) { spans.append($0) }
        Task.detached { try? await receiver.application.run() }
        let deadline = ContinuousClock.now + .seconds(10)
        while receiver.port == nil, ContinuousClock.now < deadline { Thread.sleep(forTimeInterval: 0.01) }
        guard let port = receiver.port else { throw CommandFailure("the trace receiver did not start listening on 127.0.0.1 within 10 s") }
        return ("http://127.0.0.1:\(port)", path)
    }

    /// This executable's path (to start the detached supervisor).
    static func selfPath() -> String {
        (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    }

    /// Where the services' executables are: next to this one. Missing ones are built when run
    /// from the repository (a Package.swift here), else the error says how.
    static func executables() throws -> URL {
        let directory = URL(fileURLWithPath: selfPath()).deletingLastPathComponent()
        let missing = CanopyStack.services.map(\.executable).filter { !FileManager.default.isExecutableFile(atPath: directory.appendingPathComponent($0).path) }
        guard !missing.isEmpty else { return directory }
        guard FileManager.default.fileExists(atPath: "Package.swift") else {
            throw CommandFailure(
                "\(missing.joined(separator: ", ")) are not next to canopy in \(directory.path); build them (swift build -c release) or install them together")
        }
        let configuration = directory.lastPathComponent == "debug" ? "debug" : "release"
        for (index, product) in missing.enumerated() {
            note("building \(product) (\(index + 1) of \(missing.count), swift build -c \(configuration); the first build takes minutes)…")
            let build = Process()
            build.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            build.arguments = ["swift", "build", "-c", configuration, "--product", product]
            try build.run()
            build.waitUntilExit()
            guard build.terminationStatus == 0 else { throw CommandFailure("swift build --product \(product) failed; run it by hand to see why") }
        }
        return directory
    }

    /// Every port the stack would listen on, checked before anything starts: a taken one
    /// (another stack's, most often) refuses the start with a sentence naming the port, what
    /// holds it (and that stack's data directory) and the options that choose others.
    func refuseTakenPorts(_ layout: StackLayout) throws {
        var ports: [(what: String, address: ListenAddress)] = []
        let endpoints = try brokerEndpoints()
        for endpoint in endpoints {
            if let bus = ListenAddress(zeroMQEndpoint: endpoint) { ports.append(("the broker's bus (--broker)", bus)) }
        }
        if let api = try OperatingOptions.parse(http) { ports.append(("the HTTP API (--http)", api)) }
        let all = endpoints.joined(separator: ",")
        let launch = CanopyStack.Launch(
            endpoint: all, http: http, dataDirectory: layout.dataDirectory.path, metricsBase: metricsBase, tokenKeyFile: layout.tokenKey.path)
        let settings = StackSupervisor.Settings(
            layout: layout, executables: layout.dataDirectory, endpoint: all, http: http, metricsBase: metricsBase,
            replicas: (try? replicaCounts()) ?? [:])
        for child in StackSupervisor.children(settings, launch: launch) {
            ports.append(("\(child.name)'s /metrics (--metrics-base)", ListenAddress(host: "127.0.0.1", port: child.metricsPort)))
        }
        var taken: [String] = []
        for (what, address) in ports {
            do {
                try PortCheck.check(address)
            } catch let error as PortCheck.Taken {
                taken.append("\(address) for \(what) \(error.problem)")
            }
        }
        guard !taken.isEmpty else { return }
        throw CommandFailure(
            """
            cannot start a stack from \(layout.dataDirectory.path): \(taken.joined(separator: "; ")). \
            Another stack (canopy status --data-dir DIR shows it) or program holds them: stop it (canopy down --data-dir DIR), \
            or give this stack free ports with --broker tcp://127.0.0.1:PORT, --http 127.0.0.1:PORT and --metrics-base PORT (6 ports from it, and one more per extra replica)
            """)
    }

    /// The stack's id, made once per data directory (16 random bytes, hex) and kept.
    static func stackID(_ url: URL) throws -> String {
        if let text = try? String(contentsOf: url, encoding: .utf8), case let id = text.trimmingCharacters(in: .whitespacesAndNewlines),
            (try? CommonOptions.validate(stack: id)) != nil
        {
            return id
        }
        let id = (0..<16).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
        guard FileManager.default.createFile(atPath: url.path, contents: Data(id.utf8), attributes: [.posixPermissions: 0o600]) else {
            throw CommandFailure("cannot create the stack id \(url.path); check that its directory is writable")
        }
        return id
    }

    /// The API's token signing key, made once (48 random bytes, base64, mode 0600).
    static func makeTokenKey(_ url: URL) throws {
        guard !FileManager.default.fileExists(atPath: url.path) else { return }
        var bytes = [UInt8](repeating: 0, count: 48)
        for index in bytes.indices { bytes[index] = UInt8.random(in: 0...255) }
        guard FileManager.default.createFile(atPath: url.path, contents: Data(Data(bytes).base64EncodedString().utf8), attributes: [.posixPermissions: 0o600])
        else {
            throw CommandFailure("cannot create the token key \(url.path); check that its directory is writable")
        }
    }

    static func demoToken(_ executables: URL, key: URL, user: String = "demo") throws -> String {
        let issue = Process()
        issue.executableURL = executables.appendingPathComponent("canopy-api")
        issue.arguments = ["token", "issue", "--user", user, "--days", "7", "--token-key-file", key.path]
        let pipe = Pipe()
        issue.standardOutput = pipe
        try issue.run()
        let token = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        issue.waitUntilExit()
        guard issue.terminationStatus == 0, !token.isEmpty else { throw CommandFailure("canopy-api token issue failed") }
        return token
    }
}

/// `canopy status`: the local stack's services.
struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the local stack's services: pid, state, restarts, metrics address.",
        discussion: "Example: canopy status --data-dir ./.canopy")
    @OptionGroup var stack: StackOptions

    func run() throws {
        guard let state = stack.layout.state() else {
            throw CommandFailure("no stack has run from \(stack.layout.dataDirectory.path); start one with canopy up")
        }
        print(StackSupervisor.table(state))
        print(
            state.supervisorAlive
                ? "supervisor \(state.supervisor); the HTTP API on http://\(state.http); the broker on \(state.endpoint)"
                : "the stack is stopped; canopy up starts it")
    }
}

/// `canopy logs SERVICE`: a service's log.
struct Logs: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print a local stack service's log (--follow keeps printing).",
        discussion: "Example: canopy logs care --lines 50 --follow")
    @Argument(help: "The service: \(CanopyStack.services.map(\.name).joined(separator: ", ")), or canopy-up (the supervisor).") var service: String
    @Option(help: "Lines from the end to print first.") var lines = 100
    @Flag(help: "Keep printing what is added, until Ctrl-C.") var follow = false
    @OptionGroup var stack: StackOptions

    func validate() throws {
        let base = service.split(separator: "-").first.map(String.init) ?? service
        guard
            CanopyStack.services.contains(where: { $0.name == service || ($0.name == base && service.split(separator: "-").last.flatMap { Int($0) } != nil) })
                || service == "canopy-up"
        else {
            throw ValidationError("no service '\(service)'; the stack has \(CanopyStack.services.map(\.name).joined(separator: ", ")) (and canopy-up)")
        }
        guard lines >= 0 else { throw ValidationError("--lines cannot be negative") }
    }

    func run() throws {
        let path = stack.layout.log(service).path
        guard let handle = FileHandle(forReadingAtPath: path) else {
            throw CommandFailure("no log at \(path); has the stack run from \(stack.layout.dataDirectory.path)? (canopy up)")
        }
        // The last lines: read at most the last 1 MiB, however long the log grew.
        let size = handle.seekToEndOfFile()
        handle.seek(toFileOffset: size > 1 << 20 ? size - (1 << 20) : 0)
        let tail = String(decoding: handle.readDataToEndOfFile(), as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false)
        let shown = tail.suffix(lines + 1).joined(separator: "\n")
        FileHandle.standardOutput.write(Data(shown.utf8))
        guard follow else { return }
        while true {
            let more = handle.readDataToEndOfFile()
            if !more.isEmpty { FileHandle.standardOutput.write(more) }
            Thread.sleep(forTimeInterval: 0.3)
        }
    }
}

/// `canopy down`: stops the local stack.
struct Down: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Stop the local stack gracefully (the services finish what they hold).",
        discussion: "Example: canopy down --data-dir ./.canopy")
    @OptionGroup var stack: StackOptions

    func run() throws {
        guard let state = stack.layout.state(), state.supervisorAlive else {
            print("no stack runs from \(stack.layout.dataDirectory.path)")
            return
        }
        kill(state.supervisor, SIGTERM)
        let deadline = ContinuousClock.now + .seconds(120)
        while kill(state.supervisor, 0) == 0 && ContinuousClock.now < deadline {
            Thread.sleep(forTimeInterval: 0.2)
            if stack.layout.state()?.stopped == true { break }
        }
        while kill(state.supervisor, 0) == 0 && ContinuousClock.now < deadline { Thread.sleep(forTimeInterval: 0.1) }
        guard kill(state.supervisor, 0) != 0 else { throw CommandFailure("the stack's supervisor \(state.supervisor) did not stop within 2 minutes") }
        if let final = stack.layout.state() { print(StackSupervisor.table(final)) }
        print("stopped")
    }
}

/// A line on standard error (progress and events; tables go to standard output).
func note(_ text: String) {
    FileHandle.standardError.write(Data("canopy: \(text)\n".utf8))
}
