import CanopyMessages
import CanopyOutbound
import Foundation
import NIOCore
import Testing

@testable import CanopyImages

/// Remote fetches against a local server (no test reaches the internet).
@Suite(.serialized)
struct RemoteFetchTests {
    let photo = Fixture.jpeg

    func fetcher(_ configure: (inout RemoteFetcher.Policy) -> Void = { _ in }) throws -> RemoteFetcher {
        var policy = RemoteFetcher.Policy()
        policy.allowedHosts = ["127.0.0.1"] // the local server stands in for a public host
        policy.retryDelays = [.milliseconds(20), .milliseconds(40), .milliseconds(80)]
        configure(&policy)
        return try RemoteFetcher(policy: policy)
    }

    func withServer(_ routes: [String: TestHTTPServer.Route], _ body: (TestHTTPServer) async throws -> Void) async throws {
        let server = try await TestHTTPServer(routes: routes)
        do {
            try await body(server)
            await server.stop()
        } catch {
            await server.stop()
            throw error
        }
    }

    @Test func fetchesAPhotoAndStoresItLikeAnUpload() async throws {
        try await withServer(["/monstera.jpg": .body(photo)]) { server in
            var configuration = ImageLibrary.Configuration()
            configuration.fetch.allowedHosts = ["127.0.0.1"]
            let library = try ImageLibrary(directory: Fixture.directory(), configuration: configuration)
            let stored = try await library.fetch(server.url("/monstera.jpg"), owner: "alice", plantID: "p1")
            #expect(stored.sha256 == ImageLibrary.sha256(photo))
            #expect(try library.list(owner: "alice", plantID: "p1").count == 1)
        }
    }

    @Test func loopbackAndPrivateAddressesAreRefusedByDefault() async throws {
        try await withServer(["/a.jpg": .body(photo)]) { server in
            let strict = try fetcher { $0.allowedHosts = [] }
            for url in [
                server.url("/a.jpg"), server.url("/a.jpg", host: "localhost"), "http://169.254.169.254/latest/meta-data", "http://10.1.2.3/x.jpg",
                "http://[::1]:\(server.port)/a.jpg",
            ] {
                let error = await #expect(throws: CanopyError.self) { _ = try await strict.fetch(url) }
                #expect(error?.code == .badRequest, "\(url)")
            }
            #expect(server.counters.withLock { $0.requests.isEmpty }, "nothing reached the server")
        }
    }

    @Test func aRedirectIsCheckedLikeTheFirstURL() async throws {
        try await withServer([:]) { target in
            try await withServer([
                "/ok": .redirect("/final.jpg"),
                "/final.jpg": .body(photo),
                "/sneaky": .redirect(target.url("/x.jpg", host: "localhost")),
                "/ftp": .redirect("ftp://example.org/x.jpg"),
            ]) { server in
                let fetcher = try fetcher()
                #expect(try await fetcher.fetch(server.url("/ok")) == photo)
                let sneaky = await #expect(throws: CanopyError.self) { _ = try await fetcher.fetch(server.url("/sneaky")) }
                #expect(sneaky?.code == .badRequest)
                #expect(target.counters.withLock { $0.requests.isEmpty })
                let ftp = await #expect(throws: CanopyError.self) { _ = try await fetcher.fetch(server.url("/ftp")) }
                #expect(ftp?.code == .badRequest)
            }
        }
    }

