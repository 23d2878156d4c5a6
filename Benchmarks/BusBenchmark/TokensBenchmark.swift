import ArgumentParser
import CanopyAPI
import CanopyBroker
import CanopyBus
import CanopyCare
import CanopyMessages
import CanopyOutbound
import CanopyServiceKit
import CanopyTesting
import Foundation
import Histogram
import JWTKit
import Logging
import ServiceLifecycle

/// What a provider's token costs the edge against Canopy's own HS256: (1) verifying a token
/// not seen before, per algorithm, in process; (2) through canopy-api under wrk, a GET of a
/// person's collection with one token (each request after the first answered from the
/// verified-token cache) and with a new token for every request (every one verified), HS256
/// against RS256 (keys from a local OpenID provider, fetched once and kept).
struct TokensBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tokens",
        abstract: "Bearer tokens: verification per algorithm, and the edge's p99 with RS256 tokens from a provider against Canopy's HS256.",
        discussion: "Needs wrk (apt-get install wrk). Example: canopy-bench tokens --seconds 5 --connections 16,64 --rounds 3")

    @Option(help: "Distinct tokens verified per algorithm in process.") var count = 2_000
    @Option(help: "Seconds measured per setup.") var seconds = 5
    @Option(help: "wrk connections, comma-separated.") var connections = "16,64"
    @Option(help: "Rounds per setup; each ratio's median is reported.") var rounds = 3

    func run() async throws {
        var logger = Logger(label: "canopy-bench")
        logger.logLevel = .error
        let provider = LocalOpenIDProvider()
        let serving = serviceGroup([provider.application], signals: [], logger: logger)
        let server = Task { try await serving.run() }
        defer { server.cancel() }
        let issuer = try await provider.issuer()
        try await provider.addUsualKeys()
        let key = Array("the canopy-bench tokens signing key, long enough".utf8)
        let trusted = [TrustedIssuer(issuer: issuer, audiences: ["org.canopy.app"], prefix: "local")]
        var outbound = PinnedHTTP.Settings()
        outbound.allowedHosts = ["127.0.0.1"]
        let own = try TokenAuthority(keys: [key])

        // (1) Verification of tokens never seen, per algorithm.
        print("canopy-bench tokens: \(ProcessInfo.processInfo.activeProcessorCount) cores")
        var rows = [["token", "verified", "p50 µs", "p99 µs", "p50 against HS256"]]
        var baseline = 1.0
        for (name, kid) in [("HS256 (Canopy's own)", ""), ("RS256", "rsa-1"), ("ES256", "ec-1"), ("EdDSA", "ed-1")] {
            let authority = try TokenAuthority(keys: [key], issuers: trusted, http: try PinnedHTTP(settings: outbound))
            _ = await authority.loadIssuerKeys()
            var tokens: [String] = []
            for index in 0..<count {
                tokens.append(
                    kid.isEmpty
                        ? try await own.issue(user: "user-\(index)", lifetime: .seconds(3_600))
                        : try await provider.token(kid: kid, subject: "person-\(index)"))
            }
            var histogram = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
            for token in tokens {
                let started = ContinuousClock.now
                guard await authority.user(of: token) != nil else { throw BenchmarkFailure("a \(name) token was refused") }
                _ = histogram.record(UInt64((ContinuousClock.now - started).nanoseconds / 1_000))
            }
            let p50 = Double(histogram.valueAtPercentile(50))
            if kid.isEmpty { baseline = max(p50, 1) }
            rows.append([name, "\(count)", "\(histogram.valueAtPercentile(50))", "\(histogram.valueAtPercentile(99))", String(format: "%.1f", p50 / baseline)])
        }
        print("\n(1) verifying a token not seen before (signature and claims), in process")
        printTable(rows)

        // (2) Through the edge.
        guard let wrk = which("wrk") else { throw CommandFailure("wrk is not installed; apt-get install wrk, then run again") }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-bench-tokens-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        var edges: [APIHTTPServer] = []
        let stack = try await BenchStack(logger: logger) { endpoint, context in
            var care = CareServiceSettings(directory: directory.appendingPathComponent("care"), runner: .init(endpoint: endpoint))
            care.runner.credit = 64
            var services = try await buildCareService(settings: care, context: context, logger: logger)
            var settings = APIServiceSettings(http: .anyLoopbackPort, bus: .init(endpoint: endpoint), tokenKeys: [key])
            settings.rateLimit = 1_000_000
            settings.rateBurst = 1_000_000
            settings.trustedIssuers = trusted
            settings.jwksAllowedHosts = ["127.0.0.1"]
            let built = try buildAPIService(settings: settings, context: context, logger: logger)
            edges += built.compactMap { $0 as? APIHTTPServer }
            services += built
            return services
        }
        while (try? await stack.client.call(Broker.Services.self, Empty()))?.first(where: { $0.name == Care.service }) == nil {
            try await Task.sleep(for: .milliseconds(50))
        }
        let base = "http://127.0.0.1:\(try await edges[0].boundPort())"
        let script = directory.appendingPathComponent("canopy.lua")
        try EdgeBenchmark.wrkScript.write(to: script, atomically: true, encoding: .utf8)
        let runner = WrkRunner(wrk: wrk, script: script.path)
        // Distinct tokens, more than the verified-token cache keeps: every request verifies one.
        let distinct = 25_000
        progress("  issuing \(distinct) tokens of each kind…\n")
        var files: [String: String] = [:]
        for (kind, kid) in [("HS256", ""), ("RS256", "rsa-1")] {
            var lines: [String] = []
            for index in 0..<distinct {
                let token =
                    kid.isEmpty
                    ? try await own.issue(user: "edge-\(index % 50)", lifetime: .seconds(3_600))
                    : try await provider.token(kid: kid, subject: "edge-\(index % 50)")
                lines.append("\(token) /v1/plants?limit=5")
            }
            let file = directory.appendingPathComponent("\(kind).txt")
            try lines.joined(separator: "\n").appending("\n").write(to: file, atomically: true, encoding: .utf8)
            files[kind] = file.path
            // One line only: the same token every time (the cache path).
            let one = directory.appendingPathComponent("\(kind)-one.txt")
            try (lines[0] + "\n").write(to: one, atomically: true, encoding: .utf8)
            files[kind + "-one"] = one.path
        }
        var table = [
            ["tokens", "connections", "HS256 req/s", "HS256 p99 µs", "RS256 req/s", "RS256 p99 µs", "p99 RS256 / HS256 (median of rounds)", "wrk cores"]
        ]
        for connections in connections.split(separator: ",").compactMap({ Int($0) }) {
            for (label, suffix) in [("one token, repeated", "-one"), ("a new token every request", "")] {
                var ratios: [Double] = []
                var last: (WrkResult, WrkResult)?
                for _ in 0..<rounds {
                    let hs = try runner.run(url: base + "/", connections: connections, seconds: seconds, paths: files["HS256" + suffix])
                    let rs = try runner.run(url: base + "/", connections: connections, seconds: seconds, paths: files["RS256" + suffix])
                    guard hs.errors == 0 && rs.errors == 0 else { throw BenchmarkFailure("wrk saw errors: \(hs.errors) and \(rs.errors)") }
                    ratios.append(Double(rs.p99) / Double(max(hs.p99, 1)))
                    last = (hs, rs)
                }
                guard let (hs, rs) = last else { continue }
                table.append([
                    label, "\(connections)", String(format: "%.0f", hs.throughput), "\(hs.p99)", String(format: "%.0f", rs.throughput), "\(rs.p99)",
                    String(format: "%.2f", ratios.sorted()[ratios.count / 2]), String(format: "%.2f", max(hs.generatorCoreShare, rs.generatorCoreShare)),
                ])
            }
        }
        print("\n(2) GET /v1/plants?limit=5 through canopy-api under wrk, \(seconds) s a run, \(rounds) rounds (the last shown)")
        printTable(table)
        print("RS256 keys fetched \(provider.keySetFetches) time(s) by the edges and the in-process authorities")
        await stack.shutdown()
        await serving.triggerGracefulShutdown()
    }
}
