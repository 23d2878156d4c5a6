import CanopyMessages

/// What calls other services' operations. ``BusClient`` does it over ZeroMQ through the
/// broker; in tests, `InProcessBus` (CanopyTesting) calls the registered handlers directly,
/// with the same encoding, field checks, principal rules and error mapping. Code that calls
/// other services (the HTTP API, canopy-care's outbox, lookups) takes `any BusCalling`.
public protocol BusCalling: Sendable {
    /// Calls an operation with a raw payload: a JSON body and attachment frames.
    ///
    /// - Parameters:
    ///   - service: the service name.
    ///   - operation: the operation name.
    ///   - payload: the request body (JSON) and frames of their own beside it (photo bytes).
    ///   - principal: the user the call acts for, if any.
    ///   - timeout: how long to wait; the caller's default when `nil`.
    ///   - idempotent: whether the call may be sent again after losing the broker.
    /// - Throws: ``CanopyError`` for every failure the bus or the service reports, or
    ///   `CancellationError` when the calling task is cancelled.
    func call(
        service: String, operation: String, payload: Payload, principal: String?, timeout: Duration?,
        idempotent: Bool
    ) async throws -> RawReply
}

extension BusCalling {
    /// Calls an operation with a raw JSON body (what `canopy send` does); see
    /// ``call(service:operation:payload:principal:timeout:idempotent:)``.
    public func call(
        service: String, operation: String, body: [UInt8], attachments: [[UInt8]] = [], principal: String? = nil,
        timeout: Duration? = nil, idempotent: Bool = false
    ) async throws -> RawReply {
        try await call(
            service: service, operation: operation, payload: Payload(body: body, attachments: attachments), principal: principal,
            timeout: timeout, idempotent: idempotent)
    }

    /// Calls a typed operation and decodes its reply.
    ///
    /// - Parameters:
    ///   - operation: the operation type.
    ///   - request: the request body.
    ///   - principal: the user the call acts for, when it touches a person's data.
    ///   - timeout: how long to wait; the caller's default when `nil`.
    /// - Throws: ``CanopyError`` for every failure the bus or the service reports, or
    ///   `CancellationError` when the calling task is cancelled.
    public func call<Operation: BusOperation>(
        _ operation: Operation.Type, _ request: Operation.Request, principal: String? = nil, timeout: Duration? = nil
    ) async throws -> Operation.Reply {
        let codec = MessageCodec.shared
        let payload = try codec.encodePayload(request)
        let reply = try await call(
            service: Operation.service, operation: Operation.name, payload: payload, principal: principal, timeout: timeout,
            idempotent: Operation.idempotent)
        do {
            return try codec.decodePayload(Operation.Reply.self, from: reply.payload)
        } catch {
            throw CanopyError(.internal, "the reply of \(Operation.service).\(Operation.name) did not decode: \(error.message)")
        }
    }
}
