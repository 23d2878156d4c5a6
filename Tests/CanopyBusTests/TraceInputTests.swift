import AsyncHTTPClient
import CanopyServiceKit
import CanopyTesting
import Foundation
import NIOCore
import Testing

/// Bad input to what traces: options refused with a sentence naming them, a receiver that takes
/// anything and keeps only spans, and `canopy trace` saying what to do.
struct TraceInputTests {
    @Test func badTraceOptionsStopTheExecutableWithASentence() async throws {
        for (arguments, expected) in [
            (["--traces-sampler", "sometimes"], "--traces-sampler"), (["--traces-sampler-arg", "2"], "--traces-sampler-arg"),
            (["--otlp-protocol", "grpc"], "--otlp-protocol"), (["--otlp-endpoint", "collector:4318"], "--otlp-endpoint"),
        ] {
            let result = try await runExecutable(
                "canopy-broker", ["serve", "--bind", "tcp://127.0.0.1:\(FreePorts.any())", "--metrics-bind", "off"] + arguments)
            #expect(result.status != 0 && result.errors.contains(expected), "\(arguments): \(result.errors)")
        }
    }

    @Test func theReceiverAnswersGarbageAsACollectorDoesAndKeepsOnlySpans() async throws {
        try await withCollector { collector, endpoint in
            for (body, type) in [
                ("{not json", "application/json"), (#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":"x"}]}]}]}"#, "application/json"),
                ("\u{0}\u{1}protobuf", "application/x-protobuf"),
            ] {
                var request = HTTPClientRequest(url: endpoint + "/v1/traces")
                request.method = .POST
                request.headers.add(name: "Content-Type", value: type)
                request.body = .bytes(ByteBuffer(string: body))
                let response = try await HTTPClient.shared.execute(request, timeout: .seconds(10))
                #expect(response.status == .ok)
            }
            #expect(collector.spans.map(\.name) == ["x"] && collector.spans[0].traceID.isEmpty, "only the span, its missing ids empty")
            // Larger than a collector takes: refused, nothing kept.
            var huge = HTTPClientRequest(url: endpoint + "/v1/traces")
            huge.method = .POST
            huge.headers.add(name: "Content-Type", value: "application/json")
            huge.body = .bytes(ByteBuffer(repeating: 0x20, count: OTLPReceiver.maximumRequestBytes + 1))
            #expect(try await HTTPClient.shared.execute(huge, timeout: .seconds(10)).status.code == 413)
            #expect(collector.spans.count == 1)
        }
    }

    @Test func canopyTraceSaysWhatToDo() async throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-trace-input-\(UUID().uuidString).jsonl").path
        defer { try? FileManager.default.removeItem(atPath: file) }
        let missing = try await runExecutable("canopy", ["trace", "--file", file])
        #expect(missing.status != 0 && missing.errors.contains("canopy up --traces"), "\(missing.errors)")
        let notHex = try await runExecutable("canopy", ["trace", "xyz!", "--file", file])
        #expect(notHex.status != 0 && notHex.errors.contains("hexadecimal"), "\(notHex.errors)")
        try Data("not a span\n".utf8).write(to: URL(fileURLWithPath: file))
        let empty = try await runExecutable("canopy", ["trace", "--file", file])
        #expect(empty.status == 0 && empty.output.contains("no spans"), "\(empty.output)")
    }
}
