import CanopyBroker
import CanopyBus
import CanopyMessages
import CanopyServiceKit
import CanopyTesting
import Testing
import Tracing

/// One trace across a live bus, exported by swift-otel over OTLP to a local receiver: the
/// caller's span, the broker's waiter and flight spans, and the worker's handler, parented
/// through the `traceparent` the request header carries; and a second caller's identical
/// request in its own trace, linked to the flight that served it.
struct LiveTracingTests {
    typealias Caller = (trace: String, shared: Bool)

    /// Two apps' identical lookups through a traced live bus, the second while the first is
    /// at the worker: each caller's trace id, and whether it got the reply.
    static func twoIdenticalCalls(tracer: any Tracer) async throws -> (Caller, Caller) {
        var configuration = BrokerConfiguration.testing
        configuration.tracer = tracer
        return try await withLiveBus(configuration: configuration) { (live: LiveBus) async throws -> (Caller, Caller) in
            var runner = live.runnerConfiguration()
            runner.tracer = tracer
            live.run([ServiceRunner(service: TestWorkerService(workerName: "traced"), configuration: runner, context: live.context, logger: live.logger)])
            try await live.waitForWorkers(1)
            var client = BusClient.Configuration(endpoint: live.endpoint)
            client.tracer = tracer
            let bus = try BusClient(configuration: client, context: live.context, logger: live.logger)
            defer { bus.close() }
            @Sendable func call(_ app: String) async throws -> Caller {
                try await tracer.withSpan(app) { (span: any Span) async throws -> Caller in
                    let reply = try await bus.call(TestService.Lookup.self, .init(text: "fern", sleepMilliseconds: 5_000), principal: "alice")
                    return (BusTracing.trace(of: span.context, tracer: tracer)?.traceID ?? "", reply.text == "fern")
                }
            }
            async let first = call("app a")
            try await live.waitForLoad(inFlight: 1) // the first is at the worker: the second joins it
            async let second = call("app b")
            return try await (first, second)
        }
    }

    @Test func aTraceCrossesTheBusAndACoalescedCallerIsLinkedToTheFlight() async throws {
        try await withCollector { (collector: OTLPReceiver, endpoint: String) async throws in
            let (first, second) = try await withTracer(serviceName: "canopy-test", endpoint: endpoint) {
                (tracer: any Tracer) async throws -> (Caller, Caller) in
                try await Self.twoIdenticalCalls(tracer: tracer)
            }
            #expect(first.shared && second.shared && first.trace != second.trace && !first.trace.isEmpty)
            let spans = collector.spans
            func named(_ name: String, kind: String? = nil, in trace: String) throws -> TraceSpan {
                try #require(
                    spans.first { $0.name == name && $0.traceID == trace && (kind == nil || $0.kind == kind) },
                    "no \(name) in trace \(trace): \(spans.map { "\($0.traceID.prefix(6)) \($0.name)" })")
            }
            // The first caller's trace: the broker's spans and the worker's handler, each
            // under the caller's bus call (the header's context reaches the worker untouched).
            let app = try named("app a", in: first.trace)
            let call = try named("test/lookup", kind: "client", in: first.trace)
            let waiter = try named("broker test/lookup", in: first.trace)
            let flight = try named("flight test/lookup", in: first.trace)
            let handler = try named("test/lookup", kind: "server", in: first.trace)
            #expect(call.parentSpanID == app.spanID)
            #expect(waiter.parentSpanID == call.spanID && waiter.kind == "server")
            #expect(flight.parentSpanID == waiter.spanID && flight.events == ["dispatched"])
            #expect(handler.parentSpanID == call.spanID, "the worker continues its caller's context from the header")
            #expect(handler.attributes["rpc.method"] == "lookup" && waiter.attributes["canopy.coalesced"] == "false")
            #expect(flight.start <= handler.start && handler.end <= flight.end, "the flight spans the worker's call")
            // The second caller: its own trace, no worker call of its own, linked to the flight.
            let joined = try named("broker test/lookup", in: second.trace)
            #expect(joined.attributes["canopy.coalesced"] == "true" && joined.attributes["canopy.shared"] == "true")
            #expect(joined.links == [TraceSpan.Link(traceID: first.trace, spanID: flight.spanID)])
            #expect(
                !spans.contains {
                    $0.traceID == second.trace
                        && ($0.name.hasPrefix("flight") || $0.kind == "server" && $0.service == "canopy-test" && $0.name == "test/lookup")
                })
            // And the tree a person reads.
            let tree = try #require(TraceReport.tree(spans, traceID: String(second.trace.prefix(8))))
            #expect(tree.contains("coalesced") && tree.contains("linked to \(flight.spanID) in trace \(first.trace)"), "\(tree)")
        }
    }
}
