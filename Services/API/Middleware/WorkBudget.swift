import HTTPTypes
import Synchronization

/// What a request costs the machine beyond answering it, in work units (one unit is about a
/// millisecond of CPU), and which service does that work. Most routes cost next to nothing
/// (a list, a plant, a task: about 0.5 ms of CPU across the edge, the broker and the service)
/// and are held only to the request rate; the routes that work on a photo's pixels cost tens
/// to hundreds of times that, in proportion to the photo.
///
/// The figures (docs/PERFORMANCE.md, `canopy-bench stores`, the CPU columns of its SQLite run): for a 640x480 JPEG of about
/// 40 KiB, `images.put` takes 5.4 ms of CPU and `identifications.submit` 14.4 ms, against 0.53
/// ms for a round trip that does no work. Decoding grows with the photo, so a photo costs a
/// unit per 8 KiB of it and one (40 KiB: 6 units), and an identification 10 units more (its
/// features). A 12 MP phone photo of 4 MiB is then 513 units; an identification of a 1.6 MP
/// photo of 300 KiB, 48.
struct RouteCost: Sendable, Equatable {
    /// Work units.
    var units: Double
    /// The service whose work it is (a person's requests in flight are counted per service).
    var service: String
    /// The route as the document names it, for the problem a refusal answers.
    var route: String

    /// Bytes of a photo per work unit.
    static let bytesPerUnit = 8 * 1_024
    /// An identification's work besides decoding its photo (its features), in units.
    static let identificationUnits: Double = 10

    /// The cost of `method` `path` with a body of `bodyBytes`, or nil when the route does no
    /// work worth budgeting (it costs its request alone).
    static func of(method: HTTPRequest.Method, path: String, bodyBytes: Int) -> RouteCost? {
        guard method == .post else { return nil }
        let decoding = 1 + Double(bodyBytes) / Double(bytesPerUnit)
        if path == "/v1/identifications" {
            return RouteCost(units: identificationUnits + decoding, service: "identify", route: "POST /v1/identifications")
        }
        let parts = path.split(separator: "/", omittingEmptySubsequences: false)
        if parts.count == 5, parts[1] == "v1", parts[2] == "plants", parts[4] == "photos" {
            return RouteCost(units: decoding, service: "images", route: "POST /v1/plants/{plantID}/photos")
        }
        return nil
    }
}

/// Each person's budget of work (``RouteCost``): `rate` units a second, `burst` at once, and at
/// most `inFlight` requests of theirs working in one service at a time. Over budget is 429
/// with the `Retry-After` the budget implies. Cheap requests never touch it, so a person who
/// spends all of it on photos still reads their plants; and one person's flood of photos costs
/// the machine at most their budget, so everyone else's requests go on as before.
/// (GitHub's GraphQL points, Shopify's calculated query cost and Stripe's concurrency limiter
/// are the anchors.)
final class WorkBudget: Sendable {
    /// Each person's units.
    let units: RateLimiter
    let inFlight: Int
    private let working = Mutex<[String: Int]>([:])

    /// - Parameters:
    ///   - rate: work units a second, each person.
    ///   - burst: work units at once.
    ///   - inFlight: a person's requests working in one service at once.
    init(rate: Double, burst: Double, inFlight: Int) {
        precondition(inFlight >= 1, "a person may have one request working at least")
        units = RateLimiter(rate: rate, burst: burst)
        self.inFlight = inFlight
    }

    /// Why `person` may not start `cost` now (a sentence and the seconds to wait), or nil when
    /// they may: then the units are taken and a slot held until ``finished(_:_:)``.
    func start(_ person: String, _ cost: RouteCost) -> (reason: String, retryAfter: Int)? {
        let key = "\(cost.service)\u{0}\(person)"
        let admitted = working.withLock { working -> Bool in
            guard working[key, default: 0] < inFlight else { return false }
            working[key, default: 0] += 1
            return true
        }
        guard admitted else {
            return ("you have \(inFlight) requests of \(cost.route)'s kind working already; send the next when one is answered", 1)
        }
        if let wait = units.take(person, cost: cost.units) {
            finished(person, cost)
            return (
                "\(cost.route) costs \(Int(cost.units.rounded(.up))) work units and your budget is \(Int(units.rate)) a second; it refills in \(wait) s", wait
            )
        }
        return nil
    }

    /// The request ``start(_:_:)`` admitted is answered.
    func finished(_ person: String, _ cost: RouteCost) {
        let key = "\(cost.service)\u{0}\(person)"
        working.withLock { working in
            let left = working[key, default: 1] - 1
            working[key] = left > 0 ? left : nil
        }
    }
}
