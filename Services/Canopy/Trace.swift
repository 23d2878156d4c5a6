import ArgumentParser
import CanopyServiceKit
import Foundation

/// `canopy trace [ID]`: the spans `canopy up --traces FILE` recorded, as a table of traces or
/// one trace as an indented tree with durations.
struct Trace: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the traces a local stack recorded (canopy up --traces FILE), or print one as a tree with durations.",
        discussion: """
            Examples:
              canopy trace                      the latest traces of the stack in ./.canopy
              canopy trace 4bf92f35             one trace (an id, or its first characters)
              canopy trace --file ./traces.jsonl --limit 50
            """)

    @Argument(help: "A trace id (32 hexadecimal characters, or enough of its start to be the only one).") var id: String?
    @Option(help: ArgumentHelp("The span file (default: the one the stack in --data-dir writes).", valueName: "file")) var file: String?
    @Option(help: "Traces listed, latest first.") var limit = 20
    @OptionGroup var stack: StackOptions

    func validate() throws {
        guard (1...10_000).contains(limit) else { throw ValidationError("--limit is 1 to 10000") }
        if let id, id.isEmpty || id.count > 32 || !id.allSatisfy(\.isHexDigit) {
            throw ValidationError("a trace id is up to 32 hexadecimal characters; got '\(id.prefix(40))'")
        }
    }

    func run() throws {
        guard let path = file ?? stack.layout.state()?.traces else {
            throw CommandFailure(
                "the stack in \(stack.layout.dataDirectory.path) records no traces; start it with canopy up --traces FILE, or name a file with --file")
        }
        let spans = try SpanFile.read(path: path)
        guard let id else {
            guard !spans.isEmpty else { return print("no spans in \(path) yet; make a request (canopy demo) and look again") }
            return print(TraceReport.list(spans, limit: limit))
        }
        let matching = Set(spans.lazy.map(\.traceID).filter { $0.hasPrefix(id.lowercased()) })
        guard matching.count <= 1 else {
            throw CommandFailure("\(matching.count) traces start with \(id); give more of the id (canopy trace lists them)")
        }
        guard let tree = TraceReport.tree(spans, traceID: id) else {
            throw CommandFailure("no trace \(id) in \(path) (\(Set(spans.map(\.traceID)).count) traces); canopy trace lists them")
        }
        print(tree)
    }
}
