import CanopyBroker
import CanopyBus
import CanopyMessages
import CanopyServiceKit
import CanopyTesting
import Foundation
import Testing

/// `/metrics` and `/health` as operators scrape them, next to a live bus.
@Suite(.serialized)
struct OperatingEndpointTests {
    @Test func aWorkersMetricsCountItsCallsAndItsHealthFollowsItsBroker() async throws {
        try await withLiveBus { bus in
            let runner = bus.startRunner(TestWorkerService(workerName: "w1"), credit: 3)
            let services = try OperatingEndpoint.serving([runner], at: .anyLoopbackPort, logger: bus.logger)
            let endpoint = try #require(services.first(OperatingEndpoint.self))
            bus.run([endpoint])
            let port = try await endpoint.boundPort(within: .seconds(60)) // generous: a loaded 2-core machine starves start-up
            try await bus.waitForWorkers(1)
            let before = try await OperatingProbe.metrics(port)
            let client = try bus.client()
            for index in 0..<7 { _ = try await client.call(TestService.Echo.self, .init(text: "\(index)")) }
            for _ in 0..<2 {
                _ = try? await client.call(TestService.Fail.self, .init(text: "notFound"))
            }

            // Other suites of this process use the same registry at the same time: they can only add.
            let metrics = try await OperatingProbe.metrics(port)
            let handled = "canopy_service_handler_duration_seconds_count"
            #expect(metrics.growth(since: before, handled, ["service": "test", "operation": "echo", "outcome": "ok"]) >= 7)
            #expect(metrics.growth(since: before, handled, ["service": "test", "operation": "fail", "outcome": "notFound"]) >= 2)
            #expect(metrics.types["canopy_service_handler_duration_seconds"] == "histogram")
            #expect(metrics.has("canopy_service_credit") && metrics.has("canopy_service_in_flight"))

            let health = try await OperatingProbe.get(port, "/health")
            #expect(health.status == 200, "\(health.body)")
            #expect(health.body.contains(#""healthy":true"#))

            // The broker goes away: the worker is no longer registered.
            bus.stopBroker()
            #expect(try await OperatingProbe.waitForHealth(port, status: 503, within: .seconds(10)))
        }
    }

    @Test func theBrokerThatServeBuildsCountsWhatItAnswersAndSaysItTurns() async throws {
        try await withLiveBus { bus in
            // A second broker, built as `canopy-broker serve` builds it, with a worker and a client of its own.
            let services = try buildBroker(
                settings: .init(endpoint: "tcp://127.0.0.1:*", configuration: .testing, metrics: .anyLoopbackPort),
                context: bus.context, logger: bus.logger)
            let broker = try #require(services.first(BrokerServer.self))
            let listener = try #require(services.first(OperatingEndpoint.self))
            bus.run(services)
            let port = try await listener.boundPort(within: .seconds(60))
            #expect(try await OperatingProbe.waitForHealth(port, status: 200))
            #expect(try await OperatingProbe.get(port, "/health").body.contains("bound, turning"))

            var runner = bus.runnerConfiguration()
            runner.endpoint = broker.endpoint
            bus.run([ServiceRunner(service: TestWorkerService(workerName: "w1"), configuration: runner, context: bus.context, logger: bus.logger)])
            let before = try await OperatingProbe.metrics(port)
            let client = try BusClient(configuration: .init(endpoint: broker.endpoint), context: bus.context, logger: bus.logger)
            defer { client.close() }
            var answered = false
            for _ in 0..<300 where !answered { // until the worker has registered
                answered = (try? await client.call(TestService.Echo.self, .init(text: "first"), timeout: .milliseconds(200))) != nil
            }
            #expect(answered)
            for index in 0..<5 { _ = try await client.call(TestService.Echo.self, .init(text: "\(index)")) }
            await #expect(throws: CanopyError.self) { _ = try await client.call(TestService.Fail.self, .init(text: "conflict")) }

            // The broker refreshes its series once a second; other brokers of this process (the
            // other suites') share the registry, so the figures can only have grown more.
            let requests = "canopy_broker_requests_total"
            let expected: [(String, [String: String], Double)] = [
                (requests, ["broker": "broker", "service": "test", "operation": "echo", "outcome": "ok"], 6), // every series names its broker
                (requests, ["service": "test", "operation": "fail", "outcome": "conflict"], 1),
                ("canopy_broker_served_requests_total", ["service": "test"], 6),
                ("canopy_broker_request_duration_seconds_count", ["service": "test"], 7),
            ]
            let metrics = try await OperatingProbe.metrics(port) { scrape in
                expected.allSatisfy { scrape.growth(since: before, $0.0, $0.1) >= $0.2 }
            }
            for (name, labels, least) in expected {
                #expect(metrics.growth(since: before, name, labels) >= least, "\(name) \(labels)")
            }
            for gauge in ["canopy_broker_workers", "canopy_broker_in_flight_requests", "canopy_broker_queued_requests", "canopy_broker_queued_bytes"] {
                #expect(metrics.has(gauge), "\(gauge)")
            }
            #expect(metrics.has("canopy_broker_malformed_messages_total"))
            #expect(metrics.has("canopy_broker_coalesced_requests_total"))
        }
    }

