import CanopyIO
import CanopyMessages
import CanopyWire
import Logging

/// A Canopy service as a plug-in: it names itself and registers one typed handler per
/// operation. A ``ServiceRunner`` connects it to the broker.
///
/// ```swift
/// struct Echo: BusService {
///     let name = "echo"
///     func register(_ handlers: inout OperationHandlers) {
///         handlers.on(EchoSay.self) { request, context in request }
///     }
/// }
/// ```
public protocol BusService: Sendable {
    /// The service name workers announce and clients call.
    var name: String { get }
    /// Registers a handler for every operation the service serves.
    func register(_ handlers: inout OperationHandlers)
}

/// What a handler knows about the request beyond its body.
public struct RequestContext: Sendable {
    /// The authenticated user the request is on behalf of; `nil` when none.
    public var principal: String?
    /// When the caller stops waiting.
    public var deadline: ContinuousClock.Instant
    /// A logger with the request's metadata.
    public var logger: Logger
    /// The largest reply the broker takes (its frame limit, from its heartbeats). A handler
    /// whose reply could be larger sends less (a shorter page, the data in pieces); a larger
    /// reply is answered `tooLarge` by the runner instead.
    public var maximumReplyBytes: Int
    /// Whether a service made the request (``RequestHeader/Flag/derived``), not a person
    /// through the edge.
    public var byService: Bool

    /// The broker's default frame limit, assumed until the broker's first heartbeat says.
    public static let defaultMaximumReplyBytes = BusDefaults.maximumFrameBytes

    /// - Parameters:
    ///   - principal: the authenticated user, if any.
    ///   - deadline: when the caller stops waiting.
    ///   - logger: the request's logger.
    ///   - maximumReplyBytes: the largest reply the broker takes.
    ///   - byService: whether a service made the request.
    public init(
        principal: String?, deadline: ContinuousClock.Instant, logger: Logger, maximumReplyBytes: Int = defaultMaximumReplyBytes,
        byService: Bool = false
    ) {
        self.principal = principal
        self.deadline = deadline
        self.logger = logger
        self.maximumReplyBytes = maximumReplyBytes
        self.byService = byService
    }

    /// The context of a request as its header gives it: the principal (none when empty) and
    /// the deadline, counted from now.
    public init(header: RequestHeader, operation: String, logger: Logger, maximumReplyBytes: Int) {
        var logger = logger
        logger[metadataKey: "service.operation"] = "\(operation)"
        self.init(
            principal: header.principal.isEmpty ? nil : header.principal, deadline: .now + .milliseconds(Int64(header.timeoutMilliseconds)),
            logger: logger, maximumReplyBytes: maximumReplyBytes, byService: header.flags & RequestHeader.Flag.derived != 0)
    }

    /// The person one key of a multi-key lookup (``Lookup``) is for: the key's principal,
    /// which a request made for one person (with a principal in its header) may only name
    /// as that person.
    public func principal(forKey named: String) throws(CanopyError) -> String {
        if let principal, !principal.isEmpty, principal != named {
            throw CanopyError(.unauthorized, "a request made for one person names only that person in its keys")
        }
        return named
    }
}

/// The handlers of one service, by operation name, with their flags.
public struct OperationHandlers: Sendable {
    /// Decodes the payload, runs the handler, encodes the reply.
    public typealias RawHandler = @Sendable (_ payload: Payload, _ context: RequestContext) async throws -> Payload

    struct Entry: Sendable {
        let descriptor: OperationDescriptor
        let handle: RawHandler
    }

    /// The service the handlers belong to.
    public let service: String
    private(set) var entries: [String: Entry] = [:]
    private let codec = MessageCodec()
    /// The people this service erased lately, refused until their window ends.
    public let erased: ErasedPeople

    /// An empty set of handlers for `service`.
    public init(service: String, erased: ErasedPeople = ErasedPeople()) {
        self.service = service
        self.erased = erased
    }

