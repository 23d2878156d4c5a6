import CanopyDeployment
import Foundation
import Testing
import Yams

/// deploy/kubernetes (a kustomize base and its production overlay) checked against
/// docker-compose.yml and `CanopyStack`, as ComposeFileTests checks the compose file against the
/// executables: the same services, commands, ports, variables and secrets, probes on each
/// service's `/health` at its metrics port, and what a cluster adds (replicas, disruption
/// budgets, autoscalers, volumes, the Dockerfile's user). So the manifests cannot drift from
/// the compose file. `scripts/check-kubernetes` renders both with kustomize and validates every
/// object against Kubernetes' schemas; these tests read the files themselves (one object each,
/// as the base's kustomization lists them), so they need no tool.
@Suite
struct KubernetesManifestTests {
    static let kubernetes = ComposeFileTests.root.appendingPathComponent("deploy/kubernetes")

    /// A file under deploy/kubernetes holding one YAML mapping.
    static func load(_ path: String) throws -> [String: Any] {
        let text = try String(contentsOf: kubernetes.appendingPathComponent(path), encoding: .utf8)
        return try #require(try Yams.load(yaml: text) as? [String: Any], "deploy/kubernetes/\(path) is not one YAML mapping")
    }

    /// The base's objects, from each file its kustomization lists, by `Kind/name`.
    static func base() throws -> [String: [String: Any]] {
        let files = try #require(try load("base/kustomization.yaml")["resources"] as? [String])
        var objects: [String: [String: Any]] = [:]
        for file in files {
            let object = try load("base/\(file)")
            let kind = try #require(object["kind"] as? String, "base/\(file) has no kind")
            let name = try #require(dictionary(object["metadata"])["name"] as? String, "base/\(file) has no name")
            #expect(!objects.keys.contains("\(kind)/\(name)"), "\(kind)/\(name) is in the base twice")
            objects["\(kind)/\(name)"] = object
        }
        return objects
    }

    /// A YAML mapping, or an empty one.
    static func dictionary(_ value: Any?) -> [String: Any] {
        value as? [String: Any] ?? [:]
    }

    /// A YAML sequence of mappings, or an empty one.
    static func dictionaries(_ value: Any?) -> [[String: Any]] {
        value as? [[String: Any]] ?? []
    }

    /// A Deployment's pod spec.
    static func pod(_ deployment: [String: Any]) -> [String: Any] {
        dictionary(dictionary(dictionary(deployment["spec"])["template"])["spec"])
    }

    /// A Deployment's one container.
    static func container(_ deployment: [String: Any]) throws -> [String: Any] {
        let containers = dictionaries(pod(deployment)["containers"])
        #expect(containers.count == 1, "one container a pod, as one a compose service")
        return try #require(containers.first)
    }

    /// A container's variables: each one's value, or `secret:NAME/KEY` for one read from a Secret.
    static func environment(_ container: [String: Any]) -> [String: String] {
        var environment: [String: String] = [:]
        for variable in dictionaries(container["env"]) {
            guard let name = variable["name"] as? String else { continue }
            let reference = dictionary(dictionary(variable["valueFrom"])["secretKeyRef"])
            if let secret = reference["name"] as? String, let key = reference["key"] as? String {
                environment[name] = "secret:\(secret)/\(key)"
            } else {
                environment[name] = variable["value"] as? String ?? ""
            }
        }
        return environment
    }

    /// The files a Deployment's pods find in /run/secrets: each one's name, and the Secret and
    /// key it comes from.
    static func mountedSecrets(_ deployment: [String: Any]) -> [String: (secret: String, key: String)] {
        let pod = Self.pod(deployment)
        let mounts = dictionaries(dictionaries(pod["containers"]).first?["volumeMounts"])
        let mount = mounts.first { $0["mountPath"] as? String == "/run/secrets" }
        let volumeName = mount?["name"] as? String
        var files: [String: (secret: String, key: String)] = [:]
        for volume in dictionaries(pod["volumes"]) where volume["name"] as? String == volumeName {
            for source in dictionaries(dictionary(volume["projected"])["sources"]) {
                let secret = dictionary(source["secret"])
                guard let secretName = secret["name"] as? String else { continue }
                for item in dictionaries(secret["items"]) {
                    if let key = item["key"] as? String, let path = item["path"] as? String {
                        files[path] = (secret: secretName, key: key)
                    }
                }
            }
        }
        return files
    }

