import CanopyBus
import CanopyCapture
import CanopyMessages
import CanopyTesting
import Foundation
import GRDB
import Logging
import Testing

/// Replay as a person uses it on real traffic: a stack started with `canopy up`, a capture
/// begun with `canopy capture start` (a snapshot of the stores at its cut, by default) while
/// the stack is under load, `canopy demo` run, the capture stopped, then `canopy replay
/// --fresh` on throwaway stacks started from the snapshot.
@Suite(.serialized)
struct ReplayFreshTests {
    /// People adding plants as fast as the stack takes them, until told to stop: how many
    /// each person's adds were answered.
    final class Load: @unchecked Sendable {
        private let lock = NSLock()
        private var stopped = false
        private var count = 0
        var isStopped: Bool { lock.withLock { stopped } }
        func stop() { lock.withLock { stopped = true } }
        /// Adds answered so far, by everyone.
        var answered: Int { lock.withLock { count } }
        func add() { lock.withLock { count += 1 } }
    }

    /// Starts a stack with `canopy up` in a new data directory: its arguments, broker and API.
    static func up() async throws -> (stack: [String], data: String, broker: String, http: String) {
        let data = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-replay-\(UUID().uuidString)").path
        let stack = ["--data-dir", data]
        let broker = "tcp://127.0.0.1:\(FreePorts.any())", http = "127.0.0.1:\(FreePorts.any())"
        let up = try await runExecutable(
            "canopy", ["up", "--detach", "--broker", broker, "--http", http, "--metrics-base", "\(FreePorts.run(of: 5))"] + stack,
            limit: 240)
        if up.status != 0 {
            _ = try? CanopyUpTests.runDown(stack)
            try? FileManager.default.removeItem(atPath: data)
            Issue.record("canopy up failed: \(up.output) \(up.errors)")
            throw CancellationError()
        }
        return (stack, data, broker, http)
    }

    /// Stops the stack and removes its directory.
    static func down(_ stack: [String], _ data: String) {
        _ = try? CanopyUpTests.runDown(stack)
        try? FileManager.default.removeItem(atPath: data)
    }

