import CanopyCare
import CanopyMessages
import CanopyOutbound
import CanopyServiceKit
import CanopyTesting
import Crypto
import Foundation
import Hummingbird
import JWTKit
import Logging
import NIOCore
import NIOHTTP1
import Synchronization
import Testing

@testable import CanopyAPI

/// Tokens from Sign in with Apple and OpenID Connect providers, checked against a local
/// provider; and Canopy's own keys rotated.
@Suite(.serialized)
struct TrustedIssuerTests {
    static let ownKey = Array("the key Canopy signs its own tokens with, long enough".utf8)

    /// A provider running, and an authority that trusts it.
    func withProvider(minimumRefresh: Duration = .seconds(60), _ body: (LocalOpenIDProvider, TokenAuthority, String) async throws -> Void) async throws {
        var logger = Logger(label: "test")
        logger.logLevel = .warning
        let provider = LocalOpenIDProvider()
        let serving = serviceGroup([provider.application], signals: [], logger: logger)
        let server = Task { try await serving.run() }
        defer { server.cancel() }
        let issuer = try await provider.issuer()
        try await provider.addUsualKeys()
        var outbound = PinnedHTTP.Settings()
        outbound.allowedHosts = ["127.0.0.1"]
        let authority = try TokenAuthority(
            keys: [Self.ownKey], issuers: [TrustedIssuer(issuer: issuer, audiences: ["org.canopy.app"], prefix: "local")],
            http: try PinnedHTTP(settings: outbound), minimumRefresh: minimumRefresh)
        #expect(await authority.loadIssuerKeys().isEmpty)
        try await body(provider, authority, issuer)
        await serving.triggerGracefulShutdown()
        _ = try? await server.value
    }

    @Test func tokensOfEachAlgorithmAreTakenAndNameThePersonUnderTheIssuersPrefix() async throws {
        try await withProvider { provider, authority, _ in
            for kid in ["rsa-1", "ec-1", "ed-1"] {
                let token = try await provider.token(kid: kid)
                #expect(await authority.user(of: token) == "local:000123.a1b2c3", "\(kid)")
            }
            #expect(provider.keySetFetches == 1, "found by discovery once, kept")
            // Canopy's own go on as before.
            let own = try await TokenAuthority(key: Self.ownKey).issue(user: "user-42", lifetime: .seconds(60))
            #expect(await authority.user(of: own) == "user-42")
        }
    }

