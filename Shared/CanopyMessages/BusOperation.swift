/// One operation of one service: the single typed definition both sides use.
///
/// A client calls it with `bus.call(SomeOperation.self, request)`; a service registers a
/// handler for it. The broker never decodes bodies: it routes on ``service`` and ``name`` and
/// uses the flags the serving worker declares.
///
/// ```swift
/// enum ListServices: BusOperation {
///     typealias Request = Empty
///     typealias Reply = [ServiceDescription]
///     static let service = "broker"
///     static let name = "services"
///     static let idempotent = true
/// }
/// ```
public protocol BusOperation: Sendable {
    /// The request body, encoded as JSON with sorted keys.
    associatedtype Request: Codable & Sendable
    /// The reply body, encoded as JSON with sorted keys.
    associatedtype Reply: Codable & Sendable

    /// The service that serves the operation, for example `"care"`.
    static var service: String { get }
    /// The operation's name within its service, for example `"plants.get"`.
    static var name: String { get }
    /// Running the operation twice has the same effect as running it once, so the bus may
    /// send it again after a worker or the broker is lost.
    static var idempotent: Bool { get }
    /// Identical in-flight requests may share one worker call. Only idempotent operations
    /// qualify.
    static var coalescable: Bool { get }
}

extension BusOperation {
    public static var idempotent: Bool { false }
    public static var coalescable: Bool { false }

    /// The flags a worker announces for this operation.
    public static var descriptor: OperationDescriptor {
        OperationDescriptor(name: name, idempotent: idempotent, coalescable: coalescable && idempotent)
    }
}

/// An empty request or reply body (`{}` on the wire).
public struct Empty: Codable, Sendable, Equatable {
    public init() {}
}

/// What a worker announces about one of its operations.
public struct OperationDescriptor: Codable, Sendable, Equatable, Hashable {
    /// The operation's name within its service.
    public var name: String
    /// See ``BusOperation/idempotent``.
    public var idempotent: Bool
    /// See ``BusOperation/coalescable``.
    public var coalescable: Bool

    /// - Parameters:
    ///   - name: the operation's name within its service.
    ///   - idempotent: whether the bus may send it again after a loss.
    ///   - coalescable: whether identical in-flight requests may share one worker call.
    public init(name: String, idempotent: Bool, coalescable: Bool) {
        self.name = name
        self.idempotent = idempotent
        self.coalescable = coalescable
    }
}
