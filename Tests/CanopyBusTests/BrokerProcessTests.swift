import CZeroMQ
import CanopyBus
import CanopyMessages
import CanopyServiceKit
import CanopyTesting
import Foundation
import Logging
import Synchronization
import Testing

/// `canopy-broker` as a process, as operators run it: shutdown, CurveZMQ keys from files, a
/// flood of malformed messages, and memory given back after a burst.
@Suite(.serialized)
struct BrokerProcessTests {
    /// A broker process whose standard error is collected as it runs.
    final class BrokerProcess: Sendable {
        let process: Process
        private let log = Mutex(Data())

        init(_ arguments: [String], environment: [String: String] = [:]) throws {
            process = Process()
            process.executableURL = try LiveBus.executable("canopy-broker")
            process.arguments = ["serve", "--bind", "tcp://127.0.0.1:*", "--metrics-bind", "127.0.0.1:0"] + arguments
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
            let errors = Pipe()
            process.standardError = errors
            process.standardOutput = FileHandle.nullDevice
            errors.fileHandleForReading.readabilityHandler = { [weak self] handle in
                let data = handle.availableData
                self?.log.withLock { $0.append(data) }
            }
            try process.run()
        }

        var text: String { log.withLock { String(decoding: $0, as: UTF8.self) } }
        var logBytes: Int { log.withLock { $0.count } }

        /// The endpoint from the `broker.started` line, once it is there.
        func endpoint(within limit: Duration = .seconds(20)) async throws -> String {
            let pattern = #"broker.endpoint=tcp://127\.0\.0\.1:[0-9]+"#
            guard try await eventually(within: limit, { text.range(of: pattern, options: .regularExpression) != nil }),
                let range = text.range(of: pattern, options: .regularExpression)
            else {
                throw CommandFailure("the broker did not start: \(text)")
            }
            return String(text[range].dropFirst("broker.endpoint=".count))
        }

        /// Resident memory in bytes, from /proc.
        var residentBytes: Int {
            let status = (try? String(contentsOfFile: "/proc/\(process.processIdentifier)/status", encoding: .utf8)) ?? ""
            let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
            return (Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0) * 1024
        }

        func stop() {
            if process.isRunning { process.terminate() }
            process.waitUntilExit()
        }
    }

    /// A DEALER socket connected to the broker at `endpoint`, and its context.
    static func dealer(to endpoint: String, highWaterMarks: Int32? = nil) throws -> (ZMQContext, ZMQSocket) {
        let context = ZMQContext()
        let socket = try ZMQSocket(context, type: .dealer)
        if let highWaterMarks { try socket.setHighWaterMarks(highWaterMarks) } // before the connection's queues are made
        try socket.connect(endpoint)
        return (context, socket)
    }

    func run(_ name: String, _ arguments: [String], environment: [String: String] = [:]) async throws -> ProcessResult {
        try await runExecutable(name, arguments, environment: environment)
    }

    @Test func healthOverHTTPSaysWhetherTheLoopTurns() async throws {
        let broker = try BrokerProcess(["--log-level", "info"])
        _ = try await broker.endpoint()
        var port: Int?
        _ = try await eventually {
            if let range = broker.text.range(of: #"operating.address=127\.0\.0\.1:[0-9]+"#, options: .regularExpression) {
                port = Int(broker.text[range].split(separator: ":").last ?? "")
            }
            return port != nil
        }
        let listener = "127.0.0.1:\(try #require(port))"
        let healthy = try await run("canopy-broker", ["health", "--via", "http", "--metrics-bind", listener])
        #expect(healthy.status == 0, "\(healthy.output)")
        #expect(healthy.output.hasPrefix("healthy: loop bound, turning"))
        broker.stop()
        let gone = try await run("canopy-broker", ["health", "--via", "http", "--metrics-bind", listener])
        #expect(gone.status == 1 && gone.output.contains("nothing answers"))
    }

    @Test func theBrokerStopsGracefullyOnSIGTERM() async throws {
        let broker = try BrokerProcess(["--log-level", "info"])
        _ = try await broker.endpoint()
        broker.stop() // SIGTERM
        #expect(broker.process.terminationStatus == 0)
        #expect(try await eventually { broker.text.contains("broker.stopped") }, "its last lines are read")
        #expect(broker.text.contains("broker.draining"))
        #expect(broker.text.contains("broker.stopped"))
    }