    /// The production overlay's generated Secrets, each one's keys: a `KEY=…` entry's key, or
    /// a file's name.
    static func generatedSecrets() throws -> [String: Set<String>] {
        let overlay = try load("overlays/production/kustomization.yaml")
        var secrets: [String: Set<String>] = [:]
        for generator in dictionaries(overlay["secretGenerator"]) {
            let name = try #require(generator["name"] as? String)
            var keys = Set<String>()
            let entries = (generator["files"] as? [String] ?? []) + (generator["literals"] as? [String] ?? [])
            for entry in entries {
                if let equals = entry.firstIndex(of: "=") {
                    keys.insert(String(entry[..<equals]))
                } else {
                    keys.insert(String(entry.split(separator: "/").last ?? ""))
                }
            }
            secrets[name] = keys
        }
        return secrets
    }

    /// A compose value as a container gets it when nothing is set where compose runs:
    /// `${NAME:-default}` is `default`; anything else is itself.
    static func composeDefault(_ value: String) -> String {
        guard value.hasPrefix("${"), value.hasSuffix("}"), let separator = value.range(of: ":-") else { return value }
        return String(value[separator.upperBound..<value.index(before: value.endIndex)])
    }

    /// Compose's `10s`, in seconds.
    static func seconds(_ value: Any?) -> Int? {
        guard let text = value as? String, text.hasSuffix("s") else { return nil }
        return Int(text.dropLast())
    }

    @Test func everyComposeServiceHasADeploymentWithTheSameCommandAndPorts() throws {
        let objects = try Self.base()
        let services = try ComposeFileTests.services(try ComposeFileTests.compose())
        // The same services as docker-compose.yml runs from the image (PostgreSQL is outside the
        // cluster), and no others.
        let deployments = objects.keys.filter { $0.hasPrefix("Deployment/") }
        #expect(Set(deployments) == Set(CanopyStack.services.flatMap(CanopyStack.composeNames).map { "Deployment/\($0)" }))
        for service in CanopyStack.services {
            for name in CanopyStack.composeNames(service) {
                let deployment = try #require(objects["Deployment/\(name)"], "the base has no Deployment \(name)")
                let definition = try #require(services[name], "docker-compose.yml has no service \(name)")
                let container = try Self.container(deployment)
                // compose's `command` is the container's `args` (the image has no ENTRYPOINT).
                #expect(container["args"] as? [String] == definition["command"] as? [String], "\(name) runs \(String(describing: container["args"]))")
                #expect(!container.keys.contains("command"), "\(name) replaces the image's entrypoint")
                #expect(Array((container["args"] as? [String] ?? []).prefix(2)) == [service.executable, service.subcommand])
                #expect(container["image"] as? String == "canopy:latest")
                // Every port compose binds (the broker's endpoint, the metrics listener, the HTTP
                // API) is one the container declares; Prometheus finds the metrics port.
                let ports = Self.dictionaries(container["ports"]).compactMap { $0["containerPort"] as? Int }
                #expect(ports.contains(service.metricsPort), "\(name) declares no port \(service.metricsPort): \(ports)")
                let environment = try #require(definition["environment"] as? [String: Any])
                for variable in ["CANOPY_BIND", "CANOPY_METRICS_BIND", "CANOPY_HTTP"] {
                    guard let address = environment[variable] as? String else { continue }
                    let port = address.split(separator: ":").last.flatMap { Int($0) }
                    #expect(port.map { ports.contains($0) } == true, "\(name): \(variable)=\(address), but the container declares \(ports)")
                }
                let template = Self.dictionary(Self.dictionary(deployment["spec"])["template"])
                let annotations = Self.dictionary(Self.dictionary(template["metadata"])["annotations"])
                #expect(annotations["prometheus.io/port"] as? String == "\(service.metricsPort)", "\(name)")
                // The brokers and the edge are reached by their compose names: a Service each.
                if service == CanopyStack.broker || service.name == "api" {
                    let object = try #require(objects["Service/\(name)"], "the base has no Service \(name)")
                    let spec = Self.dictionary(object["spec"])
                    let servicePorts = Self.dictionaries(spec["ports"]).compactMap { $0["port"] as? Int }
                    #expect(servicePorts.contains(service == CanopyStack.broker ? 5555 : 8080), "Service \(name): \(servicePorts)")
                    #expect(Self.dictionary(spec["selector"])["app.kubernetes.io/name"] as? String == name)
                    let labels = Self.dictionary(Self.dictionary(template["metadata"])["labels"])
                    #expect(labels["app.kubernetes.io/name"] as? String == name, "Service \(name) selects \(name)'s pods")
                }
            }
        }
    }

