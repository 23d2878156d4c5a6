import CanopyBus
import CanopyMessages
import CanopyServiceKit
import CanopyTesting
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Testing

/// `/metrics` and `/health` as operators scrape them, next to a live bus.
@Suite(.serialized)
struct OperatingEndpointTests {
    func get(_ port: Int, _ path: String) async throws -> (status: Int, body: String) {
        let (data, response) = try await URLSession.shared.data(from: URL(string: "http://127.0.0.1:\(port)\(path)")!)
        return ((response as? HTTPURLResponse)?.statusCode ?? 0, String(decoding: data, as: UTF8.self))
    }

    /// The value of one Prometheus series, by its name and labels as written.
    func value(_ text: String, _ series: String) -> Double? {
        for line in text.split(separator: "\n") where line.hasPrefix(series + " ") {
            return Double(line.dropFirst(series.count + 1))
        }
        return nil
    }

    @Test func aWorkersMetricsCountItsCallsAndItsHealthFollowsItsBroker() async throws {
        try await withLiveBus { bus in
            let runner = bus.startRunner(TestWorkerService(workerName: "w1"), credit: 3)
            let endpoint = OperatingEndpoint(host: "127.0.0.1", port: 0, health: OperatingEndpoint.workerHealth([runner]), logger: bus.logger)
            let serving = Task { try await endpoint.run() }
            defer { serving.cancel() }
            let port = try await endpoint.boundPort(within: .seconds(60)) // generous: a loaded 2-core machine starves start-up
            try await bus.waitForWorkers(1)
            let client = try bus.client()
            for index in 0..<7 { _ = try await client.call(TestService.Echo.self, .init(text: "\(index)")) }
            for _ in 0..<2 {
                _ = try? await client.call(TestService.Fail.self, .init(text: "notFound"))
            }

            let metrics = try await get(port, "/metrics")
            #expect(metrics.status == 200)
            let ok = value(metrics.body, #"canopy_service_handler_duration_seconds_count{service="test",operation="echo",outcome="ok"}"#)
                ?? value(metrics.body, #"canopy_service_handler_duration_seconds_count{operation="echo",outcome="ok",service="test"}"#)
            #expect(ok.map { $0 >= 7 } == true, "\(metrics.body.prefix(2_000))")
            #expect(metrics.body.contains(#"outcome="notFound""#))
            #expect(metrics.body.contains("canopy_service_credit"))

            let health = try await get(port, "/health")
            #expect(health.status == 200, "\(health.body)")
            #expect(health.body.contains(#""healthy":true"#))

            // The broker goes away: the worker is no longer registered.
            bus.stopBroker()
            var unhealthy = false
            for _ in 0..<100 where !unhealthy {
                try await Task.sleep(for: .milliseconds(50))
                unhealthy = try await get(port, "/health").status == 503
            }
            #expect(unhealthy)
        }
    }

    @Test func theBrokersFiguresReachItsMetrics() async throws {
        try await withLiveBus { bus in
            bus.startWorker(name: "w1")
            try await bus.waitForWorkers(1)
            let client = try bus.client()
            for index in 0..<5 { _ = try await client.call(TestService.Echo.self, .init(text: "\(index)")) }
            let endpoint = OperatingEndpoint(host: "127.0.0.1", port: 0, health: { HealthReport(healthy: true, checks: [:]) }, logger: bus.logger)
            let serving = Task { try await endpoint.run() }
            defer { serving.cancel() }
            let port = try await endpoint.boundPort(within: .seconds(60)) // generous: a loaded 2-core machine starves start-up
            var served: Double?
            for _ in 0..<60 where (served ?? 0) < 5 { // the broker refreshes its series once a second
                try await Task.sleep(for: .milliseconds(100))
                served = value(try await get(port, "/metrics").body, #"canopy_broker_served_requests_total{service="test"}"#)
            }
            #expect((served ?? 0) >= 5)
            let text = try await get(port, "/metrics").body
            let ok = value(text, #"canopy_broker_requests_total{service="test",operation="echo",outcome="ok"}"#)
            #expect((value(text, #"canopy_broker_request_duration_seconds_count{service="test"}"#) ?? 0) >= 5)
            #expect((ok ?? 0) >= 5, "\(text.split(separator: "\n").filter { $0.contains("canopy_broker_requests_total") })")
        }
    }

    @Test func metricsBindIsHostAndPortOrOff() throws {
        #expect(try OperatingOptions.parse("off") == nil)
        #expect(try OperatingOptions.parse("0.0.0.0:9400").map { "\($0.host) \($0.port)" } == "0.0.0.0 9400")
        #expect(throws: (any Error).self) { try OperatingOptions.parse("9400") }
        #expect(throws: (any Error).self) { try OperatingOptions.parse("localhost:99999") }
    }
}
