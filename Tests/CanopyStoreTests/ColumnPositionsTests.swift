import CanopyStore
import CanopyTesting
import GRDB
import Logging
import PostgresNIO
import Testing

/// ``ColumnPositions``: a query's columns found by name once, on either store.
struct ColumnPositionsTests {
    enum PlantColumn: Int, CaseIterable {
        case id, scientificName
    }

    enum Missing: Int, CaseIterable {
        case id, family
    }

    @Test func sqliteColumnsAreFoundByNameWhateverTheirCaseAndAMissingOneIsAnErrorThatNamesIt() throws {
        let queue = try DatabaseQueue()
        try queue.write { db in
            try db.execute(sql: "CREATE TABLE plants (scientificName TEXT, id TEXT); INSERT INTO plants VALUES ('Monstera deliciosa', 'p-1')")
            let statement = try db.makeStatement(sql: "SELECT * FROM plants")
            #expect(try statement.position(of: "SCIENTIFICNAME") == 0)
            let columns = try ColumnPositions<PlantColumn>(statement)
            let row = try #require(try Row.fetchOne(statement))
            #expect(row[columns[.id]] == "p-1" && row[columns[.scientificName]] == "Monstera deliciosa")
            #expect {
                try ColumnPositions<Missing>(statement)
            } throws: { error in
                "\(error)".contains("the query's rows have no column family (they have scientificName, id)")
            }
        }
    }

    @Test func postgresColumnsAreFoundByNameAsPostgreSQLFoldsThemAndAMissingOneIsAnErrorThatNamesIt() async throws {
        let logger = Logger(label: "canopy-test-columns")
        let url = try await PostgresServer.shared().database()
        // A connection must be closed before it goes (postgres-nio asserts it), also on failure.
        let connection = try await PostgresConnection.connect(configuration: try url.connectionConfiguration(), id: 1, logger: logger)
        var rows: [PostgresRandomAccessRow] = []
        do {
            for try await row in try await connection.query("SELECT 'Monstera deliciosa' AS scientificName, 'p-1' AS id", logger: logger) {
                rows.append(row.makeRandomAccess())
            }
            try await connection.close()
        } catch {
            try? await connection.close()
            throw error
        }
        let row = try #require(rows.first)
        #expect(ColumnPositions<PlantColumn>.list == "id, scientificName")
        let columns = try ColumnPositions<PlantColumn>(row)
        #expect(try row[columns[.id]].decode(String.self) == "p-1")
        #expect(try row[columns[.scientificName]].decode(String.self) == "Monstera deliciosa")
        #expect {
            try ColumnPositions<Missing>(row)
        } throws: { error in
            "\(error)".contains("the query's rows have no column family (they have scientificname, id)")
        }
    }
}