    @Test func everyDeploymentSetsTheVariablesComposeSetsWithComposesValues() throws {
        let objects = try Self.base()
        let services = try ComposeFileTests.services(try ComposeFileTests.compose())
        let generated = try Self.generatedSecrets()
        for service in CanopyStack.services {
            for name in CanopyStack.composeNames(service) {
                let composed = try #require(services[name]?["environment"] as? [String: Any], "docker-compose.yml sets nothing for \(name)")
                let environment = Self.environment(try Self.container(try #require(objects["Deployment/\(name)"])))
                // The same variables, none left out and none added.
                #expect(Set(environment.keys) == Set(composed.keys), "\(name): \(Set(environment.keys).symmetricDifference(Set(composed.keys)).sorted())")
                for (variable, value) in composed {
                    let expected = try #require(value as? String, "\(name): \(variable) is not a string in docker-compose.yml")
                    if variable == "CANOPY_DATABASE_URL" {
                        // The one value that differs, and why: PostgreSQL is outside the cluster,
                        // its URL (without a password) in the Secret canopy-database.
                        #expect(environment[variable] == "secret:canopy-database/url", "\(name)")
                        #expect(generated["canopy-database"]?.contains("url") == true, "the production overlay makes no canopy-database/url")
                    } else {
                        // compose's `${NAME:-default}` (the traces' variables) is its default here.
                        #expect(environment[variable] == Self.composeDefault(expected), "\(name): \(variable)")
                    }
                }
                // Every broker a service is given is a Service of the base on that port.
                for address in (environment["CANOPY_ENDPOINT"] ?? "").split(separator: ",") {
                    let hostAndPort = address.replacingOccurrences(of: "tcp://", with: "").split(separator: ":")
                    let host = String(hostAndPort.first ?? "")
                    let port = Int(hostAndPort.last ?? "")
                    let object = try #require(objects["Service/\(host)"], "\(name) calls \(address): the base has no Service \(host)")
                    let ports = Self.dictionaries(Self.dictionary(object["spec"])["ports"]).compactMap { $0["port"] as? Int }
                    #expect(port.map { ports.contains($0) } == true, "\(name) calls \(address): Service \(host) has ports \(ports)")
                }
            }
        }
    }

    @Test func everySecretComposeMountsIsAFileAtTheSamePathFromTheOverlaysSecrets() throws {
        let objects = try Self.base()
        let compose = try ComposeFileTests.compose()
        let services = try ComposeFileTests.services(compose)
        let files = try #require(compose["secrets"] as? [String: [String: String]])
        let generated = try Self.generatedSecrets()
        for service in CanopyStack.services {
            for name in CanopyStack.composeNames(service) {
                let deployment = try #require(objects["Deployment/\(name)"])
                let mounted = Self.mountedSecrets(deployment)
                let wanted = try #require(services[name]?["secrets"] as? [String], "docker-compose.yml gives \(name) no secrets")
                // Each secret compose mounts, as the file /run/secrets/NAME, and no other.
                #expect(Set(mounted.keys) == Set(wanted), "\(name) mounts \(mounted.keys.sorted()); compose \(wanted.sorted())")
                for secret in wanted {
                    // Its Secret's key is the file compose reads it from (./secrets/FILE, made by
                    // scripts/compose-secrets), and the production overlay generates it.
                    let file = try #require(files[secret]?["file"], "docker-compose.yml has no secret \(secret)")
                    let source = try #require(mounted[secret], "\(name) does not mount \(secret)")
                    #expect("./secrets/" + source.key == file, "\(name): \(secret) comes from \(source.secret)/\(source.key); compose reads \(file)")
                    #expect(generated[source.secret]?.contains(source.key) == true, "the production overlay makes no \(source.secret)/\(source.key)")
                }
                // Read-only, where compose mounts secrets; every /run/secrets file a variable
                // names is among them.
                let container = try Self.container(deployment)
                let mount = Self.dictionaries(container["volumeMounts"]).first { $0["mountPath"] as? String == "/run/secrets" }
                #expect(mount?["readOnly"] as? Bool == true, "\(name) mounts no read-only /run/secrets")
                for (variable, value) in Self.environment(container) {
                    for path in value.split(separator: ",") where path.hasPrefix("/run/secrets/") {
                        #expect(
                            mounted.keys.contains(String(path.dropFirst("/run/secrets/".count))), "\(name): \(variable) names \(path), which is not mounted")
                    }
                }
            }
        }
    }

    @Test func probesAskEachServicesHealthOnItsMetricsPortAsComposesHealthCheckDoes() throws {
        let objects = try Self.base()
        let services = try ComposeFileTests.services(try ComposeFileTests.compose())
        for service in CanopyStack.services {
            for name in CanopyStack.composeNames(service) {
                let container = try Self.container(try #require(objects["Deployment/\(name)"]))
                let healthcheck = try #require(services[name]?["healthcheck"] as? [String: Any], "docker-compose.yml has no healthcheck for \(name)")
                // compose's health command asks the same listener: its metrics port.
                let test = try #require(healthcheck["test"] as? [String])
                #expect(test.contains("127.0.0.1:\(service.metricsPort)"), "\(name): \(test)")
                for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
                    let definition = try #require(container[probe] as? [String: Any], "\(name) has no \(probe)")
                    let get = Self.dictionary(definition["httpGet"])
                    #expect(get["path"] as? String == "/health" && get["port"] as? Int == service.metricsPort, "\(name): \(probe) asks \(get)")
                }
                // Readiness as compose's healthcheck: its interval, timeout and retries.
                let readiness = Self.dictionary(container["readinessProbe"])
                #expect(readiness["periodSeconds"] as? Int == Self.seconds(healthcheck["interval"]), "\(name)")
                #expect(readiness["timeoutSeconds"] as? Int == Self.seconds(healthcheck["timeout"]), "\(name)")
                #expect(readiness["failureThreshold"] as? Int == healthcheck["retries"] as? Int, "\(name)")
                // Liveness gives up later: a pod whose brokers are away leaves the Service first.
                let liveness = Self.dictionary(container["livenessProbe"])
                #expect((liveness["failureThreshold"] as? Int ?? 0) > (readiness["failureThreshold"] as? Int ?? 0), "\(name)")
                // Stopped as compose stops it: SIGTERM, and at least its stop_grace_period to drain.
                let grace = Self.pod(try #require(objects["Deployment/\(name)"]))["terminationGracePeriodSeconds"] as? Int ?? 0
                #expect(grace >= Self.seconds(services[name]?["stop_grace_period"]) ?? 0, "\(name) has \(grace) s to stop")
            }
        }
    }

    @Test func podsRunAsTheDockerfilesUserWithAReadOnlyRootAndComposesVolumes() throws {
        let uid = try ComposeStackTests.containerUser()
        let objects = try Self.base()
        let services = try ComposeFileTests.services(try ComposeFileTests.compose())
        for service in CanopyStack.services {
            for name in CanopyStack.composeNames(service) {
                let deployment = try #require(objects["Deployment/\(name)"])
                let pod = Self.pod(deployment)
                let security = Self.dictionary(pod["securityContext"])
                #expect(
                    security["runAsUser"] as? Int == uid && security["runAsGroup"] as? Int == uid && security["fsGroup"] as? Int == uid, "\(name): \(security)")
                #expect(security["runAsNonRoot"] as? Bool == true, "\(name)")
                let container = try Self.container(deployment)
                let containerSecurity = Self.dictionary(container["securityContext"])
                #expect(containerSecurity["readOnlyRootFilesystem"] as? Bool == true, "\(name) writes only to its volumes")
                #expect(containerSecurity["allowPrivilegeEscalation"] as? Bool == false, "\(name)")
                // Each path compose gives a volume is a writable volume here: an anonymous one
                // (`/data`) the pod's own, a named one (`photos:/photos`) the claim of that name.
                var volumes: [String: [String: Any]] = [:]
                for volume in Self.dictionaries(pod["volumes"]) {
                    if let volumeName = volume["name"] as? String { volumes[volumeName] = volume }
                }
                var mounted: [String: [String: Any]] = [:]
                for mount in Self.dictionaries(container["volumeMounts"]) {
                    if let path = mount["mountPath"] as? String, let volumeName = mount["name"] as? String {
                        mounted[path] = volumes[volumeName] ?? [:]
                    }
                }
                for entry in services[name]?["volumes"] as? [String] ?? [] {
                    let parts = entry.split(separator: ":").map(String.init)
                    let path = parts.last ?? entry
                    let volume = try #require(mounted[path], "\(name) mounts nothing at \(path) (compose: \(entry))")
                    if parts.count == 1 {
                        #expect(volume.keys.contains("emptyDir"), "\(name): \(path) is the pod's own, as compose's anonymous volume")
                    } else {
                        let claimName = Self.dictionary(volume["persistentVolumeClaim"])["claimName"] as? String
                        #expect(claimName == parts[0], "\(name): \(path) is not the claim \(parts[0])")
                        let claim = try #require(objects["PersistentVolumeClaim/\(parts[0])"], "the base has no claim \(parts[0])")
                        let modes = Self.dictionary(claim["spec"])["accessModes"] as? [String] ?? []
                        // photos is every images replica's at once; a broker's volume its one pod's.
                        #expect(modes == [service.scales ? "ReadWriteMany" : "ReadWriteOnce"], "\(parts[0]): \(modes)")
                    }
                }
            }
        }
    }

    @Test func replicatedServicesHaveReplicasABudgetAndTheEdgeAndImagesAnAutoscaler() throws {
        let objects = try Self.base()
        let autoscaled = ["api", "images"]
        for service in CanopyStack.services {
            for name in CanopyStack.composeNames(service) {
                let deployment = try #require(objects["Deployment/\(name)"])
                let spec = Self.dictionary(deployment["spec"])
                if service == CanopyStack.broker {
                    // Each live broker is one pod, replaced whole: never two pods of one broker.
                    #expect(spec["replicas"] as? Int == 1, "\(name)")
                    #expect(Self.dictionary(spec["strategy"])["type"] as? String == "Recreate", "\(name)")
                } else if autoscaled.contains(name) {
                    // Its autoscaler sets its replicas; a count in the Deployment would be put
                    // back at every apply.
                    #expect(!spec.keys.contains("replicas"), "\(name) names replicas its autoscaler sets")
                    let autoscaler = try #require(objects["HorizontalPodAutoscaler/\(name)"], "the base has no autoscaler for \(name)")
                    #expect(autoscaler["apiVersion"] as? String == "autoscaling/v2")
                    let autoscalerSpec = Self.dictionary(autoscaler["spec"])
                    let target = Self.dictionary(autoscalerSpec["scaleTargetRef"])
                    #expect(target["kind"] as? String == "Deployment" && target["name"] as? String == name, "\(name)'s autoscaler scales \(target)")
                    #expect((autoscalerSpec["minReplicas"] as? Int ?? 0) >= 2, "\(name)")
                    #expect((autoscalerSpec["maxReplicas"] as? Int ?? 0) > (autoscalerSpec["minReplicas"] as? Int ?? 0), "\(name)")
                } else {
                    #expect(service.scales, "\(name) runs replicas but CanopyStack says it does not scale")
                    #expect((spec["replicas"] as? Int ?? 0) >= 2, "\(name) runs replicas")
                }
                // Its disruption budget selects its pods and lets one go at a time (one budget
                // over both brokers: never both at once).
                let budgetName = service == CanopyStack.broker ? "broker" : name
                let budget = try #require(objects["PodDisruptionBudget/\(budgetName)"], "the base has no PodDisruptionBudget \(budgetName)")
                let budgetSpec = Self.dictionary(budget["spec"])
                let selector = Self.dictionary(Self.dictionary(budgetSpec["selector"])["matchLabels"])
                let labels = Self.dictionary(Self.dictionary(Self.dictionary(spec["template"])["metadata"])["labels"])
                #expect(
                    !selector.isEmpty && selector.allSatisfy { labels[$0.key] as? String == $0.value as? String },
                    "PodDisruptionBudget \(budgetName) does not select \(name)'s pods")
                #expect(budgetSpec["maxUnavailable"] as? Int == 1, "\(budgetName)")
            }
        }
        // PostgreSQL is outside the cluster: nothing in the base runs it.
        #expect(!objects.keys.contains { $0.hasPrefix("StatefulSet/") })
        for (key, object) in objects where key.hasPrefix("Deployment/") {
            let image = try Self.container(object)["image"] as? String ?? ""
            #expect(!image.hasPrefix("postgres"), "\(key) runs \(image)")
        }
    }

