import ArgumentParser
import CanopyBus
import CanopyCapture
import CanopyMessages
import CanopyServiceKit
import Foundation

/// `canopy capture …`: record what crosses the broker, and read what was recorded.
struct Capture: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Record what crosses the broker, and look into captures.",
        discussion: """
            A capture holds every request and answer that crossed the broker (docs/PROTOCOL.md,
            "Capture files"). Start one with the broker (canopy-broker serve --capture FILE) or
            on a running broker that allows it (--capture-dir DIR); given several brokers
            (--endpoint A,B), start, stop and status act on each. Examples:
              canopy capture start monday --pseudonymize
              canopy capture status
              canopy capture stop
              canopy capture inspect ./captures/monday
              canopy capture filter ./captures/monday --output care-only --service care
            """,
        subcommands: [Start.self, Stop.self, Status.self, Inspect.self, Filter.self])

    struct Start: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Begin a capture on the running broker, into its --capture-dir, with a snapshot of the stack's stores.",
            discussion: """
                With --snapshot (the default when a stack canopy up started runs from --data-dir),
                the broker holds new requests until those in the air are answered (the cut),
                every store is pinned as it stands then, the requests go on, and the stores are
                copied into NAME.snapshot beside the capture; a mark record in the capture says
                where the cut was. canopy replay NAME --fresh replays on a stack started from it.
                Examples:
                  canopy capture start monday
                  canopy capture start monday --pseudonymize --without-attachments
                  canopy capture start monday --no-snapshot --endpoint tcp://broker:5555
                """)

        @Argument(help: "The capture file's name in the broker's capture directory (A-Z, a-z, 0-9, '.', '-', '_').") var name: String
        @Flag(help: "Replace principals by keyed hashes (stable within the capture; the snapshot's stores get the same ones).") var pseudonymize = false
        @Flag(help: "Leave attachment bytes (photos) out; their sizes are kept.") var withoutAttachments = false
        @Flag(
            inversion: .prefixedNo,
            help: "Keep the stack's stores as they stand at the capture's start beside it (default: when canopy up's stack runs from --data-dir).")
        var snapshot: Bool?
        @Option(help: "How long the broker may hold requests while the snapshot is pinned, in milliseconds (1 to 60000).") var holdMs = 10_000
        @OptionGroup var common: CommonOptions
        @OptionGroup var stack: StackOptions

        func validate() throws {
            guard (1...60_000).contains(holdMs) else { throw ValidationError("--hold-ms is 1 to 60000") }
        }

        func run() async throws {
            let local = stack.layout.state().map { $0.supervisorAlive } ?? false
            guard snapshot ?? local else {
                // With several brokers, each captures what crosses it (into its own directory).
                try await withEachBroker(common, stack: stack) { endpoint, bus in
                    let status = try await callBroker {
                        try await bus.call(
                            Broker.CaptureStart.self, .init(name: name, pseudonymize: pseudonymize, withoutAttachments: withoutAttachments),
                            timeout: .seconds(10))
                    }
                    print("\(endpoint): capturing into \(status.path ?? name); stop with: canopy capture stop")
                }
                return
            }
            try await startWithSnapshot()
        }

        /// Holds every broker, pins the stores, lets the requests go, copies the stores.
        private func startWithSnapshot() async throws {
            let brokers = try eachBroker(common, stack: stack)
            defer { brokers.forEach { $0.bus.close() } }
            // The stores opened and the originals linked before anything is held; the hold
            // waits only for the pin.
            // (canopy up's first broker captures into the data directory.)
            let directory = StackSnapshot.directory(forCapture: stack.layout.dataDirectory.appendingPathComponent(name).path)
            var pinned = try StackSnapshot.prepare(data: stack.layout.dataDirectory, into: directory)
            let pseudonyms = pseudonymize ? PseudonymBox() : nil
            var held: [(endpoint: String, bus: BusClient, status: CaptureStatus)] = []
            let started = ContinuousClock.now
            /// Lets every held broker's requests go (naming the snapshot when there is one);
            /// the brokers whose hold had already ended by itself (so requests went on before
            /// the snapshot was pinned).
            @discardableResult
            func release(_ snapshot: String?) async -> [String] {
                var ended: [String] = []
                for broker in held where (try? await broker.bus.call(Broker.CaptureRelease.self, .init(snapshot: snapshot), timeout: .seconds(10))) == nil {
                    ended.append(broker.endpoint)
                }
                return ended
            }
            /// A snapshot that failed: the requests go on, the captures begun for it stop, and
            /// what was prepared goes.
            func abandon(_ error: Error) async throws -> Never {
                await release(nil)
                for broker in held { _ = try? await broker.bus.call(Broker.CaptureStop.self, .init(), timeout: .seconds(60)) }
                pinned.close()
                try? FileManager.default.removeItem(at: directory)
                throw error
            }
            do {
                for (endpoint, bus) in brokers {
                    let request = Broker.CaptureStart.Request(
                        name: name, pseudonymize: pseudonymize, withoutAttachments: withoutAttachments,
                        holdMilliseconds: holdMs, pseudonymKey: pseudonyms.map { Data($0.key).base64EncodedString() })
                    let status = try await callBroker { try await bus.call(Broker.CaptureStart.self, request, timeout: .milliseconds(Int64(holdMs) + 5_000)) }
                    held.append((endpoint, bus, status))
                }
            } catch {
                try await abandon(error)
            }
            guard let first = held.first, let path = first.status.path,
                StackSnapshot.directory(forCapture: path).standardizedFileURL == directory.standardizedFileURL
            else {
                try await abandon(
                    CommandFailure(
                        "the broker captures into \(held.first?.status.path ?? "(nowhere)"), not beside \(directory.path); give --data-dir the stack's own data directory, or capture without a snapshot (--no-snapshot)"
                    ))
            }
            let pinning = ContinuousClock.now
            do {
                try pinned.pin()
            } catch {
                try await abandon(error)
            }
            let pinnedIn = ContinuousClock.now - pinning
            let ended = await release(directory.lastPathComponent)
            let heldFor = ContinuousClock.now - started
            guard ended.isEmpty else {
                try await abandon(
                    CommandFailure(
                        "the hold at \(ended.joined(separator: ", ")) ended by itself before the snapshot was pinned (after \(Int(heldFor.seconds * 1_000)) ms), so the snapshot would not match the capture; nothing was kept. Try again, or with a longer --hold-ms"
                    ))
            }
            let manifest = StackSnapshot.Manifest(
                captures: held.compactMap(\.status.path), cutAt: first.status.cutAt ?? 0,
                stores: pinned.stores.map(\.relative), originals: pinned.originals,
                pseudonymized: pseudonymize, heldMilliseconds: (heldFor.seconds * 1_000 * 10).rounded() / 10)
            let table: String
            do {
                table = try StackSnapshot.finish(pinned, manifest: manifest, pseudonyms: pseudonyms)
            } catch {
                try await abandon(error) // a snapshot half copied is no snapshot: the captures stop too
            }
            for broker in held { print("\(broker.endpoint): capturing into \(broker.status.path ?? name)") }
            print(
                "snapshot at the cut (requests held \(String(format: "%.1f", manifest.heldMilliseconds)) ms, \(String(format: "%.1f", pinnedIn.seconds * 1_000)) ms of it pinning the stores, \(pinned.originals) originals linked): \(directory.path)"
            )
            print(table)
            print("stop with: canopy capture stop; replay with: canopy replay \(path) --fresh")
        }
    }

    struct Stop: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "End the running capture; prints its counts.", discussion: "Example: canopy capture stop")

        @OptionGroup var common: CommonOptions
        @OptionGroup var stack: StackOptions // the local stack's keys, when it runs CurveZMQ

        func run() async throws {
            var paths: [String] = []
            try await withEachBroker(common, stack: stack) { endpoint, bus in
                let status = try await callBroker { try await bus.call(Broker.CaptureStop.self, .init(), timeout: .seconds(60)) }
                if common.brokerEndpoints.count > 1 { print("\(endpoint):") }
                print(Capture.render(status))
                paths.append(status.path ?? "FILE")
            }
            print("look into it with: canopy capture inspect \(paths.joined(separator: " "))")
        }
    }

    struct Status: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Whether the broker captures, and its counts.", discussion: "Example: canopy capture status")

        @OptionGroup var common: CommonOptions
        @OptionGroup var stack: StackOptions // the local stack's keys, when it runs CurveZMQ

        func run() async throws {
            let several = common.brokerEndpoints.count > 1
            try await withEachBroker(common, stack: stack) { endpoint, bus in
                if several { print("\(endpoint):") }
                print(Capture.render(try await callBroker { try await bus.call(Broker.CaptureStatusOperation.self, .init(), timeout: .seconds(10)) }))
            }
        }
    }

    struct Inspect: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Count a capture's requests and answers per service and operation.",
            discussion: """
                Reads the file and its rotated segments (FILE.1, FILE.2…) in one pass; memory
                stays flat however large they are. A file cut short is read up to its last whole
                record, and the summary says where it stopped (exit status 2).
                Several brokers' captures of one time (canopy capture start on each) are read as
                one, merged by time: canopy capture inspect broker-a/monday broker-b/monday.
                Example: canopy capture inspect ./captures/monday --json
                """)

        @Argument(help: "The capture's (first) file; several brokers' captures of one time are read as one, merged by time.") var files: [String]
        @Flag(help: "Print the summary as JSON, for scripts.") var json = false

        func run() throws {
            let reader = try openCapture(files)
            var progress = ProgressLine()
            let total = reader.allFiles.reduce(0) { $0 + ((try? FileManager.default.attributesOfItem(atPath: $1)[.size] as? Int) ?? 0) }
            let summary = try CaptureSummary.make(reader) { read in
                progress.update("reading \(ProgressLine.bar(read, of: total)) \(read >> 20) of \(total >> 20) MiB")
            }
            progress.finish()
            if json {
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
                print(String(decoding: try encoder.encode(summary), as: UTF8.self))
            } else {
                print(Capture.render(summary))
            }
            if !summary.complete { throw ExitCode(2) }
        }
    }

    struct Filter: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write a smaller capture: only some services, operations, times or people.",
            discussion: """
                A request and its answer stay together: an answer is kept when its request was.
                Times are ISO 8601 (2026-11-24T21:00:00Z) or +SECONDS from the capture's first record.
                Example: canopy capture filter monday --output monday-care --service care --principal user-42
                """)

        @Argument(help: "The capture's (first) file.") var file: String
        @Option(help: "Where to write the smaller capture.") var output: String
        @Option(help: "Keep only this service (repeat for more).") var service: [String] = []
        @Option(help: "Keep only this operation (repeat for more).") var operation: [String] = []
        @Option(help: "Keep only this principal (as the capture holds it: its pseudonym when pseudonymized; repeat for more).") var principal: [String] = []
        @Option(help: "Keep requests from this time on.") var from: String?
        @Option(help: "Keep requests before this time.") var to: String?

        func validate() throws {
            for time in [from, to].compactMap({ $0 }) where CaptureTime(time) == nil {
                throw ValidationError("'\(time)' is not a time; give ISO 8601 (2026-11-24T21:00:00Z) or +SECONDS from the capture's start")
            }
            guard URL(fileURLWithPath: output).standardizedFileURL != URL(fileURLWithPath: file).standardizedFileURL else {
                throw ValidationError("--output must be another file than the capture read")
            }
        }

        func run() throws {
            let reader = try openCapture([file])
            var writer = try CaptureFileWriter(path: output, pseudonymized: reader.header.pseudonymized, withoutAttachments: reader.header.withoutAttachments)
            var selection = CaptureSelection(
                services: Set(service), operations: Set(operation), principals: Set(principal),
                from: from.flatMap(CaptureTime.init), to: to.flatMap(CaptureTime.init))
            var progress = ProgressLine()
            var read = 0
            while let record = try reader.next() {
                read += 1
                if selection.keeps(record) { try writer.append(record) }
                progress.update("filtering: \(read) records read, \(writer.records) kept")
            }
            progress.finish()
            try writer.close()
            print("wrote \(writer.records) of \(read) records to \(output)")
            if reader.ending != .complete {
                FileHandle.standardError.write(Data("the capture is \(reader.ending!.description)\n".utf8))
                throw ExitCode(2)
            }
        }
    }

    static func render(_ status: CaptureStatus) -> String {
        var table = Table("CAPTURING", "FILE", "RECORDS", "BYTES", "DROPPED", "FAILED", "FILES")
        table.append([
            status.capturing ? "yes" : "no", status.path ?? "-", "\(status.records)", "\(status.bytes)", "\(status.dropped)",
            "\(status.failed)", "\(status.segments)",
        ])
        return table.render() + (status.error.map { "\nstopped by an error: \($0)" } ?? "")
            + (status.dropped > 0 ? "\n\(status.dropped) record(s) were dropped: the disk did not keep up (raise --capture-queue-bytes or capture less)" : "")
    }

    static func render(_ summary: CaptureSummary) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        func time(_ nanoseconds: Int64) -> String { formatter.string(from: Date(timeIntervalSince1970: Double(nanoseconds) / 1e9)) }
        var lines: [String] = []
        lines.append(
            "capture \(summary.files.joined(separator: ", "))\(summary.pseudonymized ? " (pseudonymized)" : "")\(summary.withoutAttachments ? " (without attachments)" : "")"
        )
        if summary.records > 0 {
            lines.append("from \(time(summary.firstTime)) to \(time(summary.lastTime)) (\(String(format: "%.3f", summary.spanSeconds)) s)")
        }
        let clients = summary.clients >= CaptureSummary.clientLimit ? "at least \(summary.clients)" : "\(summary.clients)"
        lines.append(
            "\(summary.records) records: \(summary.requests) requests, \(summary.replies) answers (\(summary.errors) errors), \(summary.bytes) bytes, \(clients) client(s)"
        )
        lines.append("read: \(summary.ending)")
        for mark in summary.marks {
            lines.append(
                "mark at \(time(mark.time)): \(mark.snapshot.map { "the snapshot \($0) holds the stores at the cut before it" } ?? "no snapshot was taken"); \(mark.held) request(s) held during it"
            )
        }
        var table = Table("SERVICE", "OPERATION", "REQUESTS", "ANSWERS", "ERRORS", "SHARED", "REQUEST BYTES", "ANSWER BYTES", "P50 µs", "P99 µs")
        for row in summary.operations {
            table.append([
                row.service, row.operation, "\(row.requests)", "\(row.replies)", "\(row.errors)", "\(row.shared)", "\(row.requestBytes)",
                "\(row.replyBytes)", "\(row.latencyP50Micros)", "\(row.latencyP99Micros)",
            ])
        }
        if !summary.operations.isEmpty {
            lines.append("")
            lines.append(table.render())
        }
        if !summary.errorCodes.isEmpty {
            var errors = Table("ERROR", "COUNT")
            for (code, count) in summary.errorCodes.sorted(by: { $0.key < $1.key }) { errors.append([code, "\(count)"]) }
            lines.append("")
            lines.append(errors.render())
        }
        return lines.joined(separator: "\n")
    }
}

/// A capture opened, or a sentence saying why not.
func openCapture(_ paths: [String]) throws -> CaptureReader {
    do {
        return try CaptureReader(paths: paths)
    } catch let error as CaptureFormatError {
        // Not a usage mistake but a file that is not a capture: a sentence and exit status 2,
        // as for a capture that ends damaged.
        FileHandle.standardError.write(Data("Error: \(error.description)\n".utf8))
        throw ExitCode(2)
    }
}

/// Calls the broker, turning its refusals into sentences (exit status 1).
func callBroker<Reply>(_ call: () async throws -> Reply) async throws -> Reply {
    do {
        return try await call()
    } catch let error as CanopyError where error.code != .timeout {
        FileHandle.standardError.write(Data("error (\(error.code.rawValue)): \(error.message)\n".utf8))
        throw ExitCode(1)
    }
}
