import CanopyMessages
import CanopyServiceKit
import CanopyStore
import CanopyTesting
import Foundation
import Logging
import Testing

@testable import CanopyAPI

/// Revoked tokens and people signed out everywhere (`canopy-api token revoke`): kept in
/// canopy-api's store (SQLite, or PostgreSQL shared by every edge) and honoured at once,
/// also for a token the edge had verified and remembered.
@Suite(.serialized)
struct RevocationTests {
    static let key = Array("the key Canopy signs its own tokens with in these tests".utf8)

    static let contract = StoreContract<any APIStoring>(
        "revocations", sqlite: { try await openAPIStore(directory: $0.url, postgres: nil, logger: Logger(label: "test")) }
    ) {
        url, directory in
        let store = try await PostgresAPIStore.open(url: url, poolSize: 2, logger: Logger(label: "test"))
        return (store, store.database.close)
    }

    func withStore(_ backend: StoreBackend, _ body: (any RevocationStoring, TemporaryDirectory) async throws -> Void) async throws {
        let (store, place, cleanup) = try await Self.contract.open(backend)
        defer { cleanup() }
        try await body(store, place.directory)
    }

    @Test(arguments: StoreBackend.allCases) func aRevokedTokenAndASignedOutPersonAreRefusedAtOnceOnEveryEdge(_ backend: StoreBackend) async throws {
        try await withStore(backend) { store, _ in
            // Two edges watching one store.
            let logger = Logger(label: "test")
            let watchers = try (0..<2).map { _ in try RevocationWatcher(store: store, logger: logger) }
            let group = serviceGroup(watchers, signals: [], logger: logger)
            let running = Task { try await group.run() }
            defer { running.cancel() }
            let edges = try watchers.map { try TokenAuthority(keys: [Self.key], revocations: $0) }
            let issuer = try TokenAuthority(keys: [Self.key])
            let ann = try await issuer.issue(user: "ann", lifetime: .seconds(3_600))
            let annAgain = try await issuer.issue(user: "ann", lifetime: .seconds(3_600))
            let bob = try await issuer.issue(user: "bob", lifetime: .seconds(3_600), now: Date().addingTimeInterval(-5))
            for edge in edges { // verified, remembered
                #expect(await edge.user(of: ann) == "ann")
                #expect(await edge.user(of: annAgain) == "ann")
                #expect(await edge.user(of: bob) == "bob")
            }

            // One token revoked by its id: refused on both edges within the watch interval; the other stays.
            let identity = try #require(await issuer.identity(of: ann))
            try store.revoke(id: try #require(identity.id), until: identity.expires)
            for edge in edges {
                #expect(try await eventually(within: .seconds(5), every: .milliseconds(20)) { await edge.user(of: ann) == nil })
                #expect(await edge.user(of: annAgain) == "ann")
            }

            // Bob signed out everywhere: his tokens issued before are refused, one issued after is taken.
            try store.signOut(digest: SignOutDigest(tokenKeys: [Self.key]).record("bob"), before: Date(), erasure: false)
            for edge in edges {
                #expect(try await eventually(within: .seconds(5), every: .milliseconds(20)) { await edge.user(of: bob) == nil })
            }
            let later = try await issuer.issue(user: "bob", lifetime: .seconds(3_600), now: Date().addingTimeInterval(2))
            #expect(await edges[0].user(of: later) == "bob")
            #expect(try store.load(now: Date()).tokens.count == 1)
            await group.triggerGracefulShutdown()
        }
    }

    /// An account deletion's sign-out is listed among the erasures (its digest, the second),
    /// once however often it is recorded; a plain sign-out everywhere is not.
    @Test(arguments: StoreBackend.allCases) func anAccountDeletionIsListedAmongTheErasuresByItsDigestOnly(_ backend: StoreBackend) async throws {
        try await withStore(backend) { store, _ in
            let digests = SignOutDigest(tokenKeys: [Self.key])
            let at = Date(timeIntervalSince1970: 1_790_000_000.75)
            try store.signOut(digest: digests.record("signed-out-only"), before: at, erasure: false)
            try store.signOut(digest: digests.record("erased"), before: at, erasure: true)
            try store.signOut(digest: digests.record("erased"), before: at.addingTimeInterval(30), erasure: true) // the deletion retried
            let erasures = try store.erasures()
            #expect(erasures == [Erasure(digest: digests.record("erased"), at: Date(timeIntervalSince1970: 1_790_000_000))])
            #expect(try store.load(now: at).signedOut.count == 2)
        }
    }

    /// A sign-out an older canopy-api recorded under the person's id is kept, under the
    /// person's digest instead, once an edge starts: the id leaves the store, the sign-out holds.
    @Test(arguments: StoreBackend.allCases) func aSignOutRecordedUnderAPersonsIdIsDigestedAndStillHolds(_ backend: StoreBackend) async throws {
        try await withStore(backend) { store, _ in
            let at = Date().addingTimeInterval(60).timeIntervalSince1970.rounded(.down)
            switch store {
            case let sqlite as SQLiteAPIStore:
                try await sqlite.database.write { db in try db.execute(sql: "INSERT INTO signedOut VALUES ('dora', ?, 0)", arguments: [at]) }
            case let postgres as PostgresAPIStore:
                try postgres.database.write { session in _ = try session.execute("INSERT INTO signedOut VALUES ('dora', \(at), 0)") }
            default:
                Issue.record("a store of another kind")
            }
            let digest = SignOutDigest(tokenKeys: [Self.key])
            try store.digestLegacySignOuts(digest)
            let loaded = try store.load(now: Date())
            #expect(loaded.signedOut == [digest.record("dora"): Date(timeIntervalSince1970: at)])
            let edge = try TokenAuthority(keys: [Self.key], revocations: try RevocationWatcher(store: store, logger: Logger(label: "test")))
            let token = try await TokenAuthority(keys: [Self.key]).issue(user: "dora", lifetime: .seconds(600))
            #expect(await edge.user(of: token) == nil, "her sign-out still holds")
            try store.digestLegacySignOuts(digest) // nothing left to do
            #expect(try store.load(now: Date()).signedOut.count == 1)
        }
    }

    @Test func aRevocationEndsWhenItsTokenWouldHaveAndTheRevokeCommandSaysWhatItDid() async throws {
        try await withStore(.sqlite) { store, directory in
            try store.revoke(id: "gone", until: Date().addingTimeInterval(-1))
            try store.revoke(id: "kept", until: Date().addingTimeInterval(60))
            #expect(try store.load(now: Date()).tokens.keys.sorted() == ["kept"], "a revocation past its token's end is forgotten")

            // The command, as an operator runs it.
            let keyFile = directory.path("token.key")
            try Data(Self.key).write(to: URL(fileURLWithPath: keyFile))
            let token = try await TokenAuthority(keys: [Self.key]).issue(user: "cy", lifetime: .seconds(600))
            let data = directory.url.path
            let revoke = try await runExecutable("canopy-api", ["token", "revoke", "--token", token, "--token-key-file", keyFile, "--data-dir", data])
            #expect(revoke.status == 0 && revoke.output.contains("revoked token") && revoke.output.contains("of cy"), "\(revoke.output) \(revoke.errors)")
            let signOut = try await runExecutable(
                "canopy-api", ["token", "revoke", "--user", "apple:000123.abc", "--token-key-file", keyFile, "--data-dir", data])
            #expect(signOut.status == 0 && signOut.output.contains("signed apple:000123.abc out everywhere"), "\(signOut.errors)")
            let onDisk = try await openAPIStore(directory: directory.url.appendingPathComponent("api"), postgres: nil, logger: Logger(label: "test"))
            let loaded = try onDisk.load(now: Date())
            // The store names the person by a keyed digest, never by their id.
            #expect(loaded.tokens.count == 1 && loaded.signedOut[SignOutDigest(tokenKeys: [Self.key]).record("apple:000123.abc")] != nil)
            #expect(loaded.signedOut["apple:000123.abc"] == nil)
            let forged = try await TokenAuthority(keys: [Array("another key entirely, long enough to sign".utf8)]).issue(user: "cy", lifetime: .seconds(60))
            let refused = try await runExecutable("canopy-api", ["token", "revoke", "--token", forged, "--token-key-file", keyFile, "--data-dir", data])
            #expect(refused.status != 0 && refused.errors.contains("not one of Canopy's valid ones"), "\(refused.errors)")
            let neither = try await runExecutable("canopy-api", ["token", "revoke", "--data-dir", data])
            #expect(neither.status != 0 && neither.errors.contains("give one of --token TOKEN, --jti ID or --user ID"))
        }
    }
}
