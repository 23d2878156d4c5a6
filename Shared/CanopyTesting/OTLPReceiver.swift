import Foundation
import Hummingbird
import Synchronization

/// A local stand-in for an OpenTelemetry collector's OTLP/HTTP receiver (the OTLP
/// specification's `POST /v1/traces`): it keeps every export request and answers as a
/// collector does, an empty `ExportTraceServiceResponse` in the request's encoding
/// (`{}` for `application/json`, no bytes for `application/x-protobuf`).
public final class OTLPReceiver: Sendable {
    /// One span as exported: ids in lower-case hexadecimal.
    public struct Span: Sendable, Equatable {
        public var traceID: String
        public var spanID: String
        public var parentSpanID: String
        public var name: String
        public var service: String
    }

    private final class State: Sendable {
        let bodies = Mutex<[[UInt8]]>([])
        let port = Mutex<Int?>(nil)
    }

    private let state = State()
    public let application: Application<RouterResponder<BasicRequestContext>>

    public init() {
        let router = Router()
        let state = self.state
        router.post("/v1/traces") { request, _ -> Response in
            let body = try await request.body.collect(upTo: 4 << 20)
            state.bodies.withLock { $0.append(Array(body.readableBytesView)) }
            let json = request.headers[.contentType]?.hasPrefix("application/json") == true
            return Response(status: .ok, headers: [.contentType: json ? "application/json" : "application/x-protobuf"],
                            body: .init(byteBuffer: ByteBuffer(string: json ? "{}" : "")))
        }
        application = Application(router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0), serverName: "otlp"),
                                  onServerRunning: { channel in state.port.withLock { $0 = channel.localAddress?.port } })
    }

    /// `http://127.0.0.1:PORT`, for `OTEL_EXPORTER_OTLP_ENDPOINT`, once it listens.
    public func endpoint(within limit: Duration = .seconds(30)) async throws -> String {
        guard try await eventually(within: limit, { state.port.withLock { $0 } != nil }), let port = state.port.withLock({ $0 }) else { throw CancellationError() }
        return "http://127.0.0.1:\(port)"
    }

    /// How many export requests arrived.
    public var requests: Int { state.bodies.withLock { $0.count } }

    /// Every span of the OTLP/JSON export requests. Ids are read as the OTLP specification
    /// writes them (hexadecimal) or as protobuf's JSON mapping does (base64), which swift-otel
    /// 1.6 sends.
    public var spans: [Span] {
        state.bodies.withLock { $0 }.flatMap { body -> [Span] in
            guard let root = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else { return [] }
            var spans: [Span] = []
            for resource in root["resourceSpans"] as? [[String: Any]] ?? [] {
                let attributes = (resource["resource"] as? [String: Any])?["attributes"] as? [[String: Any]] ?? []
                let service = attributes.first { $0["key"] as? String == "service.name" }
                    .flatMap { ($0["value"] as? [String: Any])?["stringValue"] as? String } ?? ""
                for scope in resource["scopeSpans"] as? [[String: Any]] ?? [] {
                    for span in scope["spans"] as? [[String: Any]] ?? [] {
                        spans.append(Span(traceID: Self.hex(span["traceId"], bytes: 16), spanID: Self.hex(span["spanId"], bytes: 8),
                                          parentSpanID: Self.hex(span["parentSpanId"], bytes: 8), name: span["name"] as? String ?? "", service: service))
                    }
                }
            }
            return spans
        }
    }

    static func hex(_ value: Any?, bytes: Int) -> String {
        guard let text = value as? String, !text.isEmpty else { return "" }
        if text.count == bytes * 2, text.allSatisfy(\.isHexDigit) { return text.lowercased() }
        guard let data = Data(base64Encoded: text), data.count == bytes else { return "" }
        return data.map { String(format: "%02x", $0) }.joined()
    }
}
