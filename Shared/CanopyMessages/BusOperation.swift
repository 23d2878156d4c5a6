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
    /// Who may call it; the runtime checks it before the handler runs. One person's own data
    /// (``Access/own``) unless the operation says otherwise.
    static var access: Access { get }
    /// It erases the person it is for (an account deleted, or another service's follow-up to
    /// that): from its first request on, the service refuses every other operation the edge
    /// sends for that person for a while (`ErasedPeople`), so a request an edge let through
    /// before it saw the sign-out adds nothing after the erasure.
    static var erases: Bool { get }
}

/// Who may call an operation: declared once, in the operation's type, and enforced by the
/// runtime (`OperationHandlers`) before the request is decoded or the handler runs, so no
/// handler checks it again.
public enum Access: String, Sendable, Codable, CaseIterable {
    /// Anyone connected, for or without a person: nothing of anyone's is read or changed (the
    /// species catalog).
    case `public`
    /// One person's own data: the request carries the principal the edge authenticated
    /// (`unauthorized` without one), and the handler acts for that person only.
    case own
    /// Several people's data in one request, each key naming its person (a multi-key
    /// ``Lookup``): a principal is optional, and a request made for one person may name
    /// only that person in its keys.
    case perKey
    /// The operator's figures about the service as a whole (no person's data): a request made
    /// on someone's behalf (with a principal) is refused, so the edge can never reach them.
    case `operator`
    /// Service to service, for one person: what one service owes another about that person's
    /// data (canopy-care's follow-ups: a reminder window, a deleted plant's reminders, photos
    /// and identifications; canopy-remind's refill). The request carries a principal and the
    /// flag a service's own client sets (``RequestHeader/Flag/derived`` on the wire); with
    /// CURVE the broker takes that flag only from a worker's key, so neither the edge nor a
    /// client can send these.
    case service

    /// Why a request with `principal`, made by a service (`byService`) or not, may not call an
    /// operation with this access, or `nil` when it may.
    public func refusal(principal: String?, byService: Bool) -> CanopyError? {
        let present = !(principal ?? "").isEmpty
        switch self {
        case .own where !present, .service where !present:
            return CanopyError(.unauthorized, "this operation acts on a person's data and needs a principal (the user id the edge authenticated)")
        case .service where !byService:
            return CanopyError(
                .unauthorized, "this operation is one service's to another (a follow-up about a person's data); only a service's own bus client sends it")
        case .operator where present:
            return CanopyError(
                .unauthorized,
                "this is an operator's operation, about the service as a whole; it is not called on a person's behalf (send it without a principal)")
        default:
            return nil
        }
    }
}

extension BusOperation {
    public static var idempotent: Bool { false }
    public static var coalescable: Bool { false }
    public static var access: Access { .own }
    public static var erases: Bool { false }

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
