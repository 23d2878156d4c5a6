import ArgumentParser
import AsyncHTTPClient
import CanopyBus
import CanopyImaging
import CanopyMessages
import CanopySamples
import CanopyServiceKit
import Foundation
import NIOCore
import NIOHTTP1

/// `canopy demo`: the journey an app makes, through the HTTP API of a running stack.
struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Walk through what an app does, over the HTTP API of a running stack (canopy up), each step with its timing.",
        discussion: """
            A new demo person identifies a photo (against reference photos the demo loads into
            canopy-identify), accepts the match as a plant, sees its care schedule, registers a
            log device, gets a reminder of a task due in a few seconds delivered, completes the
            task and sees the next one, and fetches the photo's thumbnail and palette.
            Example: canopy up --detach && canopy demo && canopy logs remind
            """)

    @Option(help: ArgumentHelp("Where the stack's HTTP API listens. Env: CANOPY_HTTP.", valueName: "host:port"))
    var http: String = Environment.string("CANOPY_HTTP") ?? "127.0.0.1:8080"
    @Option(help: "Seconds until the demo's reminder is due.") var reminderSeconds = 5
    @Option(help: "The demo person's user id (a new one each run by default).") var user: String?
    @OptionGroup var stack: StackOptions

    func validate() throws {
        guard (1...300).contains(reminderSeconds) else { throw ValidationError("--reminder-seconds must be from 1 to 300") }
    }

    /// The demo's reference species: made-up plants photographed as phones do (`PlantScene`),
    /// three photos each; the photo it identifies is another shot of the second.
    static let species = ["Plantago demonstrans", "Ficus exemplaris", "Monstera ostendens"]

    func run() async throws {
        let executables = URL(fileURLWithPath: Up.selfPath()).deletingLastPathComponent()
        let api = try DemoAPI(base: "http://\(http)")
        let person = user ?? "demo-\(String(UInt32.random(in: 0 ... .max), radix: 16))"
        var steps = DemoSteps()
        print("canopy demo against http://\(http), as \(person)")

        try await steps.run("a bearer token for \(person)") {
            api.token = try Up.demoToken(executables, key: stack.layout.tokenKey, user: person)
            return "canopy-api token issue, signed with \(stack.layout.tokenKey.path)"
        }
        try await steps.run("reference photos of \(Self.species.count) species") {
            try await loadReferences(executables)
        }
        let photo = try PlantScene.species(1).photo(seed: 10_000)
        var identification = ""
        try await steps.run("identify a photo (POST /v1/identifications)") {
            let form = MultipartForm.encode(
                [.init(name: "photo", type: "image/jpeg", bytes: photo), .init(name: "organ", bytes: Array("leaf".utf8))],
                boundary: DemoAPI.boundary)
            let answer = try await api.send(.POST, "/v1/identifications", body: form, type: "multipart/form-data; boundary=\(DemoAPI.boundary)")
            identification = try answer.string("id")
            let best = try answer.first("results")
            return "best match \(best["scientificName"] as? String ?? "?"), score \(String(format: "%.2f", best["score"] as? Double ?? 0))"
        }
        var plant = ""
        try await steps.run("accept it as a plant") {
            let answer = try await api.send(.POST, "/v1/identifications/\(identification)/accept", json: #"{"rank":1,"customName":"Demo plant"}"#)
            let object = try answer.object("plant")
            plant = object["id"] as? String ?? ""
            return "plant \(plant): \(object["customName"] as? String ?? "") (\(object["scientificName"] as? String ?? ""))"
        }
        var task = ""
        try await steps.run("its care schedule (GET /v1/tasks/upcoming)") {
            let tasks = try await api.send(.GET, "/v1/tasks/upcoming?days=60").array("tasks").filter { $0["plantID"] as? String == plant }
            task = tasks.first?["id"] as? String ?? ""
            let shown = tasks.prefix(3).map { "\($0["kind"] as? String ?? "") \(($0["due"] as? String ?? "").prefix(16))" }.joined(separator: ", ")
            return "\(tasks.count) tasks in 60 days: \(shown)\(tasks.count > 3 ? ", …" : "")"
        }
        var device = ""
        try await steps.run("register a log device (POST /v1/devices)") {
            device = try await api.send(.POST, "/v1/devices", json: #"{"channel":"log","address":"the demo's terminal","name":"demo"}"#).string("id")
            return "device \(device)"
        }
        let dueAt = Date(timeIntervalSinceNow: Double(reminderSeconds))
        try await steps.run("make the first task due in \(reminderSeconds) s (snooze)") {
            let until = dueAt.formatted(Date.ISO8601FormatStyle(includingFractionalSeconds: true))
            _ = try await api.send(.POST, "/v1/tasks/\(task)/snooze", json: #"{"until":"\#(until)"}"#)
            return "due at \(until)"
        }
        try await steps.run("its reminder delivered") {
            // canopy-remind sends it at its time (to the log channel: a line in its log, which a
            // local stack keeps in --data-dir); then it is no longer among the pending ones.
            // (The task's later occurrences stay pending: the one due now leaves the list.)
            let log = stack.layout.log("remind")
            let deadline = Date(timeIntervalSinceNow: Double(reminderSeconds) + 60)
            var most = 0
            while Date() < deadline {
                // The pending list is read only where the log is not at hand (a compose stack):
                // a read racing the snooze's way from canopy-care to canopy-remind (an outbox
                // follow-up) shows the old or the new schedule as the machine's load decides,
                // and a capture of the demo would then replay differently from run to run.
                let hasLog = FileManager.default.fileExists(atPath: log.path)
                var pending = 0
                if !hasLog {
                    pending = try await api.send(.GET, "/v1/reminders/pending?limit=256").array("reminders").filter { $0["taskID"] as? String == task }.count
                    most = max(most, pending)
                }
                if Date() >= dueAt.addingTimeInterval(-1) {
                    if hasLog {
                        // Decoded leniently: one bad byte anywhere in the log must not hide the line.
                        let text = String(decoding: FileManager.default.contents(atPath: log.path) ?? Data(), as: UTF8.self)
                        let lines = text.split(separator: "\n").filter { $0.contains(device) && $0.contains("remind.title") }
                        if let line = lines.last {
                            return
                                "sent to the log channel at \(line.prefix(19).replacingOccurrences(of: "T", with: " ")) (due \(dueAt.formatted(.iso8601).prefix(19).replacingOccurrences(of: "T", with: " "))): canopy logs remind"
                        }
                    } else if pending < most {
                        return "no longer pending: sent (canopy-remind's log has the delivery)"
                    }
                }
                try await Task.sleep(for: .milliseconds(250))
            }
            throw CommandFailure("the reminder was not delivered within a minute of its time; see canopy logs remind and canopy logs care")
        }
        try await steps.run("complete the task, then its plant's next task") {
            _ = try await api.send(.POST, "/v1/tasks/\(task)/complete", json: "{}")
            let next = try await api.send(.GET, "/v1/plants/\(plant)/next-task")
            let nextTask = (next.json as? [String: Any])?["task"] as? [String: Any]
            return "next: \(nextTask?["kind"] as? String ?? "none") due \((nextTask?["due"] as? String ?? "").prefix(16))"
        }
        try await steps.run("the photo's thumbnail and palette") {
            let photoID = try await api.send(.GET, "/v1/plants/\(plant)/photos").first("photos")["photoID"] as? String ?? ""
            let thumbnail = try await api.send(.GET, "/v1/photos/\(photoID)/variants/thumbnail")
            let palette = try await api.send(.GET, "/v1/photos/\(photoID)/palette").array("swatches").compactMap { $0["hex"] as? String }
            return "thumbnail \(thumbnail.body.count) bytes (\(thumbnail.headers["content-type"] ?? "")), palette \(palette.joined(separator: " "))"
        }
        print("done in \(steps.total) ms; the person's data stays in the stack (user \(person))")
    }

    /// Adds the demo species' reference photos to canopy-identify, once: over the bus
    /// (`identify.references.add`), so that a capture running meanwhile records them and a
    /// replay of it loads them in their place.
    private func loadReferences(_ executables: URL) async throws -> String {
        let identify = executables.appendingPathComponent("canopy-identify")
        let listed = try DemoAPI.run(identify, ["reference", "list", "--data-dir", stack.dataDir])
        let missing = Self.species.enumerated().filter { !listed.contains($0.element) }
        guard !missing.isEmpty else { return "already loaded" }
        guard let endpoint = stack.layout.state()?.endpoint else {
            throw CommandFailure(
                "no stack runs from \(stack.layout.dataDirectory.path) to load the reference photos into; start one with canopy up, or pass --data-dir")
        }
        var configuration = BusClient.Configuration(endpoint: endpoint)
        configuration.curve = try StackKeys.operatorSettings(dataDirectory: stack.layout.dataDirectory)
        let bus = try BusClient(configuration: configuration, context: ZMQContext(), logger: LogSetup.logger(label: "canopy", level: .error))
        defer { bus.close() }
        for (index, name) in missing {
            let photos = try (0..<3).map { seed in Data(try PlantScene.species(index).photo(seed: seed)) }
            _ = try await bus.call(
                Identification.AddReferences.self, .init(scientificName: name, commonNames: ["Demo plant \(index)"], family: "Demoaceae", data: photos),
                timeout: .seconds(60))
        }
        return "added \(missing.count) species over the bus (identify.references.add)"
    }
}

/// The demo's numbered steps, each timed.
struct DemoSteps {
    private(set) var total = 0
    private var number = 0

    mutating func run(_ title: String, _ step: () async throws -> String) async throws {
        number += 1
        let started = ContinuousClock.now
        do {
            let result = try await step()
            let elapsed = Int((ContinuousClock.now - started).wholeMilliseconds)
            total += elapsed
            let label = "\(number). \(title)"
            print(
                "\(label.padding(toLength: max(label.count, 48), withPad: " ", startingAt: 0)) \(String(repeating: " ", count: max(0, 6 - "\(elapsed)".count)))\(elapsed) ms  \(result)"
            )
        } catch {
            print("\(number). \(title): failed")
            throw error
        }
    }
}

/// The API as the demo calls it: JSON in and out, the demo person's token on each request.
final class DemoAPI: @unchecked Sendable {
    static let boundary = "canopy-demo-boundary"
    let base: String
    let client = HTTPClient.shared
    var token = ""

    init(base: String) throws {
        self.base = base
    }

    struct Answer {
        var status: Int
        var headers: [String: String]
        var body: [UInt8]
        var json: Any? { try? JSONSerialization.jsonObject(with: Data(body)) }

        func object(_ key: String) throws -> [String: Any] {
            guard let value = (json as? [String: Any])?[key] as? [String: Any] else {
                throw CommandFailure("the answer has no \(key): \(String(decoding: body.prefix(300), as: UTF8.self))")
            }
            return value
        }

        func array(_ key: String) throws -> [[String: Any]] {
            guard let value = (json as? [String: Any])?[key] as? [[String: Any]] else {
                throw CommandFailure("the answer has no \(key): \(String(decoding: body.prefix(300), as: UTF8.self))")
            }
            return value
        }

        func first(_ key: String) throws -> [String: Any] {
            guard let value = try array(key).first else { throw CommandFailure("the answer's \(key) is empty") }
            return value
        }

        func string(_ key: String) throws -> String {
            guard let value = (json as? [String: Any])?[key] as? String else {
                throw CommandFailure("the answer has no \(key): \(String(decoding: body.prefix(300), as: UTF8.self))")
            }
            return value
        }
    }

    /// Sends a request as an app does: a POST with an `Idempotency-Key` made once for it, and
    /// sent again with the same key when its answer is lost or the server says to (a 409 of
    /// the key still running, a 5xx), at most three times: never done twice.
    func send(_ method: HTTPMethod, _ path: String, json: String? = nil, body: [UInt8]? = nil, type: String? = nil) async throws -> Answer {
        var request = HTTPClientRequest(url: base + path)
        request.method = method
        request.headers.add(name: "Authorization", value: "Bearer \(token)")
        let retried = method == .POST
        if retried { request.headers.add(name: "Idempotency-Key", value: UUID().uuidString) }
        if let json {
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(string: json))
        } else if let body {
            request.headers.add(name: "Content-Type", value: type ?? "application/octet-stream")
            request.body = .bytes(ByteBuffer(bytes: body))
        }
        var answer: Answer
        var attempt = 1
        while true {
            let response: HTTPClientResponse
            do {
                response = try await client.execute(request, timeout: .seconds(60))
                let collected = try await response.body.collect(upTo: 32 << 20)
                var headers: [String: String] = [:]
                for header in response.headers { headers[header.name.lowercased()] = header.value }
                answer = Answer(status: Int(response.status.code), headers: headers, body: Array(collected.readableBytesView))
            } catch {
                guard retried, attempt < 3 else {
                    throw CommandFailure("no answer from \(base) (\(error)); start the stack with canopy up, or pass --http HOST:PORT")
                }
                attempt += 1
                try await Task.sleep(for: .seconds(1))
                continue
            }
            guard retried, attempt < 3, answer.status == 409 || answer.status >= 500, answer.headers["idempotent-replayed"] == nil else { break }
            attempt += 1
            try await Task.sleep(for: .seconds(min(5, Int(answer.headers["retry-after"] ?? "") ?? 1)))
        }
        guard (200..<300).contains(answer.status) else {
            throw CommandFailure("\(method) \(path) answered \(answer.status): \(String(decoding: answer.body.prefix(500), as: UTF8.self))")
        }
        return answer
    }

    /// Runs a sibling executable and returns its standard output; throws with its errors.
    static func run(_ executable: URL, _ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = executable
        process.arguments = arguments
        let output = Pipe(), errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        let out = output.fileHandleForReading.readDataToEndOfFile(), err = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw CommandFailure(
                "\(executable.lastPathComponent) \(arguments.prefix(2).joined(separator: " ")) failed: \(String(decoding: err, as: UTF8.self).prefix(500))")
        }
        return String(decoding: out, as: UTF8.self)
    }
}
