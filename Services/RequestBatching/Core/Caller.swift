/// Who is calling: the user id a verified bearer token names, for the length of one request.
/// The authentication middleware sets it; every bus call of the request carries it as its
/// principal.
enum Caller {
    @TaskLocal static var principal: String?
    @TaskLocal static var requestID: String = ""
}
