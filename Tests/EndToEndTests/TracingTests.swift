import CanopySamples
import CanopyServiceKit
import CanopyTesting
import Foundation
import NIOHTTP1
import Testing

/// One person's identification as one trace across every process of a stack (`canopy up`):
/// the app's `traceparent` on its two requests (submit, then accept), the edge's spans, the
/// broker's, canopy-identify's handler and store, canopy-images' and canopy-care's, each
/// under the span that caused it; exported over OTLP/HTTP to a receiver in the test. And the
/// same for a person at a terminal: `canopy up --traces FILE` and `canopy trace`. (Part of
/// JourneyTests' serialized suite: one stack of processes at a time.)
extension JourneyTests {
    /// `span` and every span above it in `spans`, nearest first.
    static func traceAncestry(_ span: TraceSpan, in spans: [TraceSpan]) -> [TraceSpan] {
        var chain = [span]
        while let parent = spans.first(where: { $0.spanID == chain.last!.parentSpanID }), chain.count < 64 { chain.append(parent) }
        return chain
    }

    @Test func anIdentificationIsOneTraceAcrossEveryService() async throws {
        try await withCollector { collector, endpoint in
            let stack = try await Stack.start(environment: [
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
                "OTEL_BSP_SCHEDULE_DELAY": "100", "CANOPY_LOG_LEVEL": "debug",
            ])
            defer { try? FileManager.default.removeItem(atPath: stack.data) }
            let trace = "5ca1ab1e0ddba11ca5cadef00d5eed01"
            let (submitParent, acceptParent) = ("a1a1a1a1a1a1a1a1", "b2b2b2b2b2b2b2b2")
            do {
                let alice = try await stack.token("alice")
                let form = MultipartForm.encode(
                    [
                        .init(name: "photo", type: "image/jpeg", bytes: try SyntheticPlant.species(1).photo(seed: 7)),
                        .init(name: "organ", bytes: Array("leaf".utf8)),
                    ], boundary: "trace")
                let identified = try await stack.send(
                    .POST, "/v1/identifications", token: alice, body: form, type: "multipart/form-data; boundary=trace",
                    headers: [("traceparent", "00-\(trace)-\(submitParent)-01")])
                #expect(identified.status == 200, "\(identified.text)")
                let id = try #require(identified.object["id"] as? String)
                let accepted = try await stack.send(
                    .POST, "/v1/identifications/\(id)/accept", token: alice, json: #"{"rank":1}"#,
                    headers: [("traceparent", "00-\(trace)-\(acceptParent)-01")])
                #expect(accepted.status == 200, "\(accepted.text)")
                // A request the app did not sample leaves nothing.
                _ = try await stack.send(
                    .GET, "/v1/plants", token: alice, headers: [("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")])
            } catch {
                await stack.stop()
                throw error
            }
            await stack.stop() // every exporter sends what is left as its process stops

            let spans = collector.spans.filter { $0.traceID == trace }
            let services = Set(spans.map(\.service))
            #expect(services.isSuperset(of: ["canopy-api", "canopy-broker", "canopy-identify", "canopy-images", "canopy-care"]), "\(services)")
            #expect(!collector.spans.contains { $0.traceID == "0af7651916cd43dd8448eb211c80319c" })
            // Only the app's two spans are outside the trace; everything else has its parent in it.
            let ids = Set(spans.map(\.spanID))
            let roots = spans.filter { !ids.contains($0.parentSpanID) }
            #expect(Set(roots.map(\.parentSpanID)) == [submitParent, acceptParent], "\(roots.map { "\($0.service) \($0.name) <- \($0.parentSpanID)" })")
            #expect(roots.allSatisfy { $0.service == "canopy-api" && $0.kind == "server" })

            func handler(_ name: String, _ service: String) throws -> TraceSpan {
                try #require(
                    spans.first { $0.name == name && $0.service == service && $0.kind == "server" },
                    "no \(name) handler span of \(service): \(spans.map { "\($0.service) \($0.name)" }.sorted())")
            }
            // Submit: edge, broker, identify's handler, then its images.put through the broker to images.
            let submit = try handler("identify/identifications.submit", "canopy-identify")
            let put = try handler("images/images.put", "canopy-images")
            let putChain = Self.traceAncestry(put, in: spans)
            #expect(
                putChain.map(\.name) == [
                    "images/images.put", "images/images.put", "identify/identifications.submit", "identify/identifications.submit",
                    putChain.last!.name,
                ], "\(putChain.map(\.name))")
            #expect(putChain.map(\.service) == ["canopy-images", "canopy-identify", "canopy-identify", "canopy-api", "canopy-api"])
            #expect(putChain[1].kind == "client" && putChain[3].kind == "client")
            #expect(putChain.contains { $0.spanID == submit.spanID } && putChain.last?.parentSpanID == submitParent)
            #expect(putChain.last?.attributes["http.request.method"] == "POST")
            // The broker's part of each bus call: a span under the call, saying it was dispatched.
            for call in [putChain[1], putChain[3]] {
                let waiter = try #require(
                    spans.first { $0.name == "broker " + call.name && $0.parentSpanID == call.spanID }, "no broker span under \(call.name)")
                #expect(waiter.service == "canopy-broker" && waiter.attributes["canopy.coalesced"] == "false" && waiter.events.contains("dispatched"))
            }
            // Store calls are spans of the handler that made them.
            #expect(
                spans.contains {
                    $0.name == "store write" && $0.service == "canopy-images" && Self.traceAncestry($0, in: spans).contains { $0.spanID == put.spanID }
                })
            #expect(
                spans.contains {
                    $0.name.hasPrefix("store ") && $0.service == "canopy-identify" && Self.traceAncestry($0, in: spans).contains { $0.spanID == submit.spanID }
                })
            // Accept: identify adds the plant in canopy-care, under the app's second request.
            let add = try handler("care/plants.add", "canopy-care")
            #expect(Self.traceAncestry(add, in: spans).last?.parentSpanID == acceptParent)
            #expect(Self.traceAncestry(add, in: spans).contains { $0.name == "identify/identifications.accept" && $0.service == "canopy-identify" })
            // A log line written while serving it names the trace and the handler's span.
            let log = try String(contentsOfFile: stack.data + "/logs/images.log", encoding: .utf8)
            #expect(
                log.split(separator: "\n").contains {
                    $0.contains("service.handled") && $0.contains("trace_id=\(trace)") && $0.contains("span_id=\(put.spanID)")
                },
                "\(log.split(separator: "\n").filter { $0.contains("service.handled") }.prefix(5))")
        }
    }

    @Test func canopyUpWritesTheStacksSpansAndCanopyTracePrintsATree() async throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-traces-\(UUID().uuidString).jsonl").path
        defer { try? FileManager.default.removeItem(atPath: file) }
        let stack = try await Stack.start(environment: [:], ["--traces", file])
        defer { try? FileManager.default.removeItem(atPath: stack.data) }
        do {
            let alice = try await stack.token("alice")
            // Every request is recorded, with or without an app's trace.
            #expect(
                try await stack.send(.POST, "/v1/plants", token: alice, json: #"{"scientificName":"Monstera deliciosa","customName":"Traced"}"#).status == 201)
        } catch {
            await stack.stop()
            throw error
        }
        await stack.stop()
        let spans = try SpanFile.read(path: file)
        let edge = try #require(
            spans.first { $0.service == "canopy-api" && $0.kind == "server" && $0.attributes["http.request.method"] == "POST" },
            "\(spans.map { "\($0.service) \($0.name)" })")
        let listed = try await runExecutable("canopy", ["trace", "--data-dir", stack.data])
        #expect(listed.status == 0 && listed.output.contains(edge.traceID) && listed.output.hasPrefix("trace "), "\(listed.output) \(listed.errors)")
        let tree = try await runExecutable("canopy", ["trace", String(edge.traceID.prefix(12)), "--file", file])
        #expect(tree.status == 0, "\(tree.errors)")
        let lines = tree.output.split(separator: "\n").map(String.init)
        #expect(lines.first?.hasPrefix("trace \(edge.traceID):") == true)
        // The edge at the root.
        func depth(_ name: String) -> Int? {
            lines.first { $0.trimmingCharacters(in: .whitespaces).hasPrefix(name + "  [") }.map { $0.prefix { $0 == " " }.count / 2 }
        }
        #expect(depth(edge.name) == 0, "\(tree.output)")
        // The edge's bus call, and the broker's span and the care handler both under it.
        func depth(of line: String?) -> Int? { line.map { $0.prefix { $0 == " " }.count / 2 } }
        let call = depth(of: lines.first { $0.contains("care/plants.add  [canopy-api]") })
        let broker = depth(of: lines.first { $0.contains("broker care/plants.add  [canopy-broker]") })
        let handler = depth(of: lines.first { $0.contains("care/plants.add  [canopy-care]") })
        #expect(call == 1 && broker == 2 && handler == 2, "\(tree.output)")
        #expect(lines.contains { $0.hasPrefix("      * dispatched") }, "the broker span's events under it: \(tree.output)")
        #expect(lines.contains { $0.contains("store write  [canopy-care]") && $0.contains(" ms") })
        let unknown = try await runExecutable("canopy", ["trace", "ffffffff", "--file", file])
        #expect(unknown.status != 0 && unknown.errors.contains("canopy trace lists them"))
    }
}
