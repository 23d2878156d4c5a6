import Foundation
import Hummingbird
import Logging
import Synchronization

/// An OTLP/HTTP trace receiver, as an OpenTelemetry collector's (the OTLP specification's
/// `POST /v1/traces`): it reads each export request's spans (the OTLP/JSON encoding; Canopy's
/// executables send it when `OTEL_EXPORTER_OTLP_PROTOCOL=http/json`) and answers as a
/// collector does, an empty `ExportTraceServiceResponse` in the request's encoding (`{}` for
/// `application/json`, no bytes for `application/x-protobuf`, whose spans it does not read).
///
/// `canopy up --traces FILE` runs one and hands every span to a ``SpanFile``; the tests run
/// one and read ``spans``.
public final class OTLPReceiver: Sendable {
    private final class State: Sendable {
        let spans = Mutex<(all: [TraceSpan], bytes: Int, dropped: Int)>(([], 0, 0))
        let port = BoundPort(listener: "the OTLP receiver")
    }

    /// Largest export request read, and spans kept in memory without a sink.
    public static let maximumRequestBytes = 4 << 20
    public static let maximumKeptBytes = 64 << 20

    private let state = State()
    public let application: Application<RouterResponder<BasicRequestContext>>

    /// - Parameters:
    ///   - address: where to listen (`127.0.0.1`, a free port, by default).
    ///   - discarding: answer without reading the spans (a benchmark's collector, whose cost
    ///     must not count against what it measures).
    ///   - sink: where the spans of each request go; without one they are kept in memory
    ///     (up to ``maximumKeptBytes``, the oldest dropped past it) for ``spans``.
    public init(
        address: BindAddress = .hostname("127.0.0.1", port: 0), logger: Logger = Logger(label: "otlp"), discarding: Bool = false,
        sink: (@Sendable ([TraceSpan]) -> Void)? = nil
    ) {
        let router = Router()
        let state = self.state
        router.post("/v1/traces") { request, _ -> Response in
            let json = request.headers[.contentType]?.hasPrefix("application/json") == true
            let body = try await request.body.collect(upTo: Self.maximumRequestBytes)
            if json, !discarding {
                let spans = TraceSpan.parse(otlpJSON: Data(body.readableBytesView))
                if let sink {
                    sink(spans)
                } else {
                    state.spans.withLock { kept in
                        kept.all += spans
                        kept.bytes += body.readableBytes
                        while kept.bytes > Self.maximumKeptBytes, !kept.all.isEmpty {
                            let drop = max(1, kept.all.count / 4)
                            kept.all.removeFirst(drop)
                            kept.dropped += drop
                            kept.bytes = kept.bytes * 3 / 4
                        }
                    }
                }
            }
            return Response(
                status: .ok, headers: [.contentType: json ? "application/json" : "application/x-protobuf"],
                body: .init(byteBuffer: ByteBuffer(string: json ? "{}" : "")))
        }
        application = Application(
            router: router, configuration: .init(address: address, serverName: "otlp"),
            onServerRunning: { channel in state.port.set(channel.localAddress?.port) }, logger: logger)
    }

    /// The port it listens on, once it does.
    public var port: Int? { state.port.current }

    /// `http://127.0.0.1:PORT`, for `OTEL_EXPORTER_OTLP_ENDPOINT`, once it listens.
    public func endpoint(within limit: Duration = .seconds(90)) async throws -> String {
        "http://127.0.0.1:\(try await state.port.wait(within: limit))"
    }

    /// The spans received (without a sink), in the order they came.
    public var spans: [TraceSpan] { state.spans.withLock { $0.all } }
}

/// One finished span as an OTLP exporter sent it: ids in lower-case hexadecimal, times in
/// nanoseconds since 1970. What `canopy up --traces` writes (a JSON object per line) and
/// `canopy trace` reads.
public struct TraceSpan: Sendable, Equatable, Codable {
    public var traceID: String
    public var spanID: String
    /// Empty for a trace's root.
    public var parentSpanID: String
    public var name: String
    /// The process's `service.name`.
    public var service: String
    /// `server`, `client`, `internal`, `producer` or `consumer`.
    public var kind: String
    public var start: UInt64
    public var end: UInt64
    /// `error` when the span failed, else `ok` or `unset`.
    public var status: String
    public var statusMessage: String
    /// Attributes as text.
    public var attributes: [String: String]
    /// The spans this one is linked to (a coalesced request's flight).
    public var links: [Link]
    /// Its events' names.
    public var events: [String]

