import CanopyBus
import CanopyMessages
import Logging

/// Calls a service's registered handlers directly, with a request context and no sockets:
/// the bytes go through the same decoding, field checks and encoding as on the bus
/// (``OperationHandlers/handle(_:payload:context:)``), but no broker, runner or port is involved.
/// The handler-level twin of ``LiveBus``, as Hummingbird's `.router` testing is of `.live`.
///
/// ```swift
/// let care = HandlerTester(CareService(library: library))
/// let plant = try await care.call(Care.AddPlant.self, .init(scientificName: "Ficus lyrata"), principal: "alice")
/// ```
public struct HandlerTester: Sendable {
    private let handlers: OperationHandlers
    private let codec = MessageCodec()
    private let logger: Logger

    /// - Parameter service: the service whose handlers to call.
    public init(_ service: some BusService) {
        var handlers = OperationHandlers(service: service.name)
        service.register(&handlers)
        self.handlers = handlers
        var logger = Logger(label: "canopy-handler-test")
        logger.logLevel = .critical
        self.logger = logger
    }

    /// The operations the service declares, as its worker would announce them.
    public var descriptors: [OperationDescriptor] { handlers.descriptors }

    /// Calls a typed operation as the bus would deliver it.
    ///
    /// - Parameters:
    ///   - operation: the operation type.
    ///   - request: the request body.
    ///   - principal: the person the call acts for.
    ///   - timeout: the time left, as the header would give it.
    ///   - maximumReplyBytes: the broker's frame limit, as its heartbeat would give it.
    /// - Throws: the ``CanopyError`` the handler (or decoding, or a field check) answers.
    public func call<Operation: BusOperation>(
        _ operation: Operation.Type, _ request: Operation.Request, principal: String? = nil, timeout: Duration = .seconds(30),
        maximumReplyBytes: Int = RequestContext.defaultMaximumReplyBytes
    ) async throws -> Operation.Reply {
        let payload = try codec.encodePayload(request)
        let reply = try await call(operation: Operation.name, payload: payload, principal: principal, timeout: timeout, maximumReplyBytes: maximumReplyBytes)
        return try codec.decodePayload(Operation.Reply.self, from: reply)
    }

    /// Calls an operation with a raw body (to send what a typed request cannot: bad JSON,
    /// duplicate keys, numbers out of range).
    public func call(operation: String, body: [UInt8], principal: String? = nil, timeout: Duration = .seconds(30),
                     maximumReplyBytes: Int = RequestContext.defaultMaximumReplyBytes) async throws -> [UInt8] {
        try await call(operation: operation, payload: Payload(body: body), principal: principal, timeout: timeout, maximumReplyBytes: maximumReplyBytes).body
    }

    /// Calls an operation with a raw payload: a body and attachment frames.
    public func call(operation: String, payload: Payload, principal: String? = nil, timeout: Duration = .seconds(30),
                     maximumReplyBytes: Int = RequestContext.defaultMaximumReplyBytes) async throws -> Payload {
        let context = RequestContext(principal: principal, deadline: .now + timeout, logger: logger, maximumReplyBytes: maximumReplyBytes)
        return try await handlers.handle(operation, payload: payload, context: context).get()
    }
}