    @Test func keysFromFilesLetOnlyAllowedPeersIn() async throws {
        guard Curve.isAvailable else { return }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-keys-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        for name in ["broker", "ops", "stranger"] {
            let made = try await run("canopy", ["keys", "generate", name, "--directory", directory.path])
            #expect(made.status == 0, "\(made.errors)")
            #expect(made.output.contains("public key: "))
        }
        let secret = directory.appendingPathComponent("broker.key").path
        let attributes = try FileManager.default.attributesOfItem(atPath: secret)
        #expect((attributes[.posixPermissions] as? Int) == 0o600, "the secret key is readable by its owner only")
        let again = try await run("canopy", ["keys", "generate", "broker", "--directory", directory.path])
        #expect(again.status != 0 && again.errors.contains("--force"), "an existing key is not overwritten")

        let ops = try Curve.publicKey(directory.appendingPathComponent("ops.pub").path)
        let allow = directory.appendingPathComponent("allow")
        try "# who may talk to the broker\nclient \(ops)\n".write(to: allow, atomically: true, encoding: .utf8)
        let secretKey = try Curve.readKeyPair(file: secret).secretKey
        let broker = try BrokerProcess(["--curve-secret-key-file", secret, "--curve-allow", allow.path, "--log-level", "debug"])
        defer { broker.stop() }
        let endpoint = try await broker.endpoint()
        let serverKey = directory.appendingPathComponent("broker.pub").path

        let allowed = try await run(
            "canopy-broker",
            [
                "health", "--endpoint", endpoint, "--curve-server-key", serverKey,
                "--curve-secret-key-file", directory.appendingPathComponent("ops.key").path,
            ])
        #expect(allowed.status == 0, "\(allowed.output)")
        let stranger = try await run(
            "canopy-broker",
            [
                "health", "--endpoint", endpoint, "--curve-server-key", serverKey,
                "--curve-secret-key-file", directory.appendingPathComponent("stranger.key").path,
            ])
        #expect(stranger.status != 0)
        #expect(stranger.output.contains("CURVE key"), "told why: \(stranger.output)")
        let plain = try await run("canopy-broker", ["health", "--endpoint", endpoint])
        #expect(plain.status != 0)
        #expect(!broker.text.contains(secretKey), "the secret key is never logged")

        // The operator takes ops off the list and asks the broker to read it again (SIGHUP,
        // what canopy keys reload --pid sends): ops is refused from then on, without a restart.
        try "# nobody now\n".write(to: allow, atomically: true, encoding: .utf8)
        let reload = try await run("canopy", ["keys", "reload", "--pid", "\(broker.process.processIdentifier)"])
        #expect(reload.status == 0, "\(reload.errors)")
        #expect(try await eventually { broker.text.contains("broker.curve.reloaded") }, "\(broker.text.suffix(500))")
        let removed = try await run(
            "canopy-broker",
            [
                "health", "--endpoint", endpoint, "--curve-server-key", serverKey,
                "--curve-secret-key-file", directory.appendingPathComponent("ops.key").path,
            ])
        #expect(removed.status != 0, "ops is no longer let in: \(removed.output)")
        #expect(broker.process.isRunning, "SIGHUP reloads; it does not stop the broker")

        let missing = try await run("canopy-broker", ["serve", "--curve-secret-key-file", secret])
        #expect(missing.status != 0 && missing.errors.contains("--curve-allow"))
    }

    @Test func aFloodOfMalformedMessagesCostsAFewLogLinesAndIsCounted() async throws {
        let broker = try BrokerProcess(["--log-level", "info"])
        defer { broker.stop() }
        let endpoint = try await broker.endpoint()
        let (context, socket) = try Self.dealer(to: endpoint)
        defer { socket.close() }
        let before = broker.logBytes
        // Every 50th a message of more frames than any protocol has (read in place up to 128, the
        // rest let go): dropped whole and counted like the others.
        let overlong = [Wire.version, Wire.Command.request.frame] + (0..<298).map { [UInt8(truncatingIfNeeded: $0)] }
        for index in 0..<20_000 {
            let frames: [[UInt8]] =
                switch index % 4 {
                case _ where index % 50 == 49: overlong
                case 0: [Array("junk".utf8)]
                case 1: [Wire.version, [0x7F]]
                case 2: [Wire.version, Wire.Command.request.frame, [1]]
                default: [Wire.version, Wire.Command.reply.frame]
                }
            try socket.send(frames, dontWait: false)
        }
        let client = try BusClient(configuration: .init(endpoint: endpoint), context: context, logger: .init(label: "test"))
        defer { client.close() }
        var malformed: UInt64 = 0
        _ = try await eventually(every: .milliseconds(50)) {
            malformed = try await client.call(Broker.Stats.self, .init()).malformed
            return malformed >= 20_000
        }
        #expect(malformed == 20_000)
        let written = broker.logBytes - before
        #expect(written < 8_000, "\(written) bytes of log for 20,000 malformed messages")
    }