    @Test func metricsBindIsHostAndPortOrOff() throws {
        #expect(try OperatingOptions.parse("off") == nil)
        #expect(try OperatingOptions.parse("0.0.0.0:9400") == ListenAddress(host: "0.0.0.0", port: 9400))
        #expect(throws: (any Error).self) { try OperatingOptions.parse("9400") }
        #expect(throws: (any Error).self) { try OperatingOptions.parse("localhost:99999") }
    }

    @Test func prometheusTextIsReadBackBySeriesAndLabels() throws {
        let text = try PrometheusText(
            """
            # TYPE requests_total counter
            requests_total{service="care",outcome="ok"} 3
            requests_total{outcome="busy",service="care"} 2
            requests_total{service="images",outcome="ok"} 1.5e1
            latency_bucket{le="+Inf"} 4
            """)
        #expect(text.value("requests_total", ["service": "care"]) == 5)
        #expect(text.value("requests_total", ["outcome": "ok"]) == 18)
        #expect(text.value("requests_total", ["service": "nobody"]) == nil)
        #expect(text.types["requests_total"] == "counter")
        #expect(text.value("latency_bucket", ["le": "+Inf"]) == 4)
        #expect(throws: PrometheusText.ParseError.self) { try PrometheusText("requests_total{service=\"care} 3") }
        #expect(throws: PrometheusText.ParseError.self) { try PrometheusText("requests_total three") }
    }
}

/// A listener whose port is taken after the build's check (another program was quicker) ends
/// the whole group with the check's sentence: the worker's loop, which ignored cancellation,
/// used to keep the process alive past SIGTERM.
@Suite struct PortTakenAtRunTests {
    @Test func aListenerThatCannotBindEndsTheGroupWithASentence() async throws {
        try await withLiveBus { bus in
            let port = FreePorts.any()
            let runner = ServiceRunner(
                service: TestWorkerService(workerName: "w1"), configuration: bus.runnerConfiguration(credit: 1),
                context: bus.context, logger: bus.logger)
            let services = try OperatingEndpoint.serving([runner], at: ListenAddress(host: "127.0.0.1", port: port), logger: bus.logger)
            let taken = FreePorts.hold(port)
            defer { taken.release() }
            let group = serviceGroup(services, signals: [], logger: bus.logger)
            let running = Task { try await group.run() }
            // Bounded so a hang fails the test: the group must end by itself, long before this.
            let watchdog = Task {
                try await Task.sleep(for: .seconds(60))
                running.cancel()
            }
            defer { watchdog.cancel() }
            await #expect {
                try await running.value
            } throws: { error in
                "\(error)".contains("cannot listen on 127.0.0.1:\(port) for /metrics and /health") && "\(error)".contains("--metrics-bind")
            }
        }
    }
}