    @Test func failuresAreRetriedWithExponentialBackoffThenGivenUp() async throws {
        try await withServer(["/flaky.jpg": .failing(times: 2, then: photo), "/down.jpg": .status(503), "/gone.jpg": .status(404)]) { server in
            let fetcher = try fetcher()
            #expect(try await fetcher.fetch(server.url("/flaky.jpg")) == photo)
            #expect(server.counters.withLock { $0.requests["/flaky.jpg"] } == 3)

            let down = await #expect(throws: CanopyError.self) { _ = try await fetcher.fetch(server.url("/down.jpg")) }
            #expect(down?.message.contains("gave up after 4 attempts") == true)
            let times = server.counters.withLock { $0.times.suffix(4) }
            let gaps = zip(times.dropFirst(), times).map { $0 - $1 }
            #expect(gaps.count == 3)
            #expect(gaps[0] >= .milliseconds(20) && gaps[1] >= .milliseconds(40) && gaps[2] >= .milliseconds(80), "\(gaps)")

            let gone = await #expect(throws: CanopyError.self) { _ = try await fetcher.fetch(server.url("/gone.jpg")) }
            #expect(gone?.code == .badRequest)
            #expect(server.counters.withLock { $0.requests["/gone.jpg"] } == 1, "a 404 is not retried")
        }
    }

    @Test func atMostThreeFetchesReachOneHostAtOnce() async throws {
        // Each answer takes long enough that three are in the air together even when a parallel
        // test run delays the fetcher's tasks (150 ms was not, on two busy cores).
        try await withServer(["/slow.jpg": .slow(.milliseconds(600), photo)]) { server in
            let fetcher = try fetcher()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<9 { group.addTask { _ = try await fetcher.fetch(server.url("/slow.jpg")) } }
                try await group.waitForAll()
            }
            #expect(server.counters.withLock { $0.most } == 3)
            #expect(server.counters.withLock { $0.requests["/slow.jpg"] } == 9)
        }
    }

    @Test func slowServersTimeOutAndLargeBodiesAreRefused() async throws {
        try await withServer(["/stuck.jpg": .slow(.seconds(5), photo), "/big.jpg": .body([UInt8](repeating: 1, count: 4_000))]) { server in
            let impatient = try fetcher {
                $0.totalTimeout = .milliseconds(200)
                $0.retryDelays = []
                $0.maximumBytes = 1_000
            }
            let started = ContinuousClock.now
            let slow = await #expect(throws: CanopyError.self) { _ = try await impatient.fetch(server.url("/stuck.jpg")) }
            #expect(slow?.code == .timeout)
            // Given up before the server answers (at 5 s): not a bound on how fast, which a
            // machine busy with other suites cannot keep.
            #expect(ContinuousClock.now - started < .seconds(5))
            let big = await #expect(throws: CanopyError.self) { _ = try await impatient.fetch(server.url("/big.jpg")) }
            #expect(big?.code == .tooLarge)
        }
    }

    @Test(arguments: [
        ("127.0.0.1", true), ("127.8.8.8", true), ("10.0.0.1", true), ("172.16.0.1", true), ("172.31.255.255", true), ("172.32.0.1", false),
        ("192.168.1.1", true), ("169.254.169.254", true), ("100.64.0.1", true), ("0.0.0.0", true), ("224.0.0.1", true),
        ("8.8.8.8", false), ("93.184.216.34", false),
        ("::1", true), ("fe80::1", true), ("fd00::1", true), ("::ffff:10.0.0.1", true), ("::ffff:8.8.8.8", false), ("2001:4860:4860::8888", false),
        // IPv6 forms of internal IPv4 addresses: IPv4-compatible, NAT64, local-use NAT64, 6to4, Teredo.
        ("::a9fe:a9fe", true), ("::8.8.8.8", true), ("64:ff9b::a9fe:a9fe", true), ("64:ff9b::808:808", false), ("64:ff9b:1::1", true),
        ("2002:a9fe:a9fe::1", true), ("2002:808:808::1", false), ("2001:0:4136:e378::1", true), ("fec0::1", true), ("2001:db8::1", true),
        ("198.18.0.1", true), ("192.0.0.8", true),
    ])
    func theOneAddressPolicy(address: String, isInternal: Bool) throws {
        #expect(PublicAddress.isInternal(try SocketAddress(ipAddress: address, port: 80)) == isInternal)
    }
}
