import GRDB
import PostgresNIO

extension Statement {
    /// Where column `name` is in this statement's rows (SQLite's names are case-insensitive),
    /// or an error that names it. A query that reads many rows looks its columns up once
    /// with this and reads each cell by position: GRDB's `row["name"]` lowercases and hashes
    /// the name for every cell (8% of canopy-care's CPU in its benchmark, listing 500 plants).
    public func position(of name: String) throws -> Int {
        let folded = name.lowercased()
        guard let index = columnNames.firstIndex(where: { $0.lowercased() == folded }) else {
            throw DatabaseError(message: "the query's rows have no column \(name) (they have \(columnNames.joined(separator: ", ")))")
        }
        return index
    }
}

/// Where each column `Column` names is in a query's rows, looked up once a query: `row[columns[.id]]`
/// reads a cell by its position, where reading it by name looks the name up for every cell. The
/// cases are the columns' names (as SQL has them, any case), numbered from 0 in order.
public struct ColumnPositions<Column: RawRepresentable & CaseIterable> where Column.RawValue == Int {
    private let positions: [Int]

    /// The positions in an SQLite statement's rows (``GRDB/Statement/position(of:)``).
    public init(_ statement: Statement) throws {
        positions = try Column.allCases.map { try statement.position(of: "\($0)") }
    }

    /// The positions in a PostgreSQL query's rows, from one of them (every row of a query has
    /// the same columns): PostgreSQL folds unquoted names to lower case, and so does this.
    public init(_ row: PostgresRandomAccessRow) throws {
        let names = row.map { $0.columnName.lowercased() }
        positions = try Column.allCases.map { column in
            guard let position = names.firstIndex(of: "\(column)".lowercased()) else {
                throw PostgresStore.Failure(description: "the query's rows have no column \(column) (they have \(names.joined(separator: ", ")))")
            }
            return position
        }
    }

    public subscript(_ column: Column) -> Int { positions[column.rawValue] }

    /// The columns, by name, as a query selects them (`SELECT \(list) FROM …`).
    public static var list: String { Column.allCases.map { "\($0)" }.joined(separator: ", ") }
}
