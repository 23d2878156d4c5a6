import CanopyBus
import CanopyMessages

extension OperationHandlers {
    /// Registers a handler that blocks its thread (a store call: GRDB's, or PostgreSQL's
    /// through `PostgresStore`'s synchronous transactions): it runs on a Dispatch thread
    /// (``offThePool(_:)``), so the cooperative pool, a thread a core, is never held waiting
    /// for a database (which would stall every other request of the process meanwhile).
    public mutating func onBlocking<Operation: BusOperation>(
        _ operation: Operation.Type, _ work: @escaping @Sendable (Operation.Request, RequestContext) throws -> Operation.Reply
    ) {
        on(operation) { request, context in try await offThePool { try work(request, context) } }
    }

    /// ``onBlocking(_:_:)`` for an operation on one person's data (`owner`).
    public mutating func onBlocking<Operation: BusOperation>(
        _ operation: Operation.Type, _ work: @escaping @Sendable (Operation.Request, _ owner: String, RequestContext) throws -> Operation.Reply
    ) {
        on(operation) { request, owner, context in try await offThePool { try work(request, owner, context) } }
    }
}
