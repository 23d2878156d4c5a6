import Foundation
import Testing

@testable import CanopyAPI

/// Token buckets per person, driven by hand: a burst, then the rate, a wait that says when,
/// and a bound on how many people are remembered.
struct RateLimitTests {
    @Test func aBurstThenTheRateAndTheWaitUntilTheNextToken() {
        var buckets = TokenBuckets(rate: 2, burst: 3)
        #expect((0..<3).map { _ in buckets.take("alice", now: 0) } == [nil, nil, nil])
        #expect(buckets.take("alice", now: 0) == 0.5, "one token comes every half second")
        #expect(buckets.take("bob", now: 0) == nil, "each person has their own bucket")
        #expect(buckets.take("alice", now: 0.25) == 0.25)
        #expect(buckets.take("alice", now: 0.5) == nil)
        #expect(buckets.take("alice", now: 0.5) != nil)
        #expect((0..<3).map { _ in buckets.take("alice", now: 100) } == [nil, nil, nil], "a full bucket holds the burst, not more")
        #expect(buckets.take("alice", now: 100) != nil)
    }

    @Test func peopleRememberedStayWithinTheBoundFullBucketsForgottenFirst() {
        var buckets = TokenBuckets(rate: 1, burst: 2, capacity: 100)
        for index in 0..<10 {
            _ = buckets.take("busy-\(index)", now: 1_000)
            _ = buckets.take("busy-\(index)", now: 1_000)
        }
        for index in 0..<10_000 {
            _ = buckets.take("passer-\(index)", now: Double(index) * 0.001)
            #expect(buckets.count <= 100)
        }
        // People who emptied their buckets a moment ago are still held to it when room is made.
        var held = TokenBuckets(rate: 1, burst: 2, capacity: 100)
        for index in 0..<95 { _ = held.take("earlier-\(index)", now: 0) } // full again by t = 100
        for index in 0..<10 {
            _ = held.take("busy-\(index)", now: 100)
            _ = held.take("busy-\(index)", now: 100)
        }
        #expect(held.count <= 100)
        #expect(held.take("busy-3", now: 100.1) != nil, "an empty bucket outlives the full ones")
    }
}

/// What routes cost, and each person's work budget: units by a photo's size, a bucket of
/// them, and a bound on their requests working in one service.
struct WorkBudgetTests {
    @Test func photosCostByTheirSizeIdentificationsMoreAndEverythingElseNothing() {
        #expect(
            RouteCost.of(method: .post, path: "/v1/plants/p-1/photos", bodyBytes: 40 * 1_024)
                == RouteCost(units: 6, service: "images", route: "POST /v1/plants/{plantID}/photos"))
        #expect(RouteCost.of(method: .post, path: "/v1/identifications", bodyBytes: 80 * 1_024)?.units == 21)
        #expect(RouteCost.of(method: .post, path: "/v1/plants", bodyBytes: 500) == nil)
        #expect(RouteCost.of(method: .get, path: "/v1/plants/p-1/photos", bodyBytes: 0) == nil)
        #expect(RouteCost.of(method: .post, path: "/v1/plants/p-1/photos/extra", bodyBytes: 10) == nil)
    }

    @Test func aPersonsWorkIsBoundedByUnitsAndByRequestsWorkingAtOnce() {
        let budget = WorkBudget(rate: 10, burst: 100, inFlight: 2)
        let photo = RouteCost(units: 40, service: "images", route: "POST /v1/plants/{plantID}/photos")
        #expect(budget.start("ann", photo) == nil)
        #expect(budget.start("ann", photo) == nil)
        let third = budget.start("ann", photo)
        #expect(third?.reason.contains("2 requests") == true && third?.retryAfter == 1, "two of hers working already")
        budget.finished("ann", photo)
        let broke = budget.start("ann", photo)
        #expect(broke?.retryAfter == 2 && broke?.reason.contains("costs 40 work units") == true, "20 units left: 2 s to the next 40")
        #expect(budget.start("ben", photo) == nil, "his own budget and slots")
        let identification = RouteCost(units: 5, service: "identify", route: "POST /v1/identifications")
        budget.finished("ann", photo)
        #expect(budget.start("ann", identification) == nil, "units left for a smaller one")
    }
}

/// Verified tokens are remembered until they end, and only verified ones.
struct TokenCacheTests {
    @Test func aVerifiedTokenIsTakenUntilItEndsAndAForgedOneNever() async throws {
        let authority = try TokenAuthority(key: Array("a key of at least thirty-two bytes for tokens".utf8))
        let now = Date()
        let token = try await authority.issue(user: "alice", lifetime: .seconds(60), now: now)
        #expect(await authority.user(of: token, now: now) == "alice")
        #expect(await authority.user(of: token, now: now.addingTimeInterval(30)) == "alice", "remembered")
        #expect(await authority.user(of: token, now: now.addingTimeInterval(61)) == nil, "ended, also when remembered")
        #expect(await authority.user(of: token, now: now.addingTimeInterval(62)) == nil)
        var forged = token
        forged.removeLast(2)
        forged += "AA"
        #expect(await authority.user(of: forged, now: now) == nil)
        #expect(await authority.user(of: forged, now: now) == nil, "a forged token is not remembered as good")
    }
}
