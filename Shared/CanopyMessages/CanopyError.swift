/// The error every Canopy operation answers with: a code a program can switch on and a
/// sentence a person can act on.
///
/// On the wire it is the JSON object `{"code":"busy","message":"..."}`, with `"field"` naming
/// the request's field when the error is about one (`"field":"plant.scientificName"`).
public struct CanopyError: Error, Codable, Sendable, Equatable, CustomStringConvertible {
    /// What kind of failure this is.
    public enum Code: String, Codable, Sendable, CaseIterable {
        /// The request is malformed or names something that does not exist in the protocol.
        case badRequest
        /// The thing asked for does not exist (or belongs to someone else).
        case notFound
        /// The request conflicts with the current state.
        case conflict
        /// The request was made against a version of the thing that has changed since it was
        /// read (HTTP 412, a stale `If-Match`): read it again and apply the change to that.
        case stale
        /// The caller is not allowed to do this.
        case unauthorized
        /// A frame, body or file is larger than the configured limit.
        case tooLarge
        /// A bound was reached (a full queue, too many waiters); try again later.
        case busy
        /// No worker serves the named service.
        case noWorkers
        /// The request's deadline passed before a reply came.
        case timeout
        /// The worker was lost while holding a request that is not safe to send again.
        case workerLost
        /// The connection to the broker was lost (the broker died, or the network) while a
        /// request that is not safe to send again was in flight: it may or may not have run.
        case brokerLost
        /// The broker is shutting down and did not run the request: send it to another broker
        /// (a client of several does so by itself), or again in a moment.
        case shuttingDown
        /// Anything else: a bug or an unexpected failure.
        case `internal`
    }

    /// What kind of failure this is.
    public var code: Code
    /// A sentence a person can act on.
    public var message: String
    /// The request field the error is about (`commonNames[3]`), when it is about one: the
    /// HTTP API answers 400 naming it.
    public var field: String?

    /// - Parameters:
    ///   - code: what kind of failure this is.
    ///   - message: a sentence a person can act on.
    ///   - field: the request field it is about, if any.
    public init(_ code: Code, _ message: String, field: String? = nil) {
        self.code = code
        self.message = message
        self.field = field
    }

    public var description: String { "\(code.rawValue): \(message)" }
}

/// An error of a lower layer (a store) that knows which ``CanopyError`` a caller should get
/// for it: a handler that lets it through answers that, not `internal`.
public protocol CanopyErrorConvertible: Error {
    var canopyError: CanopyError { get }
}