    /// Registers the handler of an operation on one person's data (``Access/own``, or
    /// ``Access/service`` when another service sends it for that person): the runtime has
    /// checked that the request carries a principal (and for `service`, that a service made
    /// it) and hands the principal over as `owner`.
    public mutating func on<Operation: BusOperation>(
        _ operation: Operation.Type,
        _ handler: @escaping @Sendable (_ request: Operation.Request, _ owner: String, RequestContext) async throws -> Operation.Reply
    ) {
        precondition(
            Operation.access == .own || Operation.access == .service,
            "\(service).\(Operation.name) is \(Operation.access), not one person's data: register it without an owner")
        let erased = self.erased
        register(operation) { request, context in
            let owner = context.principal ?? ""
            // Noted before the erasure runs: nothing the person sends during it lands after it.
            // A service's own follow-ups for them go on (their lane's erasing follow-up comes
            // after and clears what they leave; refused, they would hold that lane up).
            if Operation.erases {
                erased.note(owner)
            } else if !context.byService, erased.contains(owner) {
                throw ErasedPeople.refusal
            }
            return try await handler(request, owner, context)
        }
    }

    /// Registers the handler of an operation that is not one person's data
    /// (``Access/public``, ``Access/perKey``, ``Access/operator``).
    public mutating func on<Operation: BusOperation>(
        _ operation: Operation.Type,
        _ handler: @escaping @Sendable (Operation.Request, RequestContext) async throws -> Operation.Reply
    ) {
        precondition(
            Operation.access != .own && Operation.access != .service,
            "\(service).\(Operation.name) acts on one person's data: register a handler that takes the owner")
        register(operation, handler)
    }

    private mutating func register<Operation: BusOperation>(
        _ operation: Operation.Type,
        _ handler: @escaping @Sendable (Operation.Request, RequestContext) async throws -> Operation.Reply
    ) {
        precondition(Operation.service == service, "\(Operation.self) belongs to '\(Operation.service)', not '\(service)'")
        precondition(entries[Operation.name] == nil, "\(service).\(Operation.name) is registered twice")
        let codec = self.codec
        // Requests that check their own fields are checked before the handler sees them.
        let validates = Operation.Request.self is any Validatable.Type
        entries[Operation.name] = Entry(descriptor: Operation.descriptor) { payload, context in
            // Who may call it first: a refused caller learns nothing from decoding errors.
            if let refusal = Operation.access.refusal(principal: context.principal, byService: context.byService) { throw refusal }
            let request = try codec.decodePayload(Operation.Request.self, from: payload)
            if validates, let checked = request as? any Validatable { try checked.validate() }
            return try codec.encodePayload(try await handler(request, context))
        }
    }

    /// The operations registered, sorted by name.
    public var descriptors: [OperationDescriptor] {
        entries.values.map(\.descriptor).sorted { $0.name < $1.name }
    }

    /// Runs the handler of `operation`, turning every failure into a ``CanopyError``.
    public func handle(_ operation: String, payload: Payload, context: RequestContext) async -> Result<Payload, CanopyError> {
        guard let entry = entries[operation] else {
            return .failure(CanopyError(.badRequest, "'\(service)' has no operation '\(operation)'"))
        }
        do {
            return .success(try await entry.handle(payload, context))
        } catch let error as CanopyError {
            return .failure(error)
        } catch is CancellationError {
            return .failure(CanopyError(.timeout, "the request was cancelled before the handler finished"))
        } catch let error as any CanopyErrorConvertible {
            // A store that could not do it now (its database unreachable, its pool busy): the
            // caller is told so, and may try again.
            context.logger.warning("service.handler.unavailable", metadata: ["service.operation": "\(operation)", "error": "\(error)"])
            return .failure(error.canopyError)
        } catch {
            context.logger.error("service.handler.failed", metadata: ["service.operation": "\(operation)", "error": "\(error)"])
            return .failure(CanopyError(.internal, "\(service).\(operation) failed unexpectedly; the service log has the details"))
        }
    }
}