    @Test func memoryOfABurstOfRefusedRequestsIsGivenBack() async throws {
        // Nothing is held for refused requests, yet a burst of them costs libzmq's and the
        // allocator's memory: once the burst calms it goes back to the system.
        // Heartbeats 10 s apart (a 30 s ZMTP timeout): a client whose burst the broker cannot
        // read as fast as it comes has its PONGs stuck behind its own requests, and on a loaded
        // machine a 6 s timeout cut this one off mid-burst (docs/PROTOCOL.md, "Heartbeats and liveness").
        let broker = try BrokerProcess(["--log-level", "info", "--heartbeat-ms", "10000"])
        defer { broker.stop() }
        let endpoint = try await broker.endpoint()
        // As the bus's own clients: libzmq reads on (and answers the broker's PINGs) while this task waits its turn.
        let (context, socket) = try Self.dealer(to: endpoint, highWaterMarks: 100_000)
        defer { withExtendedLifetime(context) { socket.close() } }
        let header = RequestHeader(timeoutMilliseconds: 60_000, principal: String(repeating: "p", count: 200)).frame
        var answered = 0
        func drain() throws { while try socket.receive() != nil { answered += 1 } }
        // Never blocked in a send: a client that stops reading while its queue to the broker is
        // full leaves the broker's answers unread, and with them its ZMTP PINGs, and the broker
        // drops it after the heartbeat timeout (with what it had in the air).
        func request(_ index: Int, service: String) async throws {
            let frames = [
                Wire.version, Wire.Command.request.frame, Array(repeating: 0x63, count: 56) + Wire.frame(UInt64(index)),
                Array(service.utf8), Array("op".utf8), header, [],
            ]
            while try !socket.send(frames, dontWait: true) {
                try drain()
                try await Task.sleep(for: .milliseconds(1))
            }
        }
        // The start-up grace holds requests for 64 unknown services; names past those are
        // refused noWorkers at once.
        for index in 0..<64 { try await request(index, service: "held-\(index)") }
        let client = try BusClient(configuration: .init(endpoint: endpoint), context: context, logger: .init(label: "test"))
        defer { client.close() }
        #expect(
            try await eventually {
                try await client.call(Broker.Stats.self, .init()).services.filter { $0.name.hasPrefix("held-") }.map(\.queued).reduce(0, +) == 64
            }, "the 64 requests are held before the baseline is read")
        let baseline = broker.residentBytes
        var peak = baseline
        for index in 0..<300_000 {
            try await request(64 + index, service: "refused-\(index % 1_000)")
            if index % 100 == 0 { try drain() }
            if index % 1_000 == 0 {
                peak = max(peak, broker.residentBytes)
                await Task.yield() // a long loop on one of the cooperative pool's few threads
            }
        }
        _ = try await eventually(within: .seconds(60)) {
            try drain()
            peak = max(peak, broker.residentBytes)
            return answered >= 300_000
        }
        #expect(answered >= 300_000, "every refused request is answered: \(answered); the broker wrote: \(broker.text.suffix(2_000))")
        // Once the burst has calmed (the give-back runs at most once a second).
        let limit = baseline + max(8_000_000, (peak - baseline) / 2)
        var after = broker.residentBytes
        _ = try await eventually(within: .seconds(30), every: .milliseconds(100)) {
            after = broker.residentBytes
            return after < limit
        }
        #expect(after < limit, "given back: baseline \(baseline), peak \(peak), after \(after)")
    }

    @Test func memoryHeldForABurstIsGivenBack() async throws {
        // Within the start-up grace, requests for services nobody registered are held; when
        // it ends they are answered noWorkers and their memory must go back to the system.
        let broker = try BrokerProcess(["--log-level", "info", "--heartbeat-ms", "2000"])
        defer { broker.stop() }
        let endpoint = try await broker.endpoint()
        let baseline = broker.residentBytes
        let (context, socket) = try Self.dealer(to: endpoint)
        defer { withExtendedLifetime(context) { socket.close() } }
        let body = [UInt8](repeating: 0x7B, count: 1_000_000)
        for index in 0..<150 {
            let header = RequestHeader(timeoutMilliseconds: 60_000, principal: "user-1").frame
            try socket.send(
                [
                    Wire.version, Wire.Command.request.frame, Wire.frame(UInt64(index + 1)), Array("invented-\(index % 40)".utf8),
                    Array("op".utf8), header, body,
                ], dontWait: false)
        }
        var answered = 0, peak = 0
        _ = try await eventually(within: .seconds(30)) {
            peak = max(peak, broker.residentBytes)
            while let frames = try socket.receive() {
                #expect(frames[1] == Wire.Command.error.frame)
                answered += 1
            }
            return answered >= 150
        }
        #expect(answered == 150)
        // The give-back runs at most once a second.
        _ = try await eventually(within: .seconds(10), every: .milliseconds(100)) { broker.residentBytes < baseline + (peak - baseline) / 3 }
        let after = broker.residentBytes
        #expect(peak > baseline + 100_000_000, "the burst was held: \(baseline) -> \(peak)")
        #expect(after < baseline + (peak - baseline) / 3, "given back: peak \(peak), after \(after), baseline \(baseline)")
    }

    @Test func repliesForAReaderThatDoesNotReadCostAtMostItsBoundInMemory() async throws {
        // 300 replies of 1 MiB for a client that does not read took 300 MB and more of the
        // broker's memory before; now at most --max-unread-bytes-per-client waits for it.
        let broker = try BrokerProcess([
            "--log-level", "info", "--heartbeat-ms", "2000", "--liveness", "30",
            "--max-unread-bytes-per-client", "\(16 << 20)",
        ])
        defer { broker.stop() }
        let endpoint = try await broker.endpoint()
        let worker = Process()
        worker.executableURL = try LiveBus.executable("canopy-test-worker")
        worker.arguments = ["--endpoint", endpoint, "--name", "w1", "--credit", "4", "--heartbeat-ms", "2000", "--log-level", "critical"]
        try worker.run()
        defer {
            worker.terminate()
            worker.waitUntilExit()
        }
        let context = ZMQContext()
        let observer = try BusClient(configuration: .init(endpoint: endpoint), context: context, logger: Logger(label: "test"))
        func served() async -> Int {
            ((try? await observer.call(Broker.Stats.self, .init()))?.services.first { $0.name == "test" }?.served).map(Int.init) ?? -1
        }
        #expect(try await eventually(within: .seconds(30), every: .milliseconds(50)) { await served() >= 0 }, "the worker registered")
        let baseline = broker.residentBytes

        let (readerContext, reader) = try Self.dealer(to: endpoint)
        defer { withExtendedLifetime(readerContext) { reader.close() } }
        try reader.set(ZMQ_RCVHWM, 1)
        let body = try MessageCodec().encode(TestService.Request(text: "big", replyPaddingBytes: 1_000_000))
        for index in 0..<300 {
            try reader.send(
                [
                    Wire.version, Wire.Command.request.frame, Wire.frame(UInt64(index + 1)), Array("test".utf8), Array("echo".utf8),
                    RequestHeader(timeoutMilliseconds: 60_000).frame, body,
                ], dontWait: false)
        }
        var peak = baseline
        _ = try await eventually(within: .seconds(60), every: .milliseconds(20)) { // sampling the memory as it goes
            peak = max(peak, broker.residentBytes)
            return await served() >= 300
        }
        peak = max(peak, broker.residentBytes)
        let statistics = try await observer.call(Broker.Stats.self, .init())
        #expect(await served() >= 300, "the worker answered every request")
        #expect((statistics.slowReaderDrops ?? 0) > 200, "most were dropped: \(statistics.slowReaderDrops ?? 0)")
        #expect(peak - baseline < 80_000_000, "bounded: baseline \(baseline), peak \(peak)")
        observer.close()
    }
}
