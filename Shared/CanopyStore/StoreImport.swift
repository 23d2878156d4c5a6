import Crypto
import Foundation
import GRDB
import Logging
import PostgresNIO

/// How one service's SQLite store moves into PostgreSQL (`canopy migrate`): its PostgreSQL
/// schema and its tables, parents before the tables that refer to them.
public struct StoreImport: Sendable {
    /// One table to copy: its name, the columns that order its rows, and whether the target's
    /// migrations already seed it.
    public struct Table: Sendable {
        public let name: String
        /// Columns that order its rows completely (its primary key); empty for every column
        /// in common (a table without a key: its identical rows are interchangeable).
        public let key: [String]
        /// Whether the schema's migrations put rows in it (settings such as a generation
        /// counter): its rows do not make a database count as holding data.
        public let seeded: Bool

        public init(_ name: String, key: [String] = [], seeded: Bool = false) {
            self.name = name
            self.key = key
            self.seeded = seeded
        }
    }

    /// The store's name (`care`, `remind`, `identify`, `images`).
    public let store: String
    public let migrator: PostgresMigrator
    public let tables: [Table]

    public init(store: String, migrator: PostgresMigrator, tables: [Table]) {
        self.store = store
        self.migrator = migrator
        self.tables = tables
    }

    /// What an import found and did for one table.
    public struct TableReport: Sendable, Equatable {
        public var table: String
        public var rows: Int
        /// SHA-256 over every row in order, each value typed as PostgreSQL keeps it: the same
        /// on both sides once the copy is complete and exact.
        public var checksum: String
    }

    /// What an import did.
    public struct Report: Sendable {
        /// Whether the store was copied now or had been copied before, unchanged.
        public enum Outcome: String, Sendable {
            /// Copied, counted and checked.
            case imported
            /// This source was imported before and nothing changed on either side.
            case unchanged
        }
        public var outcome: Outcome
        public var tables: [TableReport]
    }

    /// A database that already holds this store's data from elsewhere, or a copy whose
    /// checksums do not match, with a sentence.
    public struct Refused: Error, CustomStringConvertible {
        public let description: String
    }

    /// What the target database holds of this store, as an import must find it.
    public enum Target: Sendable, Equatable {
        /// None of its rows (its tables absent, or empty): an import may fill it.
        case empty
        /// This install's import, unchanged since (the checksum it recorded).
        case imported(from: String, at: String)
    }

    /// Decides, before anything is written, whether this store may be imported into the
    /// database `target` connects to (``PostgresStore/inspect(url:logger:)``, which changes
    /// nothing): it may when the store's tables there are absent or empty, or hold exactly
    /// what an import of this same install (`install`) left there. Anything else is
    /// ``Refused`` with a sentence naming what was found. `path` is the source store, checked
    /// first (``StoreFile/check(path:store:tables:)``).
    public func check(from path: String, into target: PostgresStore, install: String) throws -> Target {
        let sqlite = try openSource(path)
        defer { try? sqlite.close() }
        return try target.read { session in
            let present = try tables.filter { table in
                try session.value(Bool.self, "SELECT to_regclass(\(table.name.lowercased())) IS NOT NULL") ?? false
            }
            guard !present.isEmpty else { return .empty }
            guard present.count == tables.count else {
                // Part of the schema, as a migrate killed between two migrations leaves it (or
                // an older Canopy's): empty, the import's migrator finishes it.
                let rows = try present.filter { !$0.seeded }.reduce(0) { total, table in
                    total + (try session.value(Int.self, PostgresQuery(unsafeSQL: "SELECT COUNT(*)::BIGINT FROM \(table.name)")) ?? 0)
                }
                guard rows > 0 else { return .empty }
                throw Refused(
                    description:
                        "the \(store) store in \(target.url) holds \(rows) rows in part of its tables (\(present.map(\.name).joined(separator: ", ")) of \(tables.map(\.name).joined(separator: ", "))); migrate into an empty database, or drop those tables first"
                )
            }
            let shapes = try tables.map { try shape($0, sqlite: sqlite, session: session) }
            return try decide(shapes: shapes, session: session, install: install, url: target.url)
        }
    }

