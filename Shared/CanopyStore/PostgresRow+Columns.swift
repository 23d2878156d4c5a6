import PostgresNIO

extension PostgresRandomAccessRow {
    /// The cell of the column a query selected as `name`, as the SQLite stores read theirs
    /// (GRDB's `row["plantID"]`): by name, never by position, so a row reads the same however
    /// the query orders its columns. PostgreSQL folds unquoted names to lower case, and so
    /// does this lookup; a name the query did not select is an error that says so, never a
    /// crash (postgres-nio's own subscript stops the process).
    public func column(_ name: String) throws -> PostgresCell {
        let folded = name.lowercased()
        guard contains(folded) else {
            throw PostgresStore.Failure(description: "the query's rows have no column \(name) (they have \(map(\.columnName).joined(separator: ", ")))")
        }
        return self[folded]
    }
}
