import CanopyBroker
import CanopyBus
import CanopyMessages
import CanopyWire
import Logging
import Synchronization

/// A bus in the test process: `call(Op.self, …)` goes straight to the handlers of the
/// services registered, with no broker, socket or port. What a call meets on the way is the
/// wire path's own code, in the same order:
///
/// 1. the request's frames as ``BusClient`` builds them (``ClientSession/requestFrames``);
/// 2. the broker's checks: the frames decoded (``WireMessage/init(frames:)``: names,
///    principal, header; `badRequest` otherwise), no frame over the broker's limit
///    (`tooLarge`), a service that is registered (`noWorkers`) with the operation
///    (`badRequest` naming the ones it has);
/// 3. the worker's: the context from the header (``RequestContext/init(header:operation:logger:maximumReplyBytes:)``),
///    the handler run by ``OperationHandlers/handle(_:payload:context:)`` (decoding, field
///    checks, error mapping), a reply over the limit made `tooLarge`
///    (``WorkerSession/checked(_:service:operation:maximumReplyBytes:)``);
/// 4. the answer's frames decoded as the client decodes them (``ClientSession/outcome(of:)``),
///    so an error arrives as its JSON says, field included.
///
/// A deadline that passes answers `timeout` and cancels the handler, as the broker's CANCEL
/// does. What only the broker does is not here: queues and credit, coalescing, sending again
/// after a lost worker, CURVE; the `.live` tests over ``LiveBus`` cover those.
///
/// ```swift
/// let bus = InProcessBus()
/// bus.register(CareService(library: library))
/// let plant = try await bus.call(Care.AddPlant.self, request, principal: "alice")
/// ```
public final class InProcessBus: BusCalling {
    /// The services served, shared by the buses ``timingOut(after:)`` makes.
    private let services: Registry
    private let defaultTimeout: Duration
    private let maximumFrameBytes: Int
    private let derived: Bool
    private let logger: Logger
    private let nextCorrelation = Atomic<UInt64>(0)

    /// - Parameters:
    ///   - maximumFrameBytes: the broker's frame limit, for requests and replies.
    ///   - defaultTimeout: the deadline of calls that give none.
    ///   - derived: the calls are a service's own (``RequestHeader/Flag/derived``).
    ///   - erasureWindow: how long each service refuses a person it erased (``ErasedPeople``).
    public convenience init(
        maximumFrameBytes: Int = BusDefaults.maximumFrameBytes, defaultTimeout: Duration = .seconds(60), derived: Bool = false,
        erasureWindow: Duration = ErasedPeople.defaultWindow
    ) {
        self.init(services: Registry(erasureWindow: erasureWindow), maximumFrameBytes: maximumFrameBytes, defaultTimeout: defaultTimeout, derived: derived)
    }

    private init(services: Registry, maximumFrameBytes: Int, defaultTimeout: Duration, derived: Bool) {
        self.services = services
        self.maximumFrameBytes = maximumFrameBytes
        self.defaultTimeout = defaultTimeout
        self.derived = derived
        var logger = Logger(label: "canopy-in-process-bus")
        logger.logLevel = .critical
        self.logger = logger
    }

    /// A bus serving `services`, with the defaults.
    public convenience init(serving services: any BusService...) {
        self.init(maximumFrameBytes: BusDefaults.maximumFrameBytes)
        for service in services { register(service) }
    }

    /// The same bus (the same services) for a caller whose calls have another default
    /// deadline (and, with `asService`, are made or not as a service's own client makes
    /// them), as a second ``BusClient`` with its own configuration would be.
    public func timingOut(after timeout: Duration, asService: Bool? = nil) -> InProcessBus {
        InProcessBus(services: services, maximumFrameBytes: maximumFrameBytes, defaultTimeout: timeout, derived: asService ?? derived)
    }

    /// Serves `service`'s operations from now on (replacing a service of the same name, as a
    /// new worker would).
    public func register(_ service: some BusService) {
        var handlers = OperationHandlers(service: service.name, erased: ErasedPeople(window: services.erasureWindow))
        service.register(&handlers)
        services.handlers.withLock { $0[service.name] = handlers }
    }

    /// Stops serving `name`: calls are answered `noWorkers`, as when its last worker left.
    public func unregister(_ name: String) {
        _ = services.handlers.withLock { $0.removeValue(forKey: name) }
    }

    /// The operations `service` declares, as its worker would announce them.
    public func descriptors(of service: String) -> [OperationDescriptor] {
        services.handlers.withLock { $0[service]?.descriptors ?? [] }
    }