    /// The stores the database `target` connects to records as imported from an install other
    /// than `install`, each as a sentence (empty when none): a database is one install's.
    public static func foreignImports(in target: PostgresStore, install: String) throws -> [String] {
        try target.read { session in
            guard try session.value(Bool.self, "SELECT to_regclass('canopy_imports') IS NOT NULL") ?? false else { return [] }
            return try session.rows(
                "SELECT store, to_jsonb(i)->>'install' AS install, source, importedAt::TEXT AS importedAt FROM canopy_imports i ORDER BY store"
            ).compactMap { row in
                let (store, other, source, at) = (
                    try row.column("store").decode(String.self), try row.column("install").decode(String?.self), try row.column("source").decode(String.self),
                    try row.column("importedAt").decode(String.self)
                )
                guard other != install else { return nil }
                let whose = other.map { "another install (\($0.prefix(8))…)" } ?? "an install from before install ids"
                return "the \(store) store in \(target.url) was migrated from \(whose), from \(source) at \(at); a database is one install's"
            }
        }
    }

    /// Whether the target's tables (`shapes`) may take this install's import: empty, or left
    /// by this install's own import and unchanged since; else ``Refused``.
    private func decide(shapes: [Shape], session: PostgresSession, install: String, url: DatabaseURL) throws -> Target {
        let reports = try shapes.map { try summary(of: $0, in: session) }
        if zip(shapes, reports).allSatisfy({ shape, report in shape.table.seeded || report.rows == 0 }) { return .empty }
        let record = try Self.record(of: [store] + migrator.formerNames, in: session)
        guard let record else {
            throw Refused(
                description:
                    "the \(store) store in \(url) already holds \(Self.rows(reports)) that canopy migrate did not put there; migrate into an empty database, or drop its tables first"
            )
        }
        guard record.install == install else {
            let whose = record.install.map { "another install (\($0.prefix(8))…)" } ?? "an install from before install ids"
            throw Refused(
                description:
                    "the \(store) store in \(url) holds \(Self.rows(reports)) migrated from \(whose), from \(record.source) at \(record.at); this is install \(install.prefix(8))…, so nothing was changed. Migrate into a database of its own"
            )
        }
        guard Self.combined(reports) == record.targetChecksum else {
            throw Refused(
                description:
                    "the \(store) store in \(url) was migrated from here at \(record.at) and changed since (a stack ran on it), so migrating again would lose that; nothing was changed"
            )
        }
        return .imported(from: record.source, at: record.at)
    }

    /// What `canopy_imports` recorded of `store`'s last import, if the table and the row exist.
    /// `names`: the store's name, then its former ones (a database not migrated since the rename).
    private static func record(of names: [String], in session: PostgresSession) throws -> (
        source: String, install: String?, sourceChecksum: String, targetChecksum: String, at: String
    )? {
        guard try session.value(Bool.self, "SELECT to_regclass('canopy_imports') IS NOT NULL") ?? false else { return nil }
        // As JSON: a record an older canopy migrate wrote has no install column.
        guard
            let text = try session.value(
                String.self,
                """
                SELECT to_jsonb(i)::text FROM canopy_imports i WHERE store = ANY(\(names)) ORDER BY store = \(names[0]) DESC LIMIT 1
                """),
            let row = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
        else { return nil }
        return (
            row["source"] as? String ?? "?", row["install"] as? String, row["sourcechecksum"] as? String ?? "", row["targetchecksum"] as? String ?? "",
            row["importedat"] as? String ?? "?"
        )
    }

    private static func rows(_ reports: [TableReport]) -> String {
        let total = reports.reduce(0) { $0 + $1.rows }
        return "\(total) row\(total == 1 ? "" : "s")"
    }

