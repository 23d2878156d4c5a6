import Foundation
import Synchronization

/// Spans written one JSON object per line (``TraceSpan``), appended as they arrive: what
/// `canopy up --traces FILE` keeps and `canopy trace` reads. It stops writing at
/// ``maximumBytes`` (a stack left tracing for days does not fill the disk), or when a write
/// fails, and says so once.
public final class SpanFile: Sendable {
    public let path: String
    /// Largest file written.
    public static let maximumBytes = 1 << 30
    private let handle: Mutex<(file: FileHandle?, bytes: Int)>
    private let onFull: @Sendable () -> Void

    /// Opens (creating, or appending to) `path`.
    public init(path: String, onFull: @escaping @Sendable () -> Void = {}) throws {
        self.path = path
        if !FileManager.default.fileExists(atPath: path) {
            guard FileManager.default.createFile(atPath: path, contents: nil) else {
                throw SpanFileError(description: "cannot create \(path); does its directory exist and may you write there?")
            }
        }
        let file = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        let bytes = Int(try file.seekToEnd())
        handle = Mutex((file, bytes))
        self.onFull = onFull
    }

    /// Appends `spans`, one line each.
    public func append(_ spans: [TraceSpan]) {
        guard !spans.isEmpty else { return }
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        var data = Data()
        for span in spans {
            guard let line = try? encoder.encode(span) else { continue }
            data.append(line)
            data.append(0x0A)
        }
        let full = handle.withLock { state -> Bool in
            guard let file = state.file else { return false }
            guard state.bytes + data.count <= Self.maximumBytes else {
                try? file.close()
                state.file = nil
                return true
            }
            guard (try? file.write(contentsOf: data)) != nil else { // a full disk: stop, and say so
                try? file.close()
                state.file = nil
                return true
            }
            state.bytes += data.count
            return false
        }
        if full { onFull() }
    }

    /// Every span in the file at `path`; lines that are not spans are skipped.
    public static func read(path: String) throws -> [TraceSpan] {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw SpanFileError(description: "cannot read \(path); start a stack with 'canopy up --traces \(path)' and make a request first")
        }
        let decoder = JSONDecoder()
        return data.split(separator: 0x0A).compactMap { try? decoder.decode(TraceSpan.self, from: Data($0)) }
    }
}

/// Why a span file cannot be used, as a sentence.
public struct SpanFileError: Error, CustomStringConvertible {
    public let description: String
}

/// Traces as a person reads them: one trace as an indented tree, or a table of traces.
public enum TraceReport {
    /// The spans of `traceID` (or of the trace whose id starts with it) as a tree: each span
    /// under its parent, children in the order they started, with its service, duration,
    /// start offset from the trace's first span, status and links; `nil` when no span has
    /// that id.
    public static func tree(_ spans: [TraceSpan], traceID: String) -> String? {
        let prefix = traceID.lowercased()
        guard let id = spans.first(where: { $0.traceID.hasPrefix(prefix) })?.traceID else { return nil }
        let trace = spans.filter { $0.traceID == id }
        let ids = Set(trace.map(\.spanID))
        var children: [String: [TraceSpan]] = [:]
        for span in trace { children[ids.contains(span.parentSpanID) ? span.parentSpanID : "", default: []].append(span) }
        for key in children.keys { children[key]!.sort { ($0.start, $0.name) < ($1.start, $1.name) } }
        let origin = trace.map(\.start).min() ?? 0
        let total = (trace.map(\.end).max() ?? origin) - origin
        var lines = ["trace \(id): \(trace.count) spans, \(milliseconds(total))"]
        func walk(_ span: TraceSpan, depth: Int) {
            var line = String(repeating: "  ", count: depth) + span.name
            line += "  [\(span.service)]  \(milliseconds(span.duration))  at +\(milliseconds(span.start - min(span.start, origin)))"
            if span.status == "error" { line += "  ERROR" + (span.statusMessage.isEmpty ? "" : ": \(span.statusMessage.prefix(120))") }
            if span.attributes["canopy.coalesced"] == "true" { line += "  coalesced" }
            for link in span.links { line += "  -> linked to \(link.spanID)\(link.traceID == id ? "" : " in trace \(link.traceID)")" }
            if !span.parentSpanID.isEmpty, !ids.contains(span.parentSpanID) { line += "  (parent \(span.parentSpanID) not recorded)" }
            lines.append(line)
            for event in span.events { lines.append(String(repeating: "  ", count: depth + 1) + "* " + event) }
            for child in children[span.spanID] ?? [] { walk(child, depth: depth + 1) }
        }
        for root in children[""] ?? [] { walk(root, depth: 0) }
        return lines.joined(separator: "\n")
    }

    /// The traces among `spans`, latest first, at most `limit`: id, root span, services,
    /// span count, duration, errors.
    public static func list(_ spans: [TraceSpan], limit: Int = 20) -> String {
        var table = Table("trace", "started (UTC)", "root", "spans", "services", "ms", "errors")
        let traces = Dictionary(grouping: spans, by: \.traceID).values.sorted { ($0.map(\.start).min() ?? 0) > ($1.map(\.start).min() ?? 0) }
        let formatter = ISO8601DateFormatter()
        for trace in traces.prefix(limit) {
            let ids = Set(trace.map(\.spanID))
            let root = trace.filter { !ids.contains($0.parentSpanID) }.min { $0.start < $1.start }
            let start = trace.map(\.start).min() ?? 0
            let end = trace.map(\.end).max() ?? start
            table.append([
                trace[0].traceID, formatter.string(from: Date(timeIntervalSince1970: Double(start) / 1e9)), root?.name ?? "",
                "\(trace.count)", Set(trace.map(\.service)).sorted().joined(separator: ","),
                String(format: "%.1f", Double(end - start) / 1e6), "\(trace.count { $0.status == "error" })",
            ])
        }
        return table.render()
    }

    static func milliseconds(_ nanoseconds: UInt64) -> String {
        String(format: "%.2f ms", Double(nanoseconds) / 1e6)
    }
}