    public func call(service: String, operation: String, payload: Payload, principal: String?, timeout: Duration?, idempotent: Bool) async throws -> RawReply {
        let correlation = Wire.frame(nextCorrelation.add(1, ordering: .relaxed).newValue)
        let frames = ClientSession.requestFrames(
            correlation: correlation, service: service, operation: operation, body: payload.body, attachments: payload.attachments,
            principal: principal, timeout: timeout ?? defaultTimeout, idempotent: idempotent, derived: derived)
        let answer = await answer(frames)
        try Task.checkCancellation() // as BusClient: a cancelled caller gets CancellationError
        switch ClientSession.outcome(of: answer.wire(correlation: correlation)) {
        case .reply(let reply)?: return reply
        case .failure(let error)?: throw error
        case .cancelled?, nil: throw CancellationError()
        }
    }

    /// What the broker and the worker make of a request's frames.
    private func answer(_ frames: [[UInt8]]) async -> Result<Payload, CanopyError> {
        let request: WireRequest
        do {
            guard case .request(let decoded) = try WireMessage(frames: frames) else {
                return .failure(CanopyError(.badRequest, "not a request"))
            }
            request = decoded
        } catch {
            return .failure(CanopyError(.badRequest, error.description))
        }
        if let oversized = frames.first(where: { $0.count > maximumFrameBytes }) {
            return .failure(BrokerState.tooLarge(oversized.count, limit: maximumFrameBytes))
        }
        guard let handlers = services.handlers.withLock({ $0[request.service] }) else {
            return .failure(BrokerState.noWorkers(request.service))
        }
        let operations = handlers.descriptors.map(\.name)
        guard operations.contains(request.operation) else {
            return .failure(BrokerState.unknownOperation(request.operation, of: request.service, known: operations))
        }
        let context = RequestContext(header: request.header, operation: request.operation, logger: logger, maximumReplyBytes: maximumFrameBytes)
        let result = await Self.run(until: context.deadline, timeout: BrokerState.timeout(request.service)) {
            await handlers.handle(request.operation, payload: Payload(body: request.body, attachments: request.attachments), context: context)
        }
        return WorkerSession.checked(result, service: request.service, operation: request.operation, maximumReplyBytes: maximumFrameBytes)
    }

    /// Runs `body` until it ends or `deadline` passes (then it is cancelled and the answer is
    /// `timeout`); a cancelled caller cancels it too.
    private static func run(
        until deadline: ContinuousClock.Instant, timeout: CanopyError,
        _ body: @escaping @Sendable () async -> Result<Payload, CanopyError>
    ) async -> Result<Payload, CanopyError> {
        let answer = FirstAnswer()
        let handler = Task { answer.give(await body()) }
        let timer = Task {
            try? await Task.sleep(until: deadline, clock: .continuous)
            if answer.give(.failure(timeout)) { handler.cancel() }
        }
        let result = await withTaskCancellationHandler {
            await answer.value
        } onCancel: {
            handler.cancel()
            answer.give(.failure(CanopyError(.timeout, "the call was cancelled")))
        }
        timer.cancel()
        return result
    }
}

extension Result<Payload, CanopyError> {
    /// The answer as the broker would send it to the client.
    fileprivate func wire(correlation: [UInt8]) -> WireMessage {
        switch self {
        case .success(let payload):
            .reply(correlation: correlation, shared: false, body: payload.body, attachments: payload.attachments)
        case .failure(let error):
            .error(correlation: correlation, error: (try? MessageCodec.shared.encode(error)) ?? [])
        }
    }
}

/// The handlers of the services an in-process bus serves, by service name.
private final class Registry: Sendable {
    let handlers = Mutex<[String: OperationHandlers]>([:])
    let erasureWindow: Duration

    init(erasureWindow: Duration) { self.erasureWindow = erasureWindow }
}

/// The first of several answers; the rest are ignored.
private final class FirstAnswer: Sendable {
    private let state = Mutex<(answer: Result<Payload, CanopyError>?, waiting: CheckedContinuation<Result<Payload, CanopyError>, Never>?)>((nil, nil))

    /// Gives an answer; `true` when it was the first.
    @discardableResult
    func give(_ answer: Result<Payload, CanopyError>) -> Bool {
        let waiting: CheckedContinuation<Result<Payload, CanopyError>, Never>?? = state.withLock { state in
            guard state.answer == nil else { return .none }
            state.answer = answer
            defer { state.waiting = nil }
            return .some(state.waiting)
        }
        guard let waiting else { return false }
        waiting?.resume(returning: answer)
        return true
    }

    /// The first answer, once there is one.
    var value: Result<Payload, CanopyError> {
        get async {
            await withCheckedContinuation { continuation in
                let ready = state.withLock { state -> Result<Payload, CanopyError>? in
                    if let answer = state.answer { return answer }
                    state.waiting = continuation
                    return nil
                }
                if let ready { continuation.resume(returning: ready) }
            }
        }
    }
}
