import CanopyMessages
import CanopyServiceKit
import CanopyStore
import CanopyTesting
import Foundation
import GRDB
import Logging
import PostgresNIO
import Testing

@testable import CanopyAPI

/// `Idempotency-Key`'s rules (what a key may be, what a request finds) and its records in
/// canopy-api's store, in SQLite and in PostgreSQL.
@Suite(.serialized)
struct IdempotencyKeyTests {
    /// Small limits, so that the bounds are reached in a few requests.
    static let limits = IdempotencyLimits(keysPerPerson: 20, bytesPerPerson: 8_192)

    static let contract = StoreContract<any APIStoring>(
        "idempotency",
        sqlite: {
            try await openAPIStore(directory: $0.url, postgres: nil, logger: Logger(label: "test"), idempotencyLimits: limits)
        }
    ) { url, _ in
        let store = try await PostgresAPIStore.open(url: url, poolSize: 2, logger: Logger(label: "test"), idempotencyLimits: limits)
        return (store, store.database.close)
    }

    func withStore(_ backend: StoreBackend, _ body: (any APIStoring) async throws -> Void) async throws {
        let (store, _, cleanup) = try await Self.contract.open(backend)
        defer { cleanup() }
        try await body(store)
    }

    static func claim(_ person: String = "ann", route: String = "POST /v1/plants", key: String = "k-1", body: String = "{}", lease: TimeInterval = 30)
        -> IdempotencyClaim
    {
        IdempotencyClaim(
            person: person, route: route, key: key,
            fingerprint: IdempotencyKeys.fingerprint(method: "POST", path: String(route.dropFirst(5)), contentType: "application/json", body: Array(body.utf8)),
            lease: lease)
    }

