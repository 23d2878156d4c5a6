import CanopyBus
import CanopyMessages
import CanopyTesting
import Foundation
import Testing
@testable import CareScheduling

/// `canopy-care` as an operator runs it.
@Suite(.serialized)
struct CareCommandLineTests {
    func run(_ arguments: [String], environment: [String: String] = [:]) throws -> ProcessResult {
        try runExecutable("canopy-care", arguments, environment: environment)
    }

    @Test func catalogSearchPrintsAnAlignedTable() throws {
        let result = try run(["catalog", "search", "swiss cheese"])
        #expect(result.status == 0)
        let lines = result.output.split(separator: "\n")
        #expect(lines.first?.hasPrefix("SCIENTIFIC NAME     COMMON NAME") == true)
        #expect(lines.contains { $0.hasPrefix("Monstera deliciosa  Swiss cheese plant  Araceae") })
        #expect(try run(["catalog", "search", "xyzabc123"]).output.contains("no species matches"))
    }

    @Test func planPrintsTasksAtTheLocalTimeInTheGivenZone() throws {
        let result = try run(["plan", "--species", "Monstera deliciosa", "--days", "30", "--tz", "Europe/Berlin", "--time", "08:15"])
        #expect(result.status == 0, "\(result.errors)")
        let rows = result.output.split(separator: "\n").dropFirst(2)
        #expect(!rows.isEmpty)
        #expect(rows.allSatisfy { $0.contains("8:15") })
        #expect(rows.contains { $0.contains("water") })
        let bad = try run(["plan", "--species", "Monstera deliciosa", "--tz", "Nowhere/Land"])
        #expect(bad.status != 0 && bad.errors.contains("not an IANA time zone"))
    }

    @Test func upcomingAsksTheRunningService() async throws {
        try await CareServiceTests().withCare { bus, client, _, _ in
            _ = try await client.call(Care.AddPlant.self, Care.Plant(scientificName: "Nephrolepis exaltata", customName: "Fern"), principal: "user-42")
            let result = try run(["upcoming", "--user", "user-42", "--days", "14", "--endpoint", bus.endpoint])
            #expect(result.status == 0, "\(result.errors)")
            #expect(result.output.contains("Water Fern"))
            #expect(!(try run(["upcoming", "--user", "someone-else", "--endpoint", bus.endpoint]).output.contains("Fern")))
        }
    }
}
