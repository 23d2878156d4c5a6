/// An aligned text table for CLI listings: left-aligned text, right-aligned numbers.
public struct Table {
    private let headers: [String]
    private var rows: [[String]] = []

    /// A table with these column headers.
    public init(_ headers: String...) {
        self.headers = headers
    }

    /// A table with these column headers (a list made at run time).
    public init(headers: [String]) {
        self.headers = headers
    }

    /// Adds a row; it must have one cell per header.
    public mutating func append(_ cells: [String]) {
        precondition(cells.count == headers.count, "a row has \(cells.count) cells for \(headers.count) columns")
        rows.append(cells)
    }

    /// The table as lines, headers first, columns two spaces apart.
    public func render() -> String {
        let all = [headers] + rows
        let widths = headers.indices.map { column in all.map { $0[column].count }.max() ?? 0 }
        let numeric = headers.indices.map { column in
            !rows.isEmpty && rows.allSatisfy { Double($0[column]) != nil }
        }
        func line(_ cells: [String]) -> String {
            cells.indices.map { column in
                let padding = String(repeating: " ", count: widths[column] - cells[column].count)
                return numeric[column] ? padding + cells[column] : cells[column] + padding
            }.joined(separator: "  ").replacing(/\s+$/, with: "")
        }
        return all.map(line).joined(separator: "\n")
    }
}
