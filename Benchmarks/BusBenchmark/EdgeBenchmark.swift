import ArgumentParser
import CanopyAPI
import CanopyBroker
import CanopyBus
import CanopyCare
import CanopyImages
import CanopyImaging
import CanopyMessages
import CanopySamples
import CanopyServiceKit
import CanopyStore
import CanopyTesting
import CanopyWire
import Foundation
import Hummingbird
import Logging
import ServiceLifecycle
import Synchronization

/// canopy-api, the HTTP edge, under load from wrk (Debian): (1) a thumbnail GET (a
/// memory-cache hit) through canopy-api against the same bus call made directly by the
/// pipelined bus load generator and against a bare Hummingbird route answering the same bytes
/// from memory, at the same concurrency; (2) a collection screen (a page of plants, then each
/// plant's thumbnail and next task) from many app sessions, implicit batching on against off:
/// bus messages per screen and screens per second; (3) what an `Idempotency-Key` costs a POST:
/// the same snooze POSTs with a new key each and without, on one edge keeping keys.
struct EdgeBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "edge",
        abstract:
            "canopy-api under wrk: thumbnail GETs against the bus call and a bare Hummingbird route; a collection screen with implicit batching on and off.",
        discussion: "Needs wrk (apt-get install wrk). Example: canopy-bench edge --seconds 5 --connections 1,16,64 --sessions 50 --plants 100")

    @Option(help: "Seconds measured per setup and load.") var seconds = 5
    @Option(help: "Concurrent connections (HTTP) or clients (bus) for the thumbnail GET, comma-separated.") var connections = "1,16,64"
    @Option(help: "App sessions (people) loading their collection screen at once.") var sessions = 50
    @Option(help: "Plants in each person's collection.") var plants = 100
    @Option(help: "HTTP connections per app session.") var connectionsPerSession = 4
    @Option(help: "Rounds per setup; the best counts (the machine is shared and noisy).") var rounds = 2
    @Option(help: "What to measure: thumbnail, collection, keys; comma-separated.") var parts = "thumbnail,collection,keys"
    @Option(help: "Connections for the POSTs with and without an Idempotency-Key, comma-separated.") var keyConnections = "16,64"
    @Option(help: "Stores of canopy-care and canopy-api for the POSTs with and without a key: sqlite, postgres (a throwaway server), comma-separated.")
    var keyStores = "sqlite,postgres"
    @Option(help: "Batches of one kind in the air before lookups wait (canopy-api's --batch-in-flight) for the edge with implicit batching on.")
    var batchInFlight = APIServiceSettings(http: .anyLoopbackPort, bus: .init(endpoint: "tcp://127.0.0.1:1"), tokenKey: []).batchInFlight

    func run() async throws {
        guard let wrk = which("wrk") else { throw CommandFailure("wrk is not installed; apt-get install wrk, then run again") }
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-edge-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let key = Array("the canopy-bench edge signing key, long enough".utf8)

        let parts = Set(parts.split(separator: ",").map(String.init))
        // (1) and (2) share a stack; (3) makes its own per store.
        if parts.contains("thumbnail") || parts.contains("collection") {
            // The stack: canopy-images and canopy-care behind the broker, canopy-api twice (implicit
            // batching on, and off), and a bare Hummingbird route.
            var edges: [APIHTTPServer] = []
            let bare = BareRoute()
            let stack = try await BenchStack(logger: logger) { endpoint, context in
                var images = ImageServiceSettings(directory: directory.appendingPathComponent("images"), runner: .init(endpoint: endpoint))
                images.runner.credit = 64
                var care = CareServiceSettings(directory: directory.appendingPathComponent("care"), runner: .init(endpoint: endpoint))
                care.runner.credit = 64
                var services = try await buildImageService(settings: images, context: context, logger: logger)
                services += try await buildCareService(settings: care, context: context, logger: logger)
                // Implicit batching on, and off.
                for window in [Duration.milliseconds(2), .zero] {
                    var settings = APIServiceSettings(http: .anyLoopbackPort, bus: .init(endpoint: endpoint), tokenKey: key)
                    settings.rateLimit = 1_000_000
                    settings.rateBurst = 1_000_000
                    settings.batchWindow = window
                    settings.batchInFlight = batchInFlight
                    let built = try buildAPIService(settings: settings, context: context, logger: logger)
                    edges += built.compactMap { $0 as? APIHTTPServer }
                    services += built
                }
                return services + [bare]
            }
            let client = stack.client
            for service in [Images.service, Care.service] {
                while (try? await client.call(Broker.Services.self, Empty()))?.first(where: { $0.name == service }) == nil {
                    try await Task.sleep(for: .milliseconds(50))
                }
            }
            let batchingOn = "http://127.0.0.1:\(try await edges[0].boundPort())"
            let batchingOff = "http://127.0.0.1:\(try await edges[1].boundPort())"
            let tokens = try TokenAuthority(key: key)
            let script = directory.appendingPathComponent("canopy.lua")
            try Self.wrkScript.write(to: script, atomically: true, encoding: .utf8)
            let runner = WrkRunner(wrk: wrk, script: script.path)

            if parts.contains("thumbnail") { try await thumbnails(stack: stack, tokens: tokens, runner: runner, bare: bare, edges: (batchingOn, batchingOff)) }
            if parts.contains("collection") {
                try await collection(stack: stack, tokens: tokens, runner: runner, edges: (batchingOn, batchingOff), directory: directory)
            }
            await stack.shutdown()
        }
        if parts.contains("keys") {
            let posts = directory.appendingPathComponent("posts.lua")
            try Self.postScript.write(to: posts, atomically: true, encoding: .utf8)
            for backend in keyStores.split(separator: ",").map(String.init) {
                try await keys(backend: backend, key: key, runner: WrkRunner(wrk: wrk, script: posts.path), directory: directory, logger: logger)
            }
        }
    }

    /// A stack of canopy-care and one canopy-api (implicit batching on) keeping idempotency
    /// keys, both on `backend`'s store: SQLite files, or a throwaway PostgreSQL they share.
    private func keyStack(backend: String, key: [UInt8], directory: URL, logger: Logger) async throws -> (
        BenchStack, APIHTTPServer, PostgresServer?, PostgresSettings?
    ) {
        var postgres: PostgresSettings?
        var server: PostgresServer?
        switch backend {
        case "sqlite": break
        case "postgres":
            progress("starting a throwaway PostgreSQL (Debian's postgresql)…\n")
            let started = try await PostgresServer()
            server = started
            postgres = PostgresSettings(url: try await started.database("canopy_bench_keys"))
        default: throw ValidationError("--key-stores lists sqlite and postgres; got \(backend)")
        }
        var edge: APIHTTPServer?
        let stack = try await BenchStack(logger: logger) { [batchInFlight] endpoint, context in
            var care = CareServiceSettings(directory: directory.appendingPathComponent("keys-\(backend)/care"), runner: .init(endpoint: endpoint))
            care.runner.credit = 64
            care.postgres = postgres
            var services = try await buildCareService(settings: care, context: context, logger: logger)
            var settings = APIServiceSettings(http: .anyLoopbackPort, bus: .init(endpoint: endpoint), tokenKey: key)
            settings.rateLimit = 1_000_000
            settings.rateBurst = 1_000_000
            settings.batchInFlight = batchInFlight
            settings.store = try await openAPIStore(
                directory: directory.appendingPathComponent("keys-\(backend)/api"), postgres: postgres, logger: logger)
            let built = try buildAPIService(settings: settings, context: context, logger: logger)
            edge = built.compactMap { $0 as? APIHTTPServer }.first
            services += built
            return services
        }
        while (try? await stack.client.call(Broker.Services.self, Empty()))?.first(where: { $0.name == Care.service }) == nil {
            try await Task.sleep(for: .milliseconds(50))
        }
        guard let edge else { throw BenchmarkFailure("canopy-api was not built") }
        return (stack, edge, server, postgres)
    }

    /// (1) One thumbnail, a memory hit, for one person, at each load.
    private func thumbnails(stack: BenchStack, tokens: TokenAuthority, runner: WrkRunner, bare: BareRoute, edges: (on: String, off: String)) async throws {
        let (client, batchingOn, batchingOff, barePort) = (stack.client, edges.on, edges.off, try await bare.port.wait())
        let photo = try await client.call(
            Images.Put.self, .init(plantID: "bench-plant", data: Data(try SyntheticPlant.species(1).photo(seed: 1, width: 1024, height: 768))),
            principal: "bench")
        let thumbnail = try await client.call(Images.GetVariant.self, .init(sha256: photo.sha256, variant: .thumbnail), principal: "bench")
        bare.bytes.withLock { $0 = thumbnail.data }
        let token = try await tokens.issue(user: "bench", lifetime: .seconds(3_600))
        let header = "Authorization: Bearer \(token)"
        let path = "/v1/photos/\(photo.sha256)/variants/thumbnail"
        let busRequest = WireMessage.request(
            WireRequest(
                correlation: Wire.frame(UInt64(0)), service: Images.service, operation: Images.GetVariant.name,
                header: RequestHeader(timeoutMilliseconds: 30_000, flags: RequestHeader.Flag.idempotent, principal: "bench"),
                body: try MessageCodec().encode(Images.GetVariant.Request(sha256: photo.sha256, variant: .thumbnail)))
        ).encoded
        print(
            "canopy-bench edge: a \(thumbnail.data.count)-byte thumbnail (memory hit), \(seconds) s per setup and load, best of \(rounds) rounds, wrk \(runner.version)"
        )
        var rows = [["setup", "connections", "requests/s", "p50 µs", "p99 µs", "p99 vs direct call", "generator cores", "errors"]]
        for connections in connections.split(separator: ",").compactMap({ Int($0) }) {
            progress("  thumbnail GETs over \(connections) connection(s)…\n")
            var bus = LoadResult(), on = WrkResult(), off = WrkResult(), hummingbird = WrkResult(), direct = LoadResult()
            for _ in 0..<rounds {
                let called = try await Self.callers(connections, seconds: seconds) {
                    _ = try await client.call(Images.GetVariant.self, .init(sha256: photo.sha256, variant: .thumbnail), principal: "bench")
                }
                if direct.requests == 0 || called.throughput > direct.throughput { direct = called }
                let load = PipelinedLoad(endpoint: stack.broker.endpoint, clients: connections, window: 1, threads: 1, request: busRequest)
                let measured = try load.run(warmUp: .milliseconds(500), duration: .seconds(seconds))
                if bus.requests == 0 || measured.throughput > bus.throughput { bus = measured }
                on = Swift.max(on, try runner.run(url: batchingOn + path, connections: connections, seconds: seconds, header: header))
                off = Swift.max(off, try runner.run(url: batchingOff + path, connections: connections, seconds: seconds, header: header))
                hummingbird = Swift.max(hummingbird, try runner.run(url: "http://127.0.0.1:\(barePort)/thumbnail", connections: connections, seconds: seconds))
            }
            let baseline = Double(max(direct.p99, 1))
            rows.append([
                "images.variant, BusClient.call from \(connections) caller(s) (baseline)", "\(connections)", String(format: "%.0f", direct.throughput),
                "\(direct.p50)", "\(direct.p99)", "1.00", "in process", "\(direct.errors)",
            ])
            rows.append([
                "images.variant, raw frames (pipelined generator)", "\(connections)", String(format: "%.0f", bus.throughput), "\(bus.p50)", "\(bus.p99)",
                String(format: "%.2f", Double(bus.p99) / baseline), String(format: "%.2f", bus.generatorCoreShare), "\(bus.errors)",
            ])
            for (name, result) in [
                ("GET through canopy-api, implicit batching on", on), ("GET through canopy-api, batching off", off),
                ("GET from a bare Hummingbird route (memory)", hummingbird),
            ] {
                rows.append([
                    name, "\(connections)", String(format: "%.0f", result.throughput), "\(result.p50)", "\(result.p99)",
                    String(format: "%.2f", Double(result.p99) / baseline), String(format: "%.2f", result.generatorCoreShare), "\(result.errors)",
                ])
            }
        }
        print(
            "\n(1) thumbnail GET, memory hit: canopy-api against the same bus call and a bare Hummingbird route (target: p99 at most 1.30 of the same call made directly)"
        )
        printTable(rows)
        fflush(nil) // out now, also when it goes to a file

    }

    /// (2) The collection screen, implicit batching off and on.
    private func collection(stack: BenchStack, tokens: TokenAuthority, runner: WrkRunner, edges: (on: String, off: String), directory: URL) async throws {
        let (client, batchingOn, batchingOff) = (stack.client, edges.on, edges.off)
        progress("  seeding \(sessions) people with \(plants) plants and a photo each…\n")
        let photos = try (0..<plants).map { try SyntheticPlant.species($0 % 5).photo(seed: $0, width: 320, height: 240) }
        var lines: [String] = []
        for session in 0..<sessions {
            let user = "person-\(session)"
            let token = try await tokens.issue(user: user, lifetime: .seconds(3_600))
            let seeded = try await withThrowingTaskGroup(of: (String, String).self) { group in
                for index in 0..<plants {
                    group.addTask {
                        let plant = try await client.call(
                            Care.AddPlant.self, .init(scientificName: "Monstera deliciosa", customName: "Plant \(index)"), principal: user)
                        let photo = try await client.call(Images.Put.self, .init(plantID: plant.id, data: Data(photos[index])), principal: user)
                        return (plant.id, photo.sha256)
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            for offset in stride(from: 0, to: plants, by: 20) { lines.append("\(token) /v1/plants?limit=20&offset=\(offset)") }
            for (plant, sha256) in seeded {
                lines.append("\(token) /v1/photos/\(sha256)/variants/thumbnail")
                lines.append("\(token) /v1/plants/\(plant)/next-task")
            }
        }
        let screen = lines.count / sessions
        let paths = directory.appendingPathComponent("screens.txt")
        try lines.joined(separator: "\n").appending("\n").write(to: paths, atomically: true, encoding: .utf8)
        let connections = sessions * connectionsPerSession
        // Made and cached once, as they would be after the first screen.
        _ = try runner.run(url: batchingOff + "/", connections: connections, seconds: 3, paths: paths.path)

        func busRequests() async throws -> UInt64 {
            try await client.call(Broker.Stats.self, Empty()).operations.filter { $0.service != Broker.service }.map(\.requests).reduce(0, +)
        }
        var screens: [String: (result: WrkResult, busPerScreen: Double)] = [:]
        for _ in 0..<rounds {
            for (name, base) in [("off", batchingOff), ("on", batchingOn)] {
                progress("  collection screens, implicit batching \(name)…\n")
                let before = try await busRequests()
                let result = try runner.run(url: base + "/", connections: connections, seconds: seconds, paths: paths.path)
                let bus = Double(try await busRequests() - before)
                let perScreen = bus / (Double(result.requests) / Double(screen))
                if result.throughput > (screens[name]?.result.throughput ?? 0) { screens[name] = (result, perScreen) }
            }
        }
        let (off, on) = (screens["off"]!, screens["on"]!)
        var table = [["implicit batching", "HTTP requests/s", "screens/s", "p50 µs", "p99 µs", "bus messages per screen", "generator cores", "errors"]]
        for (name, entry) in [("off", off), ("on (2 ms window, 64 keys, \(batchInFlight) in the air)", on)] {
            table.append([
                name, String(format: "%.0f", entry.result.throughput), String(format: "%.1f", entry.result.throughput / Double(screen)),
                "\(entry.result.p50)", "\(entry.result.p99)", String(format: "%.1f", entry.busPerScreen),
                String(format: "%.2f", entry.result.generatorCoreShare), "\(entry.result.errors)",
            ])
        }
        print(
            "\n(2) a collection screen (\(plants / 20) pages of 20 plants, then \(plants) thumbnails and \(plants) next tasks: \(screen) requests) from \(sessions) sessions over \(connections) connections"
        )
        printTable(table)
        print(
            String(
                format: "bus messages, off against on: %.1f times fewer (target at least 10); screens per second, on against off: %.2f (target at least 1.00)",
                off.busPerScreen / max(on.busPerScreen, 0.001), on.result.throughput / max(off.result.throughput, 0.001)))
    }

    /// (3) `POST /v1/tasks/{id}/snooze` for `sessions` people, each with a new
    /// `Idempotency-Key` and without one, alternating, on an edge that keeps keys, with
    /// canopy-care and canopy-api on `backend`'s store.
    private func keys(backend: String, key: [UInt8], runner: WrkRunner, directory: URL, logger: Logger) async throws {
        let (stack, edgeServer, server, postgres) = try await keyStack(backend: backend, key: key, directory: directory, logger: logger)
        defer { server?.stop() }
        let edge = "http://127.0.0.1:\(try await edgeServer.boundPort())"
        let (client, tokens) = (stack.client, try TokenAuthority(key: key))
        progress("  \(backend): seeding \(sessions) people with a plant each…\n")
        var lines: [String] = []
        for session in 0..<sessions {
            let user = "poster-\(session)"
            let plant = try await client.call(Care.AddPlant.self, .init(scientificName: "Monstera deliciosa"), principal: user)
            let tasks = try await client.call(Care.UpcomingTasks.self, .init(days: 366, limit: 50), principal: user)
            guard let task = (tasks.overdue + tasks.upcoming).first(where: { $0.plantID == plant.id }) else {
                throw BenchmarkFailure("\(user)'s plant has no task")
            }
            lines.append("\(try await tokens.issue(user: user, lifetime: .seconds(3_600))) /v1/tasks/\(task.id)/snooze")
        }
        let paths = directory.appendingPathComponent("posts-\(backend).txt")
        try lines.joined(separator: "\n").appending("\n").write(to: paths, atomically: true, encoding: .utf8)
        var rows = [
            [
                "connections", "Idempotency-Key", "requests/s", "vs without", "p50 µs", "p99 µs", "p99 vs without", "stack CPU µs/request",
                "PostgreSQL CPU µs/request", "generator cores", "errors",
            ]
        ]
        // The run, with the CPU PostgreSQL spent in it when it is the store.
        func run(_ connections: Int, _ mode: String) throws -> WrkResult {
            let (before, stackBefore) = (server.map { databaseCPUSeconds($0.pid) } ?? 0, processCPU())
            var result = try runner.run(url: edge + "/", connections: connections, seconds: seconds, paths: paths.path, arguments: [mode])
            result.databaseCPUSeconds = (server.map { databaseCPUSeconds($0.pid) } ?? 0) - before
            result.processCPUSeconds = processCPU() - stackBefore
            return result
        }
        for connections in keyConnections.split(separator: ",").compactMap({ Int($0) }) {
            progress("  \(backend): snooze POSTs over \(connections) connections, with and without a key…\n")
            // Warm, and every person at their bound of keys (the costly case: each new key drops their oldest).
            for _ in 0..<2 { _ = try runner.run(url: edge + "/", connections: connections, seconds: 2, paths: paths.path, arguments: ["keyed"]) }
            var plain = WrkResult(), keyed = WrkResult()
            for _ in 0..<rounds {
                plain = Swift.max(plain, try run(connections, "plain"))
                keyed = Swift.max(keyed, try run(connections, "keyed"))
            }
            for (name, result) in [("without (baseline)", plain), ("a new one each", keyed)] {
                rows.append([
                    "\(connections)", name, String(format: "%.0f", result.throughput), String(format: "%.2f", result.throughput / max(plain.throughput, 1)),
                    "\(result.p50)", "\(result.p99)", String(format: "%.2f", Double(result.p99) / Double(max(plain.p99, 1))),
                    String(format: "%.0f", result.processCPUSeconds * 1e6 / Double(max(result.requests, 1))),
                    server == nil ? "-" : String(format: "%.0f", result.databaseCPUSeconds * 1e6 / Double(max(result.requests, 1))),
                    String(format: "%.2f", result.generatorCoreShare), "\(result.errors)",
                ])
            }
        }
        await stack.shutdown()
        print(
            "\n(3) POST /v1/tasks/{id}/snooze from \(sessions) people, with a new Idempotency-Key each and without (same edge; canopy-care and canopy-api on \(backend)), best of \(rounds) rounds; targets: at least 0.90 of the requests/s, p99 at most 1.30"
        )
        printTable(rows)

        // What the store's two calls cost alone, one after another.
        let store: any APIStoring
        if let postgres {
            store = try await openAPIStore(directory: directory, postgres: postgres, logger: logger)
        } else {
            store = try await openAPIStore(directory: directory.appendingPathComponent("alone"), postgres: nil, logger: logger)
        }
        let kept = KeptAnswer(status: 200, headers: [["Content-Type", "application/json"]], body: [UInt8](repeating: 0x61, count: 300))
        let clock = ContinuousClock()
        var best = Duration.seconds(1)
        for round in 0..<rounds {
            let start = clock.now
            for index in 0..<5_000 {
                let claim = IdempotencyClaim(
                    person: "alone-\(index % sessions)", route: "POST /v1/plants", key: "\(round)-\(index)",
                    fingerprint: [UInt8](repeating: 1, count: 32), lease: 30)
                _ = try await store.claim(claim, now: Date())
                try await store.answer(claim, with: kept, now: Date())
            }
            best = Swift.min(best, (clock.now - start) / 5_000)
        }
        print(
            String(
                format: "the store alone: a key claimed and its answer kept, %.0f µs (%@, one caller, best of %d rounds of 5,000)",
                Double(best.attoseconds) / 1e12 + Double(best.seconds) * 1e6, backend, rounds))
    }

    /// `count` tasks each making `call` one after another for `seconds` (after a half-second
    /// warm-up): how the same bus call fares made directly, as a Swift service makes it.
    static func callers(_ count: Int, seconds: Int, _ call: @escaping @Sendable () async throws -> Void) async throws -> LoadResult {
        let clock = ContinuousClock()
        let measureFrom = clock.now + .milliseconds(500)
        let end = measureFrom + .seconds(seconds)
        var merged = try await withThrowingTaskGroup(of: LoadResult.self) { group in
            for _ in 0..<count {
                group.addTask {
                    var result = LoadResult()
                    while clock.now < end {
                        let start = clock.now
                        do { try await call() } catch { if start >= measureFrom { result.errors += 1 } }
                        if start >= measureFrom {
                            result.requests += 1
                            _ = result.latencyMicros.record(UInt64((clock.now - start).microseconds))
                        }
                    }
                    return result
                }
            }
            return try await group.reduce(into: LoadResult()) { $0.merge($1) }
        }
        merged.seconds = Double(seconds)
        return merged
    }

    /// The Lua script wrk runs: with a file of `TOKEN PATH` lines, each request is the next line
    /// (each thread starts at its own place); it prints its figures in one line at the end.
    static let wrkScript = """
        local lines = {}
        local index = 0
        function init(args)
          if args[1] then
            for line in io.lines(args[1]) do
              local token, path = line:match("^(%S+) (%S+)$")
              if token then lines[#lines + 1] = wrk.format("GET", path, { ["Authorization"] = "Bearer " .. token }) end
            end
            index = math.random(#lines)
          end
        end
        function request()
          if #lines == 0 then return wrk.request() end
          index = index % #lines + 1
          return lines[index]
        end
        \(wrkDone)
        """
}

extension EdgeBenchmark {
    /// How each wrk script ends: its figures in one line (``WrkRunner`` reads it).
    static let wrkDone = """
        function done(summary, latency, requests)
          local e = summary.errors
          io.write(string.format("canopy-wrk %d %d %d %d %d\\n", summary.requests, e.status + e.connect + e.read + e.write + e.timeout,
            latency:percentile(50), latency:percentile(99), summary.duration))
        end
        """

    /// The Lua script of (3): each request the next `TOKEN PATH` line's snooze POST; with
    /// `keyed`, a new `Idempotency-Key` each (the thread's number, the time, a counter).
    static let postScript = """
        local lines = {}
        local index = 0
        local keyed = false
        local counter = 0
        local prefix = ""
        local threads = 0
        function setup(thread)
          threads = threads + 1
          thread:set("number", threads)
        end
        function init(args)
          for line in io.lines(args[1]) do
            local token, path = line:match("^(%S+) (%S+)$")
            if token then lines[#lines + 1] = { token = token, path = path } end
          end
          keyed = args[2] == "keyed"
          prefix = tostring(number) .. "-" .. tostring(os.time()) .. "-"
          index = (number * 7) % #lines
        end
        function request()
          index = index % #lines + 1
          counter = counter + 1
          local entry = lines[index]
          local headers = { ["Authorization"] = "Bearer " .. entry.token, ["Content-Type"] = "application/json" }
          if keyed then headers["Idempotency-Key"] = prefix .. counter end
          return wrk.format("POST", entry.path, headers, '{"until":"2031-01-01T09:00:00.000Z"}')
        end
        \(wrkDone)
        """
}

/// What one wrk run measured, and the CPU time wrk itself used.
struct WrkResult: Comparable {
    var requests = 0
    /// CPU seconds a database server beside it used in the run, when one was measured.
    var databaseCPUSeconds = 0.0
    /// CPU seconds the benchmark's process (the stack under test) used in the run, when measured.
    var processCPUSeconds = 0.0
    var errors = 0
    var p50: UInt64 = 0
    var p99: UInt64 = 0
    var seconds = 0.0
    var generatorCPUSeconds = 0.0
    var throughput: Double { seconds > 0 ? Double(requests) / seconds : 0 }
    var generatorCoreShare: Double { seconds > 0 ? generatorCPUSeconds / seconds : 0 }
    static func < (lhs: Self, rhs: Self) -> Bool { lhs.throughput < rhs.throughput }
}

/// Runs wrk with the benchmark's script and reads its figures.
struct WrkRunner {
    let wrk: String
    let script: String

    var version: String {
        (try? output(["--version"]))?.split(separator: " ").dropFirst().first.map(String.init) ?? "?"
    }

    func run(url: String, connections: Int, seconds: Int, header: String? = nil, paths: String? = nil, arguments extra: [String] = []) throws -> WrkResult {
        var arguments = ["-t", "\(min(2, connections))", "-c", "\(connections)", "-d", "\(seconds)s", "--timeout", "10s", "-s", script]
        if let header { arguments += ["-H", header] }
        arguments.append(url)
        if let paths { arguments += ["--", paths] + extra }
        let before = childCPUSeconds()
        let text = try output(arguments)
        guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix("canopy-wrk ") }) else {
            throw BenchmarkFailure("wrk printed no figures:\n\(text)")
        }
        let numbers = line.split(separator: " ").dropFirst().compactMap { UInt64($0) }
        guard numbers.count == 5 else { throw BenchmarkFailure("wrk's figures are not five numbers: \(line)") }
        return WrkResult(
            requests: Int(numbers[0]), errors: Int(numbers[1]), p50: numbers[2], p99: numbers[3], seconds: Double(numbers[4]) / 1e6,
            generatorCPUSeconds: childCPUSeconds() - before)
    }

    private func output(_ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: wrk)
        process.arguments = arguments
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return String(decoding: data, as: UTF8.self)
    }

    /// CPU time (user and system) of the children waited for so far: wrk's, after each run.
    private func childCPUSeconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_CHILDREN.rawValue, &usage)
        return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
    }
}

/// The HTTP stack's own limit: a Hummingbird route answering a thumbnail's bytes from memory,
/// with the headers canopy-api sends.
final class BareRoute: Service, Sendable {
    let bytes = Mutex(Data())
    let port = BoundPort(listener: "the bare Hummingbird route")

    func run() async throws {
        let router = Router()
        router.get("/thumbnail") { [self] _, _ -> Response in
            let data = self.bytes.withLock { $0 }
            return Response(
                status: .ok,
                headers: [
                    .contentType: "image/jpeg", .eTag: "\"bare-thumbnail-jpeg\"",
                    .cacheControl: "private, max-age=31536000, immutable",
                ],
                body: .init(byteBuffer: ByteBuffer(bytes: data)))
        }
        let port = self.port
        let application = Application(
            router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)),
            onServerRunning: { port.set($0.localAddress?.port) })
        try await application.run()
    }
}