    /// Copies the SQLite store at `path` (a stopped store or a backup's copy: nothing writes
    /// it meanwhile) into the database `url` names, in one transaction: every table emptied,
    /// filled, its sequences moved past the ids copied, then counted and checksummed against
    /// the source before anything commits, and the import recorded with `install`. Running it
    /// again with the same source changes nothing; with a newer copy of the same install it
    /// imports again, as long as nobody changed the PostgreSQL copy since; a database with this
    /// store's data from anywhere else is refused (``check(from:into:install:)`` says so
    /// before anything is written; this decides again inside the transaction).
    public func run(
        from path: String, into url: DatabaseURL, source: String, install: String, logger: Logger,
        progress: @escaping (_ table: String, _ done: Int, _ total: Int) -> Void = { _, _, _ in }
    ) async throws -> Report {
        let sqlite = try openSource(path)
        defer { try? sqlite.close() }
        let target = try await PostgresStore.open(url: url, migrator: migrator, size: 1, logger: logger)
        defer { target.close() }
        return try target.write(isolation: .readCommitted) { session in
            // One import of this store at a time, and the record of the last one.
            try session.execute("SELECT pg_advisory_xact_lock(hashtext('canopy_import:' || \(store)))")
            try session.execute(
                """
                CREATE TABLE IF NOT EXISTS canopy_imports (
                    store TEXT PRIMARY KEY, source TEXT NOT NULL, sourceChecksum TEXT NOT NULL, targetChecksum TEXT NOT NULL, importedAt TIMESTAMPTZ NOT NULL)
                """)
            try session.execute("ALTER TABLE canopy_imports ADD COLUMN IF NOT EXISTS install TEXT")
            // Nobody writes the tables between the decision and the copy (a stack running on them).
            try session.execute(PostgresQuery(unsafeSQL: "LOCK TABLE \(tables.map(\.name).joined(separator: ", ")) IN SHARE ROW EXCLUSIVE MODE"))
            let shapes = try tables.map { try shape($0, sqlite: sqlite, session: session) }
            let sourceReports = try shapes.map { shape in try sqlite.read { db in try summary(of: shape, in: db) } }
            let sourceChecksum = Self.combined(sourceReports)
            _ = try decide(shapes: shapes, session: session, install: install, url: url) // refuses what is not this install's
            let targetReports = try shapes.map { try summary(of: $0, in: session) }
            if let record = try Self.record(of: [store] + migrator.formerNames, in: session), record.install == install,
                record.sourceChecksum == sourceChecksum,
                record.targetChecksum == Self.combined(targetReports)
            {
                return Report(outcome: .unchanged, tables: targetReports)
            }
            try session.execute(PostgresQuery(unsafeSQL: "TRUNCATE \(shapes.map(\.table.name).joined(separator: ", ")) RESTART IDENTITY CASCADE"))
            for shape in shapes {
                try copy(shape, from: sqlite, into: session) { progress("\(store).\(shape.table.name)", $0, shape.sourceRows) }
                if shape.columns.contains(where: { $0.name.lowercased() == "id" && $0.type == .bigint }) {
                    try session.execute(
                        PostgresQuery(
                            unsafeSQL: """
                                SELECT setval(pg_get_serial_sequence('\(shape.table.name.lowercased())', 'id'), GREATEST(COALESCE(MAX(id), 0), 1), MAX(id) IS NOT NULL)
                                FROM \(shape.table.name)
                                """))
                }
            }
            let copied = try shapes.map { try summary(of: $0, in: session) }
            for (wanted, got) in zip(sourceReports, copied) where wanted != got {
                throw Refused(
                    description:
                        "\(store).\(wanted.table) did not copy exactly (\(wanted.rows) rows, \(got.rows) copied, checksums \(wanted.checksum.prefix(12)) and \(got.checksum.prefix(12))); nothing was imported"
                )
            }
            try session.execute(
                """
                INSERT INTO canopy_imports (store, source, sourceChecksum, targetChecksum, importedAt, install)
                VALUES (\(store), \(source), \(sourceChecksum), \(Self.combined(copied)), now(), \(install))
                ON CONFLICT (store) DO UPDATE SET source = excluded.source, sourceChecksum = excluded.sourceChecksum,
                    targetChecksum = excluded.targetChecksum, importedAt = excluded.importedAt, install = excluded.install
                """)
            return Report(outcome: .imported, tables: copied)
        }
    }

    /// The source store, read-only, once ``StoreFile/check(path:store:tables:)`` has found it is this store's.
    private func openSource(_ path: String) throws -> DatabaseQueue {
        try StoreFile.check(path: path, store: store, tables: tables.map(\.name))
        var configuration = Configuration()
        configuration.readonly = true
        return try DatabaseQueue(path: path, configuration: configuration)
    }