    /// A span this one is linked to, by trace and span id.
    public struct Link: Sendable, Equatable, Codable {
        public var traceID: String
        public var spanID: String

        public init(traceID: String, spanID: String) {
            self.traceID = traceID
            self.spanID = spanID
        }
    }

    /// How long it took, in nanoseconds.
    public var duration: UInt64 { end >= start ? end - start : 0 }

    /// The spans of an OTLP/JSON `ExportTraceServiceRequest`; nothing when it is not one.
    /// Ids are read as the OTLP specification writes them (hexadecimal) or as protobuf's JSON
    /// mapping does (base64, what swift-otel sends); enums as numbers or names.
    public static func parse(otlpJSON data: Data) -> [TraceSpan] {
        guard let root = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else { return [] }
        var spans: [TraceSpan] = []
        for resource in root["resourceSpans"] as? [[String: Any]] ?? [] {
            let service = attributes((resource["resource"] as? [String: Any])?["attributes"])["service.name"] ?? ""
            for scope in resource["scopeSpans"] as? [[String: Any]] ?? [] {
                for span in scope["spans"] as? [[String: Any]] ?? [] {
                    let status = span["status"] as? [String: Any] ?? [:]
                    spans.append(
                        TraceSpan(
                            traceID: hex(span["traceId"], bytes: 16), spanID: hex(span["spanId"], bytes: 8),
                            parentSpanID: hex(span["parentSpanId"], bytes: 8), name: span["name"] as? String ?? "", service: service,
                            kind: kind(span["kind"]), start: nanoseconds(span["startTimeUnixNano"]), end: nanoseconds(span["endTimeUnixNano"]),
                            status: statusCode(status["code"]), statusMessage: status["message"] as? String ?? "",
                            attributes: attributes(span["attributes"]),
                            links: (span["links"] as? [[String: Any]] ?? []).map {
                                Link(traceID: hex($0["traceId"], bytes: 16), spanID: hex($0["spanId"], bytes: 8))
                            },
                            events: (span["events"] as? [[String: Any]] ?? []).compactMap { $0["name"] as? String }))
                }
            }
        }
        return spans
    }

    static func hex(_ value: Any?, bytes: Int) -> String {
        guard let text = value as? String, !text.isEmpty else { return "" }
        if text.count == bytes * 2, text.allSatisfy(\.isHexDigit) { return text.lowercased() }
        guard let data = Data(base64Encoded: text), data.count == bytes else { return "" }
        return data.map { String(format: "%02x", $0) }.joined()
    }

    static func nanoseconds(_ value: Any?) -> UInt64 {
        if let text = value as? String { return UInt64(text) ?? 0 }
        return (value as? NSNumber)?.uint64Value ?? 0
    }

    static func kind(_ value: Any?) -> String {
        let names = ["unspecified", "internal", "server", "client", "producer", "consumer"]
        if let number = (value as? NSNumber)?.intValue, names.indices.contains(number) { return names[number] }
        let text = (value as? String ?? "").lowercased()
        return names.first { text == "span_kind_\($0)" } ?? "unspecified"
    }

    static func statusCode(_ value: Any?) -> String {
        let names = ["unset", "ok", "error"]
        if let number = (value as? NSNumber)?.intValue, names.indices.contains(number) { return names[number] }
        let text = (value as? String ?? "").lowercased()
        return names.first { text == "status_code_\($0)" } ?? "unset"
    }

    static func attributes(_ value: Any?) -> [String: String] {
        var attributes: [String: String] = [:]
        for attribute in value as? [[String: Any]] ?? [] {
            guard let key = attribute["key"] as? String, let value = attribute["value"] as? [String: Any] else { continue }
            if let text = value["stringValue"] as? String {
                attributes[key] = text
            } else if let flag = value["boolValue"] as? Bool {
                attributes[key] = flag ? "true" : "false"
            } else if let number = value["intValue"] ?? value["doubleValue"] {
                attributes[key] = "\(number)"
            }
        }
        return attributes
    }
}