    static let answer = KeptAnswer(status: 201, headers: [["Content-Type", "application/json"]], body: Array(#"{"id":"p-1"}"#.utf8))

    // MARK: - The rules

    @Test func aKeyIsOneTo255PrintableASCIICharactersBareOrQuoted() throws {
        #expect(try IdempotencyKeys.parse("8e03978e-40d5-43e8-bc93-6894a57f9324") == "8e03978e-40d5-43e8-bc93-6894a57f9324")
        #expect(try IdempotencyKeys.parse("\"8e03978e\"") == "8e03978e", "the draft's sf-string")
        #expect(try IdempotencyKeys.parse("a key with spaces") == "a key with spaces")
        #expect(try IdempotencyKeys.parse(String(repeating: "k", count: 255)).utf8.count == 255)
        for bad in ["", "\"\"", "   ", String(repeating: "k", count: 256), "clé", "tab\there", "nul\u{0}", "\"a\"b\""] {
            #expect(throws: CanopyError.self, "\(bad.debugDescription)") { try IdempotencyKeys.parse(bad) }
        }
        let error = try #require(throws: CanopyError.self) { try IdempotencyKeys.parse("") }
        #expect(error.field == "Idempotency-Key" && error.code == .badRequest)
    }

    @Test func aRequestIsTheSameOnlyWithTheSameMethodPathTypeAndBody() {
        let base = IdempotencyKeys.fingerprint(method: "POST", path: "/v1/plants", contentType: "application/json", body: Array("{}".utf8))
        #expect(base == IdempotencyKeys.fingerprint(method: "POST", path: "/v1/plants", contentType: "application/json", body: Array("{}".utf8)))
        #expect(base != IdempotencyKeys.fingerprint(method: "POST", path: "/v1/plants", contentType: "application/json", body: Array("{ }".utf8)))
        #expect(base != IdempotencyKeys.fingerprint(method: "POST", path: "/v1/plants?x=1", contentType: "application/json", body: Array("{}".utf8)))
        #expect(base != IdempotencyKeys.fingerprint(method: "PATCH", path: "/v1/plants", contentType: "application/json", body: Array("{}".utf8)))
        #expect(base != IdempotencyKeys.fingerprint(method: "POST", path: "/v1/plants", contentType: "text/plain", body: Array("{}".utf8)))
        // Length-prefixed: moving bytes from one part to the next is another request.
        #expect(
            IdempotencyKeys.fingerprint(method: "POST", path: "/a", contentType: "b", body: [])
                != IdempotencyKeys.fingerprint(method: "POST", path: "/", contentType: "ab", body: []))
    }

    @Test func theServicesKeyAndThePlantIDAreEachPersonsAndRoutesOwn() {
        let ann = IdempotencyKeys.serviceKey(person: "ann", route: "POST /v1/plants", key: "k")
        #expect(ann.utf8.count == 64 && ann.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) })
        #expect(ann == IdempotencyKeys.serviceKey(person: "ann", route: "POST /v1/plants", key: "k"))
        #expect(ann != IdempotencyKeys.serviceKey(person: "bob", route: "POST /v1/plants", key: "k"))
        #expect(ann != IdempotencyKeys.serviceKey(person: "ann", route: "POST /v1/batch", key: "k"))
        #expect(IdempotencyKeys.serviceKey(person: "a:b", route: "c", key: "k") != IdempotencyKeys.serviceKey(person: "a", route: "b:c", key: "k"))
        #expect(IdempotencyKeys.partKey(ann, part: 0) != IdempotencyKeys.partKey(ann, part: 1))
        let plant = IdempotencyKeys.plantID(serviceKey: ann)
        #expect(UUID(uuidString: plant) != nil && plant == plant.lowercased() && plant.utf8.count == 36)
        #expect(plant == IdempotencyKeys.plantID(serviceKey: ann) && plant != IdempotencyKeys.plantID(serviceKey: IdempotencyKeys.partKey(ann, part: 0)))
    }

    @Test func whatARequestFindsIsDecidedInOnePlace() {
        let claim = Self.claim()
        let now = Date()
        #expect(IdempotencyDecision.decide(nil, for: claim, now: now) == .proceed)
        let running = IdempotencyRecord(fingerprint: claim.fingerprint, holder: "other", leaseUntil: now.addingTimeInterval(2.5), answer: nil, answered: false)
        #expect(IdempotencyDecision.decide(running, for: claim, now: now) == .running(retryAfter: 3))
        var ended = running
        ended.leaseUntil = now.addingTimeInterval(-1)
        #expect(IdempotencyDecision.decide(ended, for: claim, now: now) == .proceed, "its holder's lease ended: presumed dead")
        let done = IdempotencyRecord(fingerprint: claim.fingerprint, holder: nil, leaseUntil: nil, answer: Self.answer, answered: true)
        #expect(IdempotencyDecision.decide(done, for: claim, now: now) == .replay(Self.answer))
        #expect(
            IdempotencyDecision.decide(
                IdempotencyRecord(fingerprint: claim.fingerprint, holder: nil, leaseUntil: nil, answer: nil, answered: true),
                for: claim, now: now) == .answeredNotKept)
        let other = Self.claim(body: #"{"other":true}"#)
        #expect(IdempotencyDecision.decide(done, for: other, now: now) == .otherRequest)
        #expect(IdempotencyDecision.decide(running, for: other, now: now) == .otherRequest)
    }

    // MARK: - The store

    @Test(arguments: StoreBackend.allCases) func aKeyIsClaimedOnceAnsweredAndReplayedAndEachPersonsAndRoutesAreTheirOwn(_ backend: StoreBackend) async throws {
        try await withStore(backend) { store in
            let now = Date()
            let first = Self.claim()
            #expect(try await store.claim(first, now: now) == .proceed)
            // Running: the same request again waits; another request with the key is refused.
            #expect(try await store.claim(Self.claim(), now: now) == .running(retryAfter: 5))
            #expect(try await store.claim(Self.claim(body: #"{"a":1}"#), now: now) == .otherRequest)
            // Another person's key, and the key on another route, are other keys.
            #expect(try await store.claim(Self.claim("bob"), now: now) == .proceed)
            #expect(try await store.claim(Self.claim(route: "POST /v1/devices"), now: now) == .proceed)
            // Only the holder answers.
            try await store.answer(Self.claim(), with: KeptAnswer(status: 500, headers: [], body: []), now: now)
            #expect(try await store.claim(Self.claim(), now: now) == .running(retryAfter: 5))
            try await store.answer(first, with: Self.answer, now: now)
            #expect(try await store.claim(Self.claim(), now: now.addingTimeInterval(60)) == .replay(Self.answer))
            #expect(try await store.claim(Self.claim(body: #"{"a":1}"#), now: now) == .otherRequest)
            // Kept a day, then gone.
            #expect(try await store.claim(Self.claim(), now: now.addingTimeInterval(IdempotencyKeys.lifetime - 1)) == .replay(Self.answer))
            #expect(try await store.claim(Self.claim(), now: now.addingTimeInterval(IdempotencyKeys.lifetime + 1)) == .proceed)
        }
    }

    @Test(arguments: StoreBackend.allCases) func aKeyLetGoOrWhoseHolderDiedIsRunAgainAndATooLargeAnswerIsNotKept(_ backend: StoreBackend) async throws {
        try await withStore(backend) { store in
            let now = Date()
            let first = Self.claim(lease: 2)
            #expect(try await store.claim(first, now: now) == .proceed)
            try await store.release(Self.claim()) // not the holder: nothing
            #expect(try await store.claim(Self.claim(), now: now) == .running(retryAfter: 2))
            try await store.release(first)
            let second = Self.claim(lease: 2)
            #expect(try await store.claim(second, now: now) == .proceed, "let go (a 5xx): run again")
            // Its edge died: after the lease, a repeat takes it over, and the dead holder cannot answer.
            let third = Self.claim()
            #expect(try await store.claim(third, now: now.addingTimeInterval(3)) == .proceed)
            try await store.answer(second, with: Self.answer, now: now)
            #expect(try await store.claim(Self.claim(), now: now.addingTimeInterval(3)) == .running(retryAfter: 5))
            try await store.answer(third, with: nil, now: now.addingTimeInterval(3))
            #expect(try await store.claim(Self.claim(), now: now.addingTimeInterval(4)) == .answeredNotKept)
        }
    }

    @Test(arguments: StoreBackend.allCases) func oneClaimWinsAmongManyAtOnce(_ backend: StoreBackend) async throws {
        try await withStore(backend) { store in
            let now = Date()
            let decisions = try await withThrowingTaskGroup(of: IdempotencyDecision.self) { group in
                for _ in 0..<16 { group.addTask { try await store.claim(Self.claim(), now: now) } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(decisions.filter { $0 == .proceed }.count == 1)
            #expect(decisions.filter { $0 == .running(retryAfter: 5) }.count == 15)
        }
    }

    @Test(arguments: StoreBackend.allCases) func aPersonsKeysAreBoundedInNumberAndBytesAndForgotten(_ backend: StoreBackend) async throws {
        try await withStore(backend) { store in
            let start = Date()
            // As many done keys as a person may hold: the next one drops the oldest.
            for index in 0..<Self.limits.keysPerPerson {
                let claim = Self.claim(key: "k\(index)")
                let at = start.addingTimeInterval(Double(index) / 1_000)
                #expect(try await store.claim(claim, now: at) == .proceed)
                try await store.answer(claim, with: Self.answer, now: at)
            }
            #expect(try await store.claim(Self.claim(key: "k1"), now: start.addingTimeInterval(2)) == .replay(Self.answer))
            #expect(try await store.claim(Self.claim(key: "new"), now: start.addingTimeInterval(2)) == .proceed)
            #expect(try await store.claim(Self.claim(key: "k0"), now: start.addingTimeInterval(2)) == .proceed, "the oldest went to make room")
            #expect(try await store.claim(Self.claim("bob", key: "k5"), now: start.addingTimeInterval(2)) == .proceed, "another person's keys are not touched")

            // Kept bytes: large answers push the oldest out past the person's bytes.
            let large = KeptAnswer(status: 200, headers: [], body: [UInt8](repeating: 0x61, count: Self.limits.bytesPerPerson / 4))
            let count = 5
            for index in 0..<count {
                let claim = Self.claim("cy", key: "big\(index)")
                let at = start.addingTimeInterval(Double(index))
                #expect(try await store.claim(claim, now: at) == .proceed)
                try await store.answer(claim, with: large, now: at)
            }
            #expect(try await store.claim(Self.claim("cy", key: "big1"), now: start.addingTimeInterval(100)) == .replay(large), "only as many go as must")
            #expect(try await store.claim(Self.claim("cy", key: "big0"), now: start.addingTimeInterval(100)) == .proceed, "pushed out")
            #expect(try await store.claim(Self.claim("cy", key: "big\(count - 1)"), now: start.addingTimeInterval(100)) == .replay(large))

            try await store.forgetKeys(of: "ann")
            #expect(try await store.claim(Self.claim(key: "k1"), now: start.addingTimeInterval(3)) == .proceed)
            #expect(try await store.claim(Self.claim("bob", key: "k5"), now: start.addingTimeInterval(3)) == .running(retryAfter: 5))
        }
    }

    /// Each person's count of keys and bytes as the store keeps it (`idempotencyOwners`), and
    /// as counted from the keys themselves.
    static func counts(_ store: any APIStoring) throws -> (kept: [String: [Int]], counted: [String: [Int]]) {
        let (kept, counted) = (
            "SELECT person, keys, bytes FROM idempotencyOwners",
            "SELECT person, COUNT(*) AS keys, CAST(COALESCE(SUM(bytes), 0) AS BIGINT) AS bytes FROM idempotencyKeys GROUP BY person"
        )
        if let store = store as? SQLiteAPIStore {
            return try store.database.read { db in
                func read(_ sql: String) throws -> [String: [Int]] {
                    Dictionary(uniqueKeysWithValues: try Row.fetchAll(db, sql: sql).map { ($0["person"], [$0["keys"], $0["bytes"]]) })
                }
                return (try read(kept), try read(counted))
            }
        }
        let store = try #require(store as? PostgresAPIStore)
        return try store.database.read { session in
            func read(_ sql: String) throws -> [String: [Int]] {
                Dictionary(
                    uniqueKeysWithValues: try session.rows(PostgresQuery(unsafeSQL: sql)).map {
                        (try $0.column("person").decode(String.self), [try $0.column("keys").decode(Int.self), try $0.column("bytes").decode(Int.self)])
                    })
            }
            return (try read(kept), try read(counted))
        }
    }

    @Test(arguments: StoreBackend.allCases) func eachPersonsCountsStayTrueThroughClaimsAtOnceTheBoundAndExpiry(_ backend: StoreBackend) async throws {
        try await withStore(backend) { store in
            let now = Date()
            // 64 new keys of one person at once, 16 of them let go (a 5xx), the rest answered.
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<64 {
                    group.addTask {
                        let claim = Self.claim(key: "many-\(index)")
                        #expect(try await store.claim(claim, now: now) == .proceed)
                        if index % 4 == 0 { try await store.release(claim) } else { try await store.answer(claim, with: Self.answer, now: now) }
                    }
                }
                try await group.waitForAll()
            }
            var (kept, counted) = try Self.counts(store)
            #expect(kept == counted)
            // Running keys are never dropped; the next claim brings the person back to their bound.
            #expect(try await store.claim(Self.claim(key: "one-more"), now: now.addingTimeInterval(1)) == .proceed)
            (kept, counted) = try Self.counts(store)
            #expect(kept == counted)
            #expect(kept["ann"] == [Self.limits.keysPerPerson, (Self.limits.keysPerPerson - 1) * Self.answer.body.count])
            // A day later: a sweep just before the keys expire, then a claim of an expired key
            // (not swept yet) takes it over; the next sweep takes the rest.
            let swept = now.addingTimeInterval(IdempotencyKeys.lifetime - 10)
            #expect(try await store.claim(Self.claim("bob"), now: swept) == .proceed)
            #expect(try await store.claim(Self.claim(key: "one-more"), now: swept.addingTimeInterval(20)) == .proceed)
            (kept, counted) = try Self.counts(store)
            #expect(kept == counted)
            #expect(kept["ann"] == [Self.limits.keysPerPerson, (Self.limits.keysPerPerson - 1) * Self.answer.body.count])
            #expect(try await store.claim(Self.claim("cy"), now: swept.addingTimeInterval(81)) == .proceed)
            (kept, counted) = try Self.counts(store)
            #expect(kept == counted)
            #expect(kept == ["ann": [1, 0], "bob": [1, 0], "cy": [1, 0]])
            try await store.forgetKeys(of: "ann")
            (kept, counted) = try Self.counts(store)
            #expect(kept == ["bob": [1, 0], "cy": [1, 0]] && counted == kept)
        }
    }

    @Test func twoEdgesClaimingTheSameKeysAtOnceEachKeyRunsOnceAndTheCountsStayTrue() async throws {
        // Two edges on one PostgreSQL, each sending the same 48 keys of three people at once
        // (their batches lock rows in one order: no deadlock between them).
        let (first, place, cleanup) = try await Self.contract.open(.postgres)
        defer { cleanup() }
        let (second, closeSecond) = try await Self.contract.open(at: place)
        defer { closeSecond() }
        let now = Date()
        let decisions = try await withThrowingTaskGroup(of: (String, IdempotencyDecision).self) { group in
            for store in [first, second] {
                for index in 0..<48 {
                    group.addTask {
                        let claim = Self.claim(["ann", "bob", "cy"][index % 3], key: "shared-\(index)")
                        let decision = try await store.claim(claim, now: now)
                        if decision == .proceed { try await store.answer(claim, with: Self.answer, now: now) }
                        return ("\(claim.person) \(claim.key)", decision)
                    }
                }
            }
            return try await group.reduce(into: [String: [IdempotencyDecision]]()) { $0[$1.0, default: []].append($1.1) }
        }
        #expect(decisions.count == 48)
        for (key, made) in decisions {
            #expect(made.filter { $0 == .proceed }.count == 1, "\(key): \(made)")
        }
        let (kept, counted) = try Self.counts(first)
        #expect(kept == counted)
        #expect(kept.values.map { $0[0] }.reduce(0, +) == 48)
    }
}