    static func combined(_ reports: [TableReport]) -> String {
        var hash = SHA256()
        for report in reports { hash.update(data: Data("\(report.table)=\(report.rows):\(report.checksum);".utf8)) }
        return hash.finalize().map { String(format: "%02x", $0) }.joined()
    }

    // MARK: - Tables

    /// A column as both sides have it, typed as PostgreSQL keeps it.
    struct Column {
        enum Kind { case text, bytea, boolean, integer, bigint, double }
        var name: String
        var type: Kind
    }

    /// A table's columns in common, its order, and how many rows the source has.
    struct Shape {
        var table: Table
        var columns: [Column]
        var order: [Column]
        var sourceRows: Int
    }

    private func shape(_ table: Table, sqlite: DatabaseQueue, session: PostgresSession) throws -> Shape {
        let (sourceColumns, sourceRows) = try sqlite.read { db -> ([String], Int) in
            let columns = try Row.fetchAll(db, sql: "PRAGMA table_info(\(table.name))").map { $0["name"] as String }
            return (columns, columns.isEmpty ? 0 : try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM \(table.name)") ?? 0)
        }
        guard !sourceColumns.isEmpty else { throw Refused(description: "the \(store) store has no table \(table.name); is it a Canopy data directory?") }
        var targetTypes: [String: Column.Kind] = [:]
        for row in try session.rows(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = \(table.name.lowercased())")
        {
            let type: Column.Kind? =
                switch try row.column("data_type").decode(String.self) {
                case "text": .text
                case "bytea": .bytea
                case "boolean": .boolean
                case "integer", "smallint": .integer
                case "bigint": .bigint
                case "double precision", "real": .double
                default: nil
                }
            if let type { targetTypes[try row.column("column_name").decode(String.self)] = type }
        }
        let columns = sourceColumns.compactMap { name in targetTypes[name.lowercased()].map { Column(name: name, type: $0) } }
        let order = table.key.isEmpty ? columns : table.key.compactMap { key in columns.first { $0.name.lowercased() == key.lowercased() } }
        return Shape(table: table, columns: columns, order: order, sourceRows: sourceRows)
    }

    /// `ORDER BY` the same on both sides: text by its bytes (SQLite's BINARY, PostgreSQL's "C").
    private static func orderBy(_ shape: Shape, postgres: Bool) -> String {
        shape.order.map { postgres && $0.type == .text ? "\($0.name) COLLATE \"C\"" : $0.name }.joined(separator: ", ")
    }

    // MARK: - Values

    /// A value as PostgreSQL keeps it in the column.
    enum Value {
        case null, text(String), bytes(Data), boolean(Bool), integer(Int64), double(Double)

        /// The source's value as the target column keeps it.
        init(_ value: DatabaseValue, as type: Column.Kind) throws {
            switch (value.storage, type) {
            case (.null, _): self = .null
            case (.string(let text), .text): self = .text(text)
            case (.string(let text), .bytea): self = .bytes(Data(text.utf8))
            case (.blob(let data), .bytea): self = .bytes(data)
            case (.blob(let data), .text): self = .text(String(decoding: data, as: UTF8.self))
            case (.int64(let number), .boolean): self = .boolean(number != 0)
            case (.int64(let number), .integer), (.int64(let number), .bigint): self = .integer(number)
            case (.int64(let number), .double): self = .double(Double(number))
            case (.double(let number), .double): self = .double(number)
            case (.double(let number), .integer), (.double(let number), .bigint): self = .integer(Int64(number))
            case (.int64(let number), .text): self = .text(String(number))
            default: throw Refused(description: "a value of \(value) does not fit a \(type) column")
            }
        }

        /// The target's value.
        init(_ cell: PostgresCell, as type: Column.Kind) throws {
            guard cell.bytes != nil else {
                self = .null
                return
            }
            switch type {
            case .text: self = .text(try cell.decode(String.self))
            case .bytea: self = .bytes(try cell.decode(Data.self))
            case .boolean: self = .boolean(try cell.decode(Bool.self))
            case .integer, .bigint: self = .integer(try cell.decode(Int64.self))
            case .double: self = .double(try cell.decode(Double.self))
            }
        }

        /// Fed to a checksum unambiguously: a tag, a length, the bytes.
        func feed(_ hash: inout SHA256) {
            func put(_ tag: UInt8, _ bytes: some Collection<UInt8>) {
                var header = [tag]
                withUnsafeBytes(of: UInt64(bytes.count).littleEndian) { header += $0 }
                hash.update(data: header)
                hash.update(data: Data(bytes))
            }
            switch self {
            case .null: put(0, [])
            case .text(let text): put(1, Array(text.utf8))
            case .bytes(let data): put(2, data)
            case .boolean(let flag): put(3, [flag ? 1 : 0])
            case .integer(let number): withUnsafeBytes(of: number.littleEndian) { put(4, Array($0)) }
            case .double(let number): withUnsafeBytes(of: number.bitPattern.littleEndian) { put(5, Array($0)) }
            }
        }

        func bind(_ bindings: inout PostgresBindings, as type: Column.Kind) throws {
            switch self {
            case .null:
                switch type {
                case .text: bindings.append(String?.none)
                case .bytea: try bindings.append(Data?.none)
                case .boolean: bindings.append(Bool?.none)
                case .integer: bindings.append(Int32?.none)
                case .bigint: bindings.append(Int64?.none)
                case .double: bindings.append(Double?.none)
                }
            case .text(let text): bindings.append(text)
            case .bytes(let data): try bindings.append(data)
            case .boolean(let flag): bindings.append(flag)
            case .integer(let number): type == .integer ? bindings.append(Int32(truncatingIfNeeded: number)) : bindings.append(number)
            case .double(let number): bindings.append(number)
            }
        }
    }

    private func summary(of shape: Shape, in db: Database) throws -> TableReport {
        var hash = SHA256()
        var rows = 0
        let names = shape.columns.map(\.name).joined(separator: ", ")
        let cursor = try Row.fetchCursor(db, sql: "SELECT \(names) FROM \(shape.table.name) ORDER BY \(Self.orderBy(shape, postgres: false))")
        while let row = try cursor.next() {
            for (index, column) in shape.columns.enumerated() { try Value(row[index] as DatabaseValue, as: column.type).feed(&hash) }
            rows += 1
        }
        return TableReport(table: shape.table.name, rows: rows, checksum: hash.finalize().map { String(format: "%02x", $0) }.joined())
    }

    private func summary(of shape: Shape, in session: PostgresSession) throws -> TableReport {
        var hash = SHA256()
        var rows = 0
        let names = shape.columns.map(\.name).joined(separator: ", ")
        for row in try session.rows(PostgresQuery(unsafeSQL: "SELECT \(names) FROM \(shape.table.name) ORDER BY \(Self.orderBy(shape, postgres: true))")) {
            for (index, column) in shape.columns.enumerated() { try Value(row[index], as: column.type).feed(&hash) }
            rows += 1
        }
        return TableReport(table: shape.table.name, rows: rows, checksum: hash.finalize().map { String(format: "%02x", $0) }.joined())
    }

    /// Inserts the source's rows, 500 a statement.
    private func copy(_ shape: Shape, from sqlite: DatabaseQueue, into session: PostgresSession, progress: (Int) -> Void) throws {
        let names = shape.columns.map(\.name).joined(separator: ", ")
        let batch = max(1, min(500, 30_000 / max(1, shape.columns.count))) // under PostgreSQL's 65,535 parameters
        var bindings = PostgresBindings()
        var pending = 0, done = 0
        func flush() throws {
            guard pending > 0 else { return }
            let width = shape.columns.count
            let rows = (0..<pending).map { row in "(" + (1...width).map { "$\(row * width + $0)" }.joined(separator: ", ") + ")" }
            try session.execute(PostgresQuery(unsafeSQL: "INSERT INTO \(shape.table.name) (\(names)) VALUES \(rows.joined(separator: ", "))", binds: bindings))
            done += pending
            progress(done)
            bindings = PostgresBindings()
            pending = 0
        }
        try sqlite.read { db in
            let cursor = try Row.fetchCursor(db, sql: "SELECT \(names) FROM \(shape.table.name)")
            while let row = try cursor.next() {
                for (index, column) in shape.columns.enumerated() { try Value(row[index] as DatabaseValue, as: column.type).bind(&bindings, as: column.type) }
                pending += 1
                if pending == batch { try flush() }
            }
        }
        try flush()
    }
}
