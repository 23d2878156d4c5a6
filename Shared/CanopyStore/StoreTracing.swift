import Foundation
import GRDB
import Tracing

/// Store calls as spans of the request that makes them: a transaction is a `store read` or
/// `store write` span (attributes `db.system`, `db.name` and `code.function`, the store method
/// that ran it) under the handler's span. Outside a sampled request's span (no service
/// context, no tracer, or a trace that is not recorded) nothing is started.
public enum StoreTracing {
    /// The calling task's context, when it is in a sampled span.
    static var sampledContext: ServiceContext? {
        guard let context = ServiceContext.current else { return nil }
        var sampled = Sampled()
        InstrumentationSystem.tracer.inject(context, into: &sampled, using: Sampled.Injector())
        return sampled.value ? context : nil
    }

    /// Whether a tracer's `traceparent` says sampled (its flags' low bit).
    struct Sampled {
        var value = false

        struct Injector: Tracing.Injector {
            func inject(_ value: String, forKey key: String, into carrier: inout Sampled) {
                guard key == "traceparent", value.utf8.count >= 55, let flags = UInt8(value.suffix(2), radix: 16) else { return }
                carrier.value = flags & 1 == 1
            }
        }
    }

    /// Runs `body`, in a span when the calling task is in a sampled one.
    public static func span<T>(_ name: String, system: String, database: @autoclosure () -> String, function: String, _ body: () throws -> T) throws -> T {
        guard let context = sampledContext else { return try body() }
        return try InstrumentationSystem.tracer.withSpan(name, context: context, ofKind: .client) { span in
            span.attributes["db.system"] = system
            span.attributes["db.name"] = database()
            span.attributes["code.function"] = function
            return try body()
        }
    }

    /// Runs `body`, in a span when the calling task is in a sampled one.
    public static func span<T>(
        _ name: String, system: String, database: @autoclosure () -> String, function: String,
        _ body: () async throws -> T
    ) async throws -> T {
        guard let context = sampledContext else { return try await body() }
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
        try await StoreTracing.span("store read", system: "sqlite", database: URL(fileURLWithPath: path).lastPathComponent, function: function) {
            try await read(body)
        }
    }

    /// The async `write(_:)` as a `store write` span of the request (``StoreTracing``).
    public func tracedWrite<T: Sendable>(function: String = #function, _ body: @Sendable (Database) throws -> T) async throws -> T {
        try await StoreTracing.span("store write", system: "sqlite", database: URL(fileURLWithPath: path).lastPathComponent, function: function) {
            try await write(body)
        }
    }
}
