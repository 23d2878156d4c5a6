/// Who is calling: the user id a verified bearer token names, for the length of one request.
/// The authentication middleware sets it; every bus call of the request carries it as its
/// principal.
enum Caller {
    @TaskLocal static var principal: String?
    @TaskLocal static var requestID: String = ""
    /// The request's `Idempotency-Key` as the services are told it (``IdempotencyKeys/serviceKey(person:route:key:)``),
    /// when it came with one: the routes that create or log something pass it on.
    @TaskLocal static var idempotencyKey: String?
}