    @Test func wrongAudienceIssuerTimesAndASwappedAlgorithmAreRefused() async throws {
        try await withProvider { provider, authority, issuer in
            #expect(await authority.user(of: try await provider.token(kid: "rsa-1", audience: "com.someone.else")) == nil, "another app's token")
            #expect(await authority.user(of: try await provider.token(kid: "rsa-1", issuer: "https://evil.example")) == nil, "an issuer not trusted")
            #expect(await authority.user(of: try await provider.token(kid: "rsa-1", issuer: issuer + "/")) == nil, "iss must match exactly")
            #expect(await authority.user(of: try await provider.token(kid: "rsa-1", expires: -120)) == nil, "expired beyond the leeway")
            #expect(await authority.user(of: try await provider.token(kid: "rsa-1", expires: -10)) != nil, "within the leeway")
            #expect(await authority.user(of: try await provider.token(kid: "rsa-1", notBefore: 300)) == nil, "not yet valid")
            #expect(await authority.user(of: try await provider.token(kid: "rsa-1", subject: String(repeating: "x", count: 200))) == nil, "too long a person")

            // The RSA key's public half used as an HS256 secret, under its kid.
            let published = try #require(provider.published.first { $0["kid"] == "rsa-1" })
            for secret in [Array((published["n"] ?? "").utf8), Array(try Insecure.RSA.PrivateKey(pem: TestRSAKeys.key1).publicKey.pemRepresentation.utf8)] {
                let forger = JWTKeyCollection()
                await forger.add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256, kid: "rsa-1")
                let now = Date()
                let claims = LocalOpenIDProvider.Claims(
                    iss: IssuerClaim(value: issuer), sub: SubjectClaim(value: "mallory"), aud: AudienceClaim(value: "org.canopy.app"),
                    exp: ExpirationClaim(value: now.addingTimeInterval(600)), iat: IssuedAtClaim(value: now))
                #expect(await authority.user(of: try await forger.sign(claims, kid: "rsa-1")) == nil, "the algorithm is the key's")
            }
            // An ES256 key offered for an RS256 header, and a token with no kid.
            let es = try await provider.token(kid: "ec-1")
            let header = Array(es.split(separator: "."))[0]
            let swapped = Self.base64URL(#"{"alg":"RS256","kid":"ec-1","typ":"JWT"}"#) + es.dropFirst(header.count)
            #expect(await authority.user(of: String(swapped)) == nil)
            let unsigned = Self.base64URL(#"{"alg":"none","typ":"JWT"}"#) + "." + String(es.split(separator: ".")[1]) + "."
            #expect(await authority.user(of: unsigned) == nil, "alg none")
        }
    }

    @Test func aRotatedKeyIsFetchedOnceAndAStormOfUnknownKidsFetchesAtMostOnce() async throws {
        try await withProvider(minimumRefresh: .seconds(60)) { provider, authority, issuer in
            #expect(provider.keySetFetches == 1)
            // The provider rotates: a new key published, the old one withdrawn.
            try await provider.addRSA(TestRSAKeys.key2, kid: "rsa-2")
            provider.withdraw("rsa-1")
            let fresh = try await provider.token(kid: "rsa-2")
            #expect(await authority.user(of: fresh) == "local:000123.a1b2c3", "an unknown kid fetches the keys again")
            #expect(provider.keySetFetches == 2)
            // A storm of made-up kids: no fetch within the minimum refresh.
            await withTaskGroup(of: Void.self) { group in
                for index in 0..<200 {
                    group.addTask {
                        var token = (try? await provider.token(kid: "rsa-2")) ?? ""
                        let parts = token.split(separator: ".").map(String.init)
                        token = Self.base64URL(#"{"alg":"RS256","kid":"made-up-\#(index)","typ":"JWT"}"#) + "." + parts[1] + "." + parts[2]
                        _ = await authority.user(of: token)
                    }
                }
            }
            #expect(provider.keySetFetches == 2, "\(provider.keySetFetches) fetches: random kids must not hammer the provider")
            #expect(await authority.keyFetches(issuer) == 2)
        }
    }

    @Test func whenTheProviderGoesAwayTheLastGoodKeysStay() async throws {
        try await withProvider(minimumRefresh: .milliseconds(50)) { provider, authority, issuer in
            provider.goAway()
            // A token naming an unknown key makes the edge try (once the interval allows);
            // the provider does not answer.
            let unknown = try await provider.token(kid: "ec-1").split(separator: ".").map(String.init)
            let retry = Self.base64URL(#"{"alg":"ES256","kid":"ec-9","typ":"JWT"}"#) + "." + unknown[1] + "." + unknown[2]
            let before = await authority.keyFetches(issuer)
            let asked = try await eventually {
                guard await authority.user(of: retry) == nil else { return true } // taken: fails below
                return await authority.keyFetches(issuer) > before
            }
            #expect(asked, "the edge asked the provider again")
            #expect(await authority.user(of: retry) == nil)
            // Tokens of the keys it had go on being taken.
            #expect(await authority.user(of: try await provider.token(kid: "ec-1", subject: "after")) == "local:after")
            provider.comeBack()
        }
    }

    @Test func canopysOwnKeysRotateTheNewestSignsAndARemovedOnesTokensEnd() async throws {
        let old = Array("the old key Canopy signed its tokens with, long enough".utf8)
        let new = Array("the new key Canopy signs its tokens with, also long enough".utf8)
        let before = try await TokenAuthority(key: old).issue(user: "ann", lifetime: .seconds(600))
        let rotated = try TokenAuthority(keys: [new, old])
        let after = try await rotated.issue(user: "bob", lifetime: .seconds(600))
        #expect(await rotated.user(of: before) == "ann", "the old key still verifies")
        #expect(await rotated.user(of: after) == "bob")
        let oldOnly = try TokenAuthority(key: old)
        #expect(await oldOnly.user(of: after) == nil, "the new key signs")
        let removed = try TokenAuthority(keys: [new])
        #expect(await removed.user(of: before) == nil, "a removed key's tokens end")
        #expect(await removed.user(of: after) == "bob")
        // Each token names its key and has an id of its own.
        let header = try #require(Data(base64Encoded: Self.padded(String(after.split(separator: ".")[0]))))
        #expect(String(decoding: header, as: UTF8.self).contains("\"kid\""))
        let payload = try #require(Data(base64Encoded: Self.padded(String(after.split(separator: ".")[1]))))
        #expect(String(decoding: payload, as: UTF8.self).contains("\"jti\""))
    }

    /// Over HTTP: a provider's token is a person of the API, whose data is theirs alone.
    @Test func theAPITakesAProvidersTokenAsAPersonOfItsOwn() async throws {
        try await withProvider { provider, _, issuer in
            let directory = try TemporaryDirectory("api-oidc")
            defer { directory.remove() }
            try await withTestBus(.inProcess) { bus in
                try await bus.start(CareServiceSettings(directory: directory.url.appendingPathComponent("care"), runner: bus.runnerConfiguration()))
                let stack = try await LiveAPITests.APITests.startAPI(on: bus) { settings in
                    settings.trustedIssuers = [TrustedIssuer(issuer: issuer, audiences: ["org.canopy.app"], prefix: "local")]
                    settings.jwksAllowedHosts = ["127.0.0.1"]
                }
                let alice = try await provider.token(kid: "ec-1", subject: "alice")
                let added = try await stack.send(.POST, "/v1/plants", token: alice, json: #"{"scientificName":"Monstera deliciosa","customName":"Monty"}"#)
                #expect(added.status == 201, "\(String(decoding: added.body, as: UTF8.self))")
                let mine = try await stack.send(.GET, "/v1/plants", token: alice)
                #expect((mine.object["plants"] as? [[String: Any]])?.count == 1)
                // Canopy's own user "alice" is another person than the provider's alice.
                let own = try await stack.send(.GET, "/v1/plants", as: "alice")
                #expect((own.object["plants"] as? [[String: Any]])?.isEmpty == true)
                let foreign = try await stack.send(.GET, "/v1/plants", token: try await provider.token(kid: "ec-1", audience: "another.app"))
                #expect(foreign.status == 401)
            }
        }
    }

    /// Keys are kept as long as the provider's cache headers say, within a minute and a day.
    @Test func theKeysCacheHeadersAreRead() {
        #expect(IssuerKeys.maxAge(["Cache-Control": "public, max-age=21600, must-revalidate"]) == 21_600)
        #expect(IssuerKeys.maxAge(["Cache-Control": "no-cache"]) == nil)
        #expect(IssuerKeys.maxAge([:]) == nil)
        #expect(IssuerKeys.freshness == 60...86_400 && IssuerKeys.defaultFreshness == 3_600)
    }

    @Test func aTrustedIssuersFileIsCheckedWithASentence() throws {
        let directory = try TemporaryDirectory("issuers")
        defer { directory.remove() }
        for (content, problem) in [
            (#"{"issuers":[{"issuer":"http://idp.example","audiences":["a"],"prefix":"x"}]}"#, "is not an https URL"),
            (#"{"issuers":[{"issuer":"https://idp.example","audiences":[],"prefix":"x"}]}"#, "audiences names 1 to 16"),
            (#"{"issuers":[{"issuer":"https://idp.example","audiences":["a"],"prefix":"X Y"}]}"#, "prefix is 1 to 32"),
            (
                #"{"issuers":[{"issuer":"https://a.example","audiences":["a"],"prefix":"x"},{"issuer":"https://b.example","audiences":["a"],"prefix":"x"}]}"#,
                "the prefix 'x'"
            ),
            ("not json", "is not a trusted issuers file"),
        ] {
            let file = directory.path("issuers-\(problem.count).json")
            try content.write(toFile: file, atomically: true, encoding: .utf8)
            #expect(throws: CanopyError.self) { try TrustedIssuer.load(file: file) }
            do { _ = try TrustedIssuer.load(file: file) } catch { #expect(error.message.contains(problem), "\(error.message)") }
        }
        let apple = directory.path("apple.json")
        try
            #"{"issuers":[{"issuer":"https://appleid.apple.com","jwksURL":"https://appleid.apple.com/auth/keys","audiences":["org.canopy.app"],"prefix":"apple"}]}"#
            .write(toFile: apple, atomically: true, encoding: .utf8)
        #expect(try TrustedIssuer.load(file: apple).map(\.prefix) == ["apple"])
    }

    static func base64URL(_ text: String) -> String { LocalOpenIDProvider.base64URL(Data(text.utf8)) }

    static func padded(_ text: String) -> String {
        var text = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while text.count % 4 != 0 { text += "=" }
        return text
    }
}