    @Test func everyContainerRequestsAndLimitsCPUAndMemoryWithTheFiguresItComesFrom() throws {
        let objects = try Self.base()
        let files = try #require(try Self.load("base/kustomization.yaml")["resources"] as? [String])
        for service in CanopyStack.services {
            for name in CanopyStack.composeNames(service) {
                let resources = Self.dictionary(try Self.container(try #require(objects["Deployment/\(name)"]))["resources"])
                for kind in ["requests", "limits"] {
                    let values = Self.dictionary(resources[kind])
                    #expect(values["cpu"] is String && values["memory"] is String, "\(name) has no CPU or memory \(kind)")
                }
                // The arithmetic is in the file's comments, from docs/PERFORMANCE.md's figures.
                #expect(files.contains("\(name).yaml"), "\(name)'s Deployment is not in base/\(name).yaml")
                let text = try String(contentsOf: Self.kubernetes.appendingPathComponent("base/\(name).yaml"), encoding: .utf8)
                #expect(text.contains("docs/PERFORMANCE.md") && text.contains("→"), "base/\(name).yaml does not say where its resources come from")
            }
        }
    }

    @Test func theProductionOverlayTakesTheBaseWithAVersionedImageAndTheSecretsComposeSecretsMakes() throws {
        let overlay = try Self.load("overlays/production/kustomization.yaml")
        let base = try Self.load("base/kustomization.yaml")
        let objects = try Self.base()
        #expect(overlay["resources"] as? [String] == ["../../base"])
        // Its generated Secrets are in the base's namespace, which the base's pods read them in.
        #expect(overlay["namespace"] as? String == base["namespace"] as? String)
        // A versioned image, not the base's canopy:latest.
        let image = try #require(Self.dictionaries(overlay["images"]).first { $0["name"] as? String == "canopy" }, "the overlay sets no tag for canopy")
        let tag = try #require(image["newTag"] as? String, "the overlay sets no tag for canopy")
        #expect(!tag.isEmpty && tag != "latest", "canopy:\(tag)")
        // Replicas of the base's replicated Deployments: never of a broker (two live ones, a pod
        // each) or of one an autoscaler sets.
        for entry in Self.dictionaries(overlay["replicas"]) {
            let name = try #require(entry["name"] as? String)
            #expect(objects.keys.contains("Deployment/\(name)"), "the overlay scales \(name), which the base has not")
            #expect(!objects.keys.contains("HorizontalPodAutoscaler/\(name)") && !name.hasPrefix("broker"), "the overlay scales \(name)")
            #expect((entry["count"] as? Int ?? 0) >= 2, "\(name)")
        }
        // Its patches change objects the base has.
        for patch in Self.dictionaries(overlay["patches"]) {
            let path = try #require(patch["path"] as? String)
            let object = try Self.load("overlays/production/\(path)")
            let kind = object["kind"] as? String ?? ""
            let name = Self.dictionary(object["metadata"])["name"] as? String ?? ""
            #expect(objects.keys.contains("\(kind)/\(name)"), "\(path) patches \(kind)/\(name), which the base has not")
        }
        // Its Secrets come from files scripts/compose-secrets makes, in a secrets/ directory git
        // ignores; PostgreSQL's URL names the user canopy and no password.
        let composeSecrets = try #require(try ComposeFileTests.compose()["secrets"] as? [String: [String: String]])
        let composeFiles = Set(composeSecrets.values.compactMap { $0["file"] })
        for generator in Self.dictionaries(overlay["secretGenerator"]) {
            for file in generator["files"] as? [String] ?? [] {
                let path = String(file.split(separator: "=").last ?? "")
                #expect(path.hasPrefix("secrets/") && composeFiles.contains("./" + path), "\(path) is not a file scripts/compose-secrets makes")
            }
        }
        let ignored = try String(contentsOf: ComposeFileTests.root.appendingPathComponent(".gitignore"), encoding: .utf8)
        #expect(ignored.split(separator: "\n").contains("secrets/"), "git must ignore every secrets/ directory")
        let database = try #require(
            Self.dictionaries(overlay["secretGenerator"]).first { $0["name"] as? String == "canopy-database" }, "the overlay makes no canopy-database")
        let url = try #require((database["literals"] as? [String] ?? []).first { $0.hasPrefix("url=") }, "canopy-database has no url")
        #expect(url.hasPrefix("url=postgres://canopy@"), "\(url)")
    }
}
