import Foundation
import GRDB
import Tracing

/// Store calls as spans of the request that makes them: a transaction is a `store read` or
/// `store write` span (attributes `db.system`, `db.name` and `code.function`, the store method
/// that ran it) under the handler's span. Outside a request's span (no service context: the
/// request is not traced, or no tracer is installed) nothing is started.
public enum StoreTracing {
    /// Runs `body`, in a span when the calling task is in one.
    public static func span<T>(_ name: String, system: String, database: @autoclosure () -> String, function: String, _ body: () throws -> T) throws -> T {
        guard let context = ServiceContext.current else { return try body() }
        return try InstrumentationSystem.tracer.withSpan(name, context: context, ofKind: .client) { span in
            span.attributes["db.system"] = system
            span.attributes["db.name"] = database()
            span.attributes["code.function"] = function
            return try body()
        }
    }

    /// Runs `body`, in a span when the calling task is in one.
    public static func span<T>(_ name: String, system: String, database: @autoclosure () -> String, function: String,
                               _ body: () async throws -> T) async throws -> T {
        guard let context = ServiceContext.current else { return try await body() }
        return try await InstrumentationSystem.tracer.withSpan(name, context: context, ofKind: .client) { span in
            span.attributes["db.system"] = system
            span.attributes["db.name"] = database()
            span.attributes["code.function"] = function
            return try await body()
        }
    }
}

extension DatabasePool {
    /// `read(_:)` as a `store read` span of the request (``StoreTracing``).
    public func tracedRead<T>(function: String = #function, _ body: (Database) throws -> T) throws -> T {
        try StoreTracing.span("store read", system: "sqlite", database: URL(fileURLWithPath: path).lastPathComponent, function: function) { try read(body) }
    }

    /// `write(_:)` as a `store write` span of the request (``StoreTracing``).
    public func tracedWrite<T>(function: String = #function, _ body: (Database) throws -> T) throws -> T {
        try StoreTracing.span("store write", system: "sqlite", database: URL(fileURLWithPath: path).lastPathComponent, function: function) { try write(body) }
    }

    /// The async `read(_:)` as a `store read` span of the request (``StoreTracing``).
    public func tracedRead<T: Sendable>(function: String = #function, _ body: @Sendable (Database) throws -> T) async throws -> T {
        try await StoreTracing.span("store read", system: "sqlite", database: URL(fileURLWithPath: path).lastPathComponent, function: function) { try await read(body) }
    }

    /// The async `write(_:)` as a `store write` span of the request (``StoreTracing``).
    public func tracedWrite<T: Sendable>(function: String = #function, _ body: @Sendable (Database) throws -> T) async throws -> T {
        try await StoreTracing.span("store write", system: "sqlite", database: URL(fileURLWithPath: path).lastPathComponent, function: function) { try await write(body) }
    }
}