    @Test func aSnapshotTakenUnderLoadIsConsistentWithItsCapture() async throws {
        let (stack, data, broker, _) = try await Self.up()
        defer { Self.down(stack, data) }
        // Four people adding plants as fast as the stack takes them.
        let load = Load()
        let people = (1...4).map { "load-\($0)" }
        let adders = people.map { person in
            Task {
                var configuration = BusClient.Configuration(endpoint: broker)
                configuration.defaultTimeout = .seconds(20)
                configuration.curve = try stackOperatorCurve(data: data)
                let client = try BusClient(configuration: configuration, context: ZMQContext(), logger: Logger(label: "load"))
                defer { client.close() }
                var answered = 0
                while !load.isStopped {
                    _ = try await client.call(Care.AddPlant.self, Care.Plant(scientificName: "Monstera deliciosa", customName: "load"), principal: person)
                    answered += 1
                    load.add()
                }
                return answered
            }
        }
        // The cut falls inside the load: adds answered before it, and after it.
        #expect(try await eventually(within: .seconds(60)) { load.answered >= 40 })
        let start = try await runExecutable("canopy", ["capture", "start", "busy", "--endpoint", broker] + stack, limit: 60)
        let atStart = load.answered
        #expect(try await eventually(within: .seconds(60)) { load.answered >= atStart + 40 })
        load.stop()
        var answeredAdds = 0
        for adder in adders { answeredAdds += try await adder.value }
        let stop = try await runExecutable("canopy", ["capture", "stop", "--endpoint", broker] + stack, limit: 60)
        try #require(start.status == 0, "\(start.output) \(start.errors)")
        try #require(stop.status == 0, "\(stop.output) \(stop.errors)")
        #expect(start.output.contains("snapshot at the cut") && start.output.contains("care/care.sqlite"), "\(start.output)")

        // Every plant is in the snapshot or added by a captured request: none in both, none in neither.
        let capture = data + "/busy"
        var capturedAdds: [String: Int] = [:]
        let reader = try CaptureReader(paths: [capture])
        var marks = 0
        // Answered adds whose request the capture holds (a request answered after the capture
        // began but taken before the cut has its answer recorded, not its request: the
        // snapshot holds its plant, and replay leaves such answers out).
        var requested = Set<[UInt8]>()
        while let record = try reader.next() {
            if record.kind == .mark { marks += 1 }
            guard record.service == "care", record.operation == "plants.add" else { continue }
            let key = Array(record.client.utf8) + [0] + record.correlation
            if record.kind == .request { requested.insert(key) }
            if record.kind == .reply, !record.flags.contains(.failed), requested.remove(key) != nil {
                capturedAdds[record.header.principal, default: 0] += 1
            }
        }
        #expect(marks == 1)
        let snapshotCounts = try Self.plantCounts(capture + ".snapshot/care/care.sqlite")
        let liveCounts = try Self.plantCounts(data + "/care/care.sqlite")
        for person in people {
            #expect(
                (snapshotCounts[person] ?? 0) + (capturedAdds[person] ?? 0) == liveCounts[person] ?? 0,
                "\(person): \(snapshotCounts[person] ?? 0) in the snapshot + \(capturedAdds[person] ?? 0) captured vs \(liveCounts[person] ?? 0) live")
        }
        #expect(liveCounts.filter { $0.key.hasPrefix("load-") }.values.reduce(0, +) == answeredAdds)
        #expect(
            people.contains { (snapshotCounts[$0] ?? 0) > 0 } && people.contains { (capturedAdds[$0] ?? 0) > 0 },
            "the cut fell inside the load: \(snapshotCounts) \(capturedAdds)")

        // Replayed fresh, each add answers as it did (the snapshot holds what came before).
        let replay = try await runExecutable("canopy", ["replay", capture, "--fresh"], limit: 180)
        #expect(replay.status == 0 && replay.output.contains("every answer matched"), "\(replay.output) \(replay.errors)")
    }

    @Test func aCaptureOfTheDemoReplaysFreshWithNoDifferenceAndAChangedCatalogShowsOnlyWhatItAffects() async throws {
        let (stack, data, broker, http) = try await Self.up()
        defer { Self.down(stack, data) }
        let start = try await runExecutable("canopy", ["capture", "start", "journey", "--endpoint", broker] + stack, limit: 60)
        try #require(start.status == 0, "\(start.output) \(start.errors)")
        let demo = try await runExecutable("canopy", ["demo", "--http", http, "--reminder-seconds", "2"] + stack, limit: 120)
        let stop = try await runExecutable("canopy", ["capture", "stop", "--endpoint", broker] + stack, limit: 60)
        try #require(demo.status == 0, "\(demo.output) \(demo.errors)\n\(CanopyUpTests.logTails(data, ["remind", "care", "identify"]))")
        try #require(stop.status == 0, "\(stop.output) \(stop.errors)")
        let capture = data + "/journey"

        // Replayed fresh: nothing differs; the times that moved are named.
        let replay = try await runExecutable("canopy", ["replay", capture, "--fresh"], limit: 180)
        #expect(replay.status == 0 && replay.output.contains("every answer matched"), "\(replay.output) \(replay.errors)")
        // (Which of them moved depends on the milliseconds: one replayed at the very millisecond
        // it was captured, relative to the clock's start, matches outright.)
        #expect(
            replay.output.contains("compared as times")
                && ["$.plant.dateAdded", "$.createdAt", "$.identification.createdAt", "$.registeredAt"].contains { replay.output.contains($0) },
            "\(replay.output)")

        // Against the same build: no difference between the two.
        let executables = try LiveBus.executable("canopy").deletingLastPathComponent().path
        let same = try await runExecutable("canopy", ["replay", capture, "--fresh", "--compare-with", executables], limit: 240)
        #expect(same.status == 0 && same.output.contains("every answer matched"), "\(same.output) \(same.errors)")

        // Against a build whose catalog waters Ficus every 5 days instead of 8: only the answers
        // about the demo's Ficus differ (its profile, its tasks, its reminders).
        let other = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-other-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: other) }
        try Self.buildWithCatalogChange(at: other, from: executables)
        let changed = try await runExecutable("canopy", ["replay", capture, "--fresh", "--compare-with", other.path, "--json"], limit: 240)
        #expect(changed.status == 1, "\(changed.errors)")
        let report = try JSONDecoder().decode(Comparison.self, from: Data(changed.output.utf8))
        #expect(report.thisBuild.differed == 0 && report.thisBuild.failed == 0)
        let places = Set(report.otherBuild.differingPaths.keys)
        #expect(places.contains("identify.identifications.accept $.plant.profile.wateringIntervalDays"), "\(places)")
        let operations = Set(places.map { String($0.split(separator: " ")[0]) })
        #expect(
            operations.isSubset(of: [
                "identify.identifications.accept", "care.tasks.upcoming", "care.tasks.next", "care.tasks.snooze",
                "care.tasks.complete", "remind.reminders.pending",
            ]), "\(operations)")
        #expect(places.allSatisfy { !$0.hasSuffix(".name") && !$0.contains("photos") && !$0.contains("devices") }, "\(places)")
        #expect(report.otherBuild.matched > 0 && report.otherBuild.failed == 0)
    }

    @Test func aPseudonymizedCaptureNamesPeopleTheSameWayInItsSnapshotAndReplaysFresh() async throws {
        let (stack, data, broker, _) = try await Self.up()
        defer { Self.down(stack, data) }
        var configuration = BusClient.Configuration(endpoint: broker)
        configuration.curve = try stackOperatorCurve(data: data)
        let client = try BusClient(configuration: configuration, context: ZMQContext(), logger: Logger(label: "test"))
        defer { client.close() }
        let before = try await client.call(Care.AddPlant.self, Care.Plant(scientificName: "Ficus lyrata", customName: "Fig"), principal: "alice@example.org")

        let start = try await runExecutable("canopy", ["capture", "start", "private", "--pseudonymize", "--endpoint", broker] + stack, limit: 60)
        try #require(start.status == 0, "\(start.output) \(start.errors)")
        _ = try await client.call(Care.AddPlant.self, Care.Plant(scientificName: "Monstera deliciosa", customName: "Monty"), principal: "alice@example.org")
        let listed = try await client.call(Care.ListPlants.self, .init(), principal: "alice@example.org")
        #expect(listed.plants.count == 2)
        _ = try await client.call(Care.GetPlant.self, .init(id: before.id), principal: "alice@example.org")
        #expect(try await runExecutable("canopy", ["capture", "stop", "--endpoint", broker] + stack, limit: 60).status == 0)

        let capture = data + "/private"
        let reader = try CaptureReader(paths: [capture])
        var principals = Set<String>()
        while let record = try reader.next() {
            if record.kind == .request { principals.insert(record.header.principal) }
        }
        #expect(principals.count == 1 && principals.first?.hasPrefix("p-") == true, "\(principals)")
        let owners = try Self.plantCounts(capture + ".snapshot/care/care.sqlite")
        #expect(owners == [principals.first!: 1], "the snapshot's plant belongs to the same pseudonym: \(owners)")
        let stores = try String(contentsOfFile: capture + ".snapshot/snapshot.json", encoding: .utf8)
        #expect(stores.contains("\"pseudonymized\" : true"))

        let replay = try await runExecutable("canopy", ["replay", capture, "--fresh"], limit: 180)
        #expect(replay.status == 0 && replay.output.contains("every answer matched"), "\(replay.output) \(replay.errors)")
    }

    struct Comparison: Decodable {
        struct Report: Decodable {
            var matched: Int
            var differed: Int
            var failed: Int
            var differingPaths: [String: Int]
        }
        var thisBuild: Report
        var otherBuild: Report
    }

    /// Plants per owner in a care store.
    static func plantCounts(_ path: String) throws -> [String: Int] {
        let database = try DatabaseQueue(path: path)
        defer { try? database.close() }
        return try database.read { db in
            Dictionary(
                uniqueKeysWithValues: try Row.fetchAll(db, sql: "SELECT owner, COUNT(*) AS n FROM plants GROUP BY owner").map {
                    ($0["owner"] as String, $0["n"] as Int)
                })
        }
    }

    /// "Another build": this one's executables, with canopy-care on a catalog where Ficus
    /// lyrata (the genus the demo's made-up Ficus falls back to) is watered every 5 days.
    static func buildWithCatalogChange(at directory: URL, from executables: String) throws {
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let care = URL(fileURLWithPath: executables).appendingPathComponent("canopy-care")
        let catalogURL = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../Services/Care/Core/Resources/catalog.json")
        var catalog = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: catalogURL)) as? [String: Any])
        var species = try #require(catalog["species"] as? [[String: Any]])
        let index = try #require(species.firstIndex { $0["scientificName"] as? String == "Ficus lyrata" })
        var profile = try #require(species[index]["profile"] as? [String: Any])
        profile["wateringIntervalDays"] = 5
        species[index]["profile"] = profile
        catalog["species"] = species
        let changed = directory.appendingPathComponent("catalog.json")
        try JSONSerialization.data(withJSONObject: catalog).write(to: changed)
        for name in ["canopy-broker", "canopy-images", "canopy-identify", "canopy-remind", "canopy-api"] {
            try FileManager.default.createSymbolicLink(atPath: directory.appendingPathComponent(name).path, withDestinationPath: executables + "/" + name)
        }
        let wrapper = directory.appendingPathComponent("canopy-care")
        try "#!/bin/sh\nCANOPY_CATALOG='\(changed.path)' exec '\(care.path)' \"$@\"\n".write(to: wrapper, atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: wrapper.path)
    }
}
