import ArgumentParser
import CanopyBus
import CanopyMessages
import CanopyServiceKit
import Foundation

/// `canopy send SERVICE OPERATION --json '{...}'`: one call, the reply printed as JSON.
struct Send: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Call one operation and print its reply; exits 1 on an error reply.",
        discussion: """
            Examples:
              canopy send broker services --json '{}'
              canopy send images images.put --principal me --json '{"plantID":"p1"}' --attach monstera.jpg
              canopy send images images.variant --principal me --json '{"sha256":"…","variant":"thumbnail"}' --save thumb.jpg
            The reply is printed to standard output as indented JSON; an error reply is printed
            to standard error as 'error (code): message'. Photo bytes travel as attachments,
            frames beside the JSON: --attach sends a file as one, --save writes the reply's.
            """)

    @Argument(help: "The service, for example 'broker'.") var service: String
    @Argument(help: "The operation, for example 'stats'.") var operation: String
    @Option(help: "The request body as JSON.") var json: String = "{}"
    @Option(help: "The user id to act for. Env: CANOPY_PRINCIPAL.") var principal: String = Environment.string("CANOPY_PRINCIPAL") ?? ""
    @Option(help: "How long to wait, in milliseconds. Env: CANOPY_TIMEOUT_MS.") var timeoutMs: Int = Environment.int("CANOPY_TIMEOUT_MS", default: 10_000)
    @Flag(help: "Let the bus send the call again if the broker restarts mid-call (only for idempotent operations).") var idempotent = false
    @Option(help: ArgumentHelp("A file sent as an attachment (repeat for more, in order).", valueName: "file")) var attach: [String] = []
    @Option(help: ArgumentHelp("Where to write the reply's attachments: FILE for one, FILE-1, FILE-2, … for several.", valueName: "file")) var save: String?
    @OptionGroup var common: CommonOptions
    @OptionGroup var stack: StackOptions // the local stack's keys, when it runs CurveZMQ

    func validate() throws {
        guard (try? JSONSerialization.jsonObject(with: Data(json.utf8), options: [.fragmentsAllowed])) != nil else {
            throw ValidationError("--json is not valid JSON: \(json.prefix(80)); quote it in single quotes, e.g. --json '{\"id\":\"p1\"}'")
        }
        guard timeoutMs > 0 else { throw ValidationError("--timeout-ms must be positive") }
        guard attach.count <= Wire.maximumAttachments else { throw ValidationError("--attach takes at most \(Wire.maximumAttachments) files") }
        for file in attach where !FileManager.default.isReadableFile(atPath: file) {
            throw ValidationError("cannot read --attach \(file); check the path")
        }
    }

    func run() async throws {
        try await withBus(common, stack: stack) { bus in
            do {
                let attachments = try attach.map { [UInt8](try Data(contentsOf: URL(fileURLWithPath: $0))) }
                let reply = try await bus.call(
                    service: service, operation: operation, body: Array(json.utf8), attachments: attachments,
                    principal: principal.isEmpty ? nil : principal, timeout: .milliseconds(timeoutMs), idempotent: idempotent)
                print(prettyJSON(reply.body))
                try saveAttachments(reply.attachments)
            } catch let error as CanopyError {
                FileHandle.standardError.write(Data("error (\(error.code.rawValue)): \(error.message)\n".utf8))
                throw ExitCode(1)
            }
        }
    }
}

extension Send {
    /// Writes the reply's attachments where --save says, or says on standard error that
    /// they came and how to keep them.
    func saveAttachments(_ attachments: [[UInt8]]) throws {
        guard !attachments.isEmpty else { return }
        guard let save else {
            let sizes = attachments.map { "\($0.count) bytes" }.joined(separator: ", ")
            FileHandle.standardError.write(Data("the reply has \(attachments.count) attachment(s) (\(sizes)); --save FILE writes them\n".utf8))
            return
        }
        for (index, attachment) in attachments.enumerated() {
            let path = attachments.count == 1 ? save : "\(save)-\(index + 1)"
            try Data(attachment).write(to: URL(fileURLWithPath: path))
            FileHandle.standardError.write(Data("wrote \(attachment.count) bytes to \(path)\n".utf8))
        }
    }
}

/// Indented JSON with sorted keys, or the bytes as text when they are not JSON.
func prettyJSON(_ bytes: [UInt8]) -> String {
    guard let object = try? JSONSerialization.jsonObject(with: Data(bytes), options: [.fragmentsAllowed]),
        let data = try? JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys, .fragmentsAllowed, .withoutEscapingSlashes])
    else { return String(decoding: bytes, as: UTF8.self) }
    return String(decoding: data, as: UTF8.self)
}

/// Runs `body` with a client of each broker the options name, one at a time (what every
/// broker says for itself: its services, its statistics).
func withEachBroker(_ common: CommonOptions, stack: StackOptions, _ body: (_ endpoint: String, BusClient) async throws -> Void) async throws {
    let brokers = try eachBroker(common, stack: stack)
    defer { brokers.forEach { $0.bus.close() } }
    for (endpoint, bus) in brokers {
        do {
            try await body(endpoint, bus)
        } catch let error as CanopyError where error.code == .timeout {
            FileHandle.standardError.write(
                Data("error (timeout): \(error.message). Is canopy-broker running at \(endpoint)? Start it, or leave it out of --endpoint.\n".utf8))
            throw ExitCode(1)
        }
    }
}

/// A client of each broker `common` names, alone (the caller closes them).
func eachBroker(_ common: CommonOptions, stack: StackOptions) throws -> [(endpoint: String, bus: BusClient)] {
    let logger = LogSetup.logger(label: "canopy", level: common.logLevel == .info ? .warning : common.logLevel)
    let all = try common.operatorConfiguration(stack: stack)
    return try all.endpoints.enumerated().map { index, endpoint in
        let context = ZMQContext() // each broker's I/O thread its own (a name that hangs holds up only its broker)
        var configuration = all
        configuration.endpoints = [endpoint]
        if var curve = configuration.curve {
            curve.serverKeys = [curve.serverKey(forBroker: index)]
            configuration.curve = curve
        }
        return (endpoint, try BusClient(configuration: configuration, context: context, logger: logger))
    }
}

/// Opens a bus client for one command and closes it afterwards.
func withBus(_ common: CommonOptions, stack: StackOptions, _ body: (BusClient) async throws -> Void) async throws {
    let logger = LogSetup.logger(label: "canopy", level: common.logLevel == .info ? .warning : common.logLevel)
    let bus = try BusClient(configuration: try common.operatorConfiguration(stack: stack), context: common.busContext(), logger: logger)
    defer { bus.close() }
    do {
        try await body(bus)
    } catch let error as CanopyError where error.code == .timeout {
        FileHandle.standardError.write(
            Data(
                "error (timeout): \(error.message). Is canopy-broker running at \(common.endpoint)? Start it or pass --endpoint; a stack canopy up runs elsewhere needs its --data-dir (its keys).\n"
                    .utf8))
        throw ExitCode(1)
    }
}
