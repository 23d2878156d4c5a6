import CanopyMessages
import CanopyBus
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// Fetches a photo from a remote http(s) URL, safely:
/// - at most `maximumPerHost` fetches per origin host at once (more wait their turn);
/// - a connect timeout and a total timeout per attempt;
/// - on a failure that may pass (connection errors, timeouts, 5xx, 429) it tries again after
///   1 s, 2 s and 4 s, then gives up;
/// - the host is resolved here and only addresses that are not loopback, link-local,
///   private, shared or multicast are connected to, and the address actually connected to is
///   checked again (so DNS tricks do not get through); hosts named in `allowedHosts` skip
///   the check;
/// - redirects are followed (at most 5), each one checked like the first URL;
/// - the body is cut off past `maximumBytes`.
final class RemoteFetcher: Sendable {
    struct Policy: Sendable {
        var maximumPerHost = 3
        var connectTimeout: Duration = .seconds(5)
        var totalTimeout: Duration = .seconds(30)
        var retryDelays: [Duration] = [.seconds(1), .seconds(2), .seconds(4)]
        var maximumRedirects = 5
        var maximumBytes = ImageProcessor.Limits.defaultMaximumBytes
        /// Hosts (as written in URLs) that may resolve to any address.
        var allowedHosts: Set<String> = []
    }

    let policy: Policy
    private let group: any EventLoopGroup
    private let limiter: ConcurrencyLimiter<String>
    private let tls: NIOSSLContext

    init(policy: Policy = Policy(), group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) throws {
        self.policy = policy
        self.group = group
        limiter = ConcurrencyLimiter(maximum: policy.maximumPerHost)
        tls = try NIOSSLContext(configuration: .makeClientConfiguration())
    }

    /// The body at `url`, after redirects and retries.
    func fetch(_ url: String) async throws -> [UInt8] {
        var attempt = 0
        while true {
            do {
                return try await fetchFollowingRedirects(url)
            } catch let failure as Failure where failure.retryable && attempt < policy.retryDelays.count {
                try await Task.sleep(for: policy.retryDelays[attempt])
                attempt += 1
            } catch let failure as Failure {
                throw failure.error(after: attempt + 1)
            }
        }
    }

    /// Why one attempt failed.
    struct Failure: Error {
        var code: CanopyError.Code
        var message: String
        var retryable: Bool

        func error(after attempts: Int) -> CanopyError {
            CanopyError(code, retryable ? "\(message) (gave up after \(attempts) attempts)" : message)
        }
    }

    private func fetchFollowingRedirects(_ start: String) async throws -> [UInt8] {
        var location = start
        for _ in 0...policy.maximumRedirects {
            let target = try Target(location)
            let response = try await limiter.run(target.host) { try await self.get(target) }
            switch response.status.code {
            case 200:
                return response.body
            case 301, 302, 303, 307, 308:
                guard let next = response.headers.first(name: "location"),
                      let resolved = URL(string: next, relativeTo: URL(string: location))?.absoluteString
                else { throw Failure(code: .badRequest, message: "\(location) redirects without a Location", retryable: false) }
                location = resolved
            case 429, 500...599:
                throw Failure(code: .internal, message: "\(target.host) answered \(response.status.code)", retryable: true)
            default:
                throw Failure(code: .badRequest, message: "\(location) answered \(response.status.code) \(response.status.reasonPhrase)", retryable: false)
            }
        }
        throw Failure(code: .badRequest, message: "\(start) redirects more than \(policy.maximumRedirects) times", retryable: false)
    }

    /// A URL this fetcher will try.
    struct Target {
        var secure: Bool
        var host: String
        var port: Int
        var pathAndQuery: String

        init(_ text: String) throws {
            guard let url = URL(string: text), let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https",
                  let host = url.host, !host.isEmpty
            else { throw Failure(code: .badRequest, message: "'\(text.prefix(200))' is not an http(s) URL", retryable: false) }
            secure = scheme == "https"
            self.host = host.lowercased()
            port = url.port ?? (secure ? 443 : 80)
            let path = url.path.isEmpty ? "/" : url.path
            pathAndQuery = url.query.map { "\(path)?\($0)" } ?? path
        }
    }

    struct Response: Sendable {
        var status: HTTPResponseStatus
        var headers: HTTPHeaders
        var body: [UInt8]
    }

    private func get(_ target: Target) async throws -> Response {
        let trusted = policy.allowedHosts.contains(target.host)
        let addresses = try await resolve(target.host, port: target.port)
        let candidates = trusted ? addresses : addresses.filter { !AddressPolicy.isForbidden($0) }
        guard let address = candidates.first else {
            throw Failure(code: .badRequest, message: "\(target.host) resolves only to loopback, link-local or private addresses; fetching from there is refused", retryable: false)
        }
        let promise = group.next().makePromise(of: Response.self)
        let limit = policy.maximumBytes
        let tls = self.tls
        let bootstrap = ClientBootstrap(group: group)
            .connectTimeout(.milliseconds(policy.connectTimeout.wholeMilliseconds))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if target.secure {
                        try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: tls, serverHostname: target.host))
                    }
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    try channel.pipeline.syncOperations.addHandler(ResponseCollector(promise: promise, limit: limit))
                }
            }
        let channel: any Channel
        do {
            channel = try await bootstrap.connect(to: address).get()
        } catch {
            promise.fail(error)
            throw Failure(code: .internal, message: "cannot connect to \(target.host): \(error)", retryable: true)
        }
        // The address actually connected to is checked again.
        if !trusted, let remote = channel.remoteAddress, AddressPolicy.isForbidden(remote) {
            channel.close(promise: nil)
            promise.fail(ChannelError.ioOnClosedChannel)
            throw Failure(code: .badRequest, message: "\(target.host) connected to a private address; refused", retryable: false)
        }
        let timeout = channel.eventLoop.scheduleTask(in: .milliseconds(policy.totalTimeout.wholeMilliseconds)) {
            promise.fail(Failure(code: .timeout, message: "\(target.host) did not answer within \(self.policy.totalTimeout)", retryable: true))
            channel.close(promise: nil)
        }
        var head = HTTPRequestHead(version: .http1_1, method: .GET, uri: target.pathAndQuery)
        head.headers.add(name: "Host", value: target.port == (target.secure ? 443 : 80) ? target.host : "\(target.host):\(target.port)")
        head.headers.add(name: "User-Agent", value: "canopy-images")
        head.headers.add(name: "Accept", value: "image/jpeg, image/png, image/webp, image/heif")
        head.headers.add(name: "Connection", value: "close")
        channel.write(HTTPClientRequestPart.head(head), promise: nil)
        channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
        defer {
            timeout.cancel()
            channel.close(promise: nil)
        }
        do {
            return try await promise.futureResult.get()
        } catch let failure as Failure {
            throw failure
        } catch {
            throw Failure(code: .internal, message: "\(target.host): \(error)", retryable: true)
        }
    }

    private func resolve(_ host: String, port: Int) async throws -> [SocketAddress] {
        try await Task.detached {
            var hints = addrinfo()
            hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
            var result: UnsafeMutablePointer<addrinfo>?
            guard getaddrinfo(host, String(port), &hints, &result) == 0, let first = result else {
                throw Failure(code: .badRequest, message: "cannot resolve \(host)", retryable: true)
            }
            defer { freeaddrinfo(result) }
            var addresses: [SocketAddress] = []
            var cursor: UnsafeMutablePointer<addrinfo>? = first
            while let entry = cursor {
                if let sockaddr = entry.pointee.ai_addr {
                    switch Int32(entry.pointee.ai_family) {
                    case AF_INET:
                        addresses.append(sockaddr.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { SocketAddress($0.pointee, host: host) })
                    case AF_INET6:
                        addresses.append(sockaddr.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { SocketAddress($0.pointee, host: host) })
                    default: break
                    }
                }
                cursor = entry.pointee.ai_next
            }
            return addresses
        }.value
    }
}

/// Which addresses a fetch must not reach.
enum AddressPolicy {
    /// Loopback, link-local, private (RFC 1918, unique local), shared (CGNAT), unspecified,
    /// multicast and broadcast addresses, IPv4-mapped ones included.
    static func isForbidden(_ address: SocketAddress) -> Bool {
        switch address {
        case .v4(let v4):
            return isForbidden(ipv4: UInt32(bigEndian: v4.address.sin_addr.s_addr))
        case .v6(let v6):
            let bytes = withUnsafeBytes(of: v6.address.sin6_addr) { Array($0) }
            if bytes[0..<10].allSatisfy({ $0 == 0 }) && bytes[10] == 0xFF && bytes[11] == 0xFF {
                return isForbidden(ipv4: bytes[12..<16].reduce(0) { $0 << 8 | UInt32($1) })
            }
            if bytes[0..<15].allSatisfy({ $0 == 0 }) { return true } // :: and ::1
            if bytes[0] == 0xFE && bytes[1] & 0xC0 == 0x80 { return true } // fe80::/10 link-local
            if bytes[0] & 0xFE == 0xFC { return true } // fc00::/7 unique local
            if bytes[0] == 0xFF { return true } // multicast
            return false
        case .unixDomainSocket:
            return true
        }
    }

    static func isForbidden(ipv4 address: UInt32) -> Bool {
        func within(_ base: UInt32, _ bits: UInt32) -> Bool { address >> (32 - bits) == base >> (32 - bits) }
        return within(0x0000_0000, 8) // 0.0.0.0/8
            || within(0x0A00_0000, 8) // 10/8
            || within(0x6440_0000, 10) // 100.64/10 shared (CGNAT)
            || within(0x7F00_0000, 8) // 127/8 loopback
            || within(0xA9FE_0000, 16) // 169.254/16 link-local (cloud metadata lives here)
            || within(0xAC10_0000, 12) // 172.16/12
            || within(0xC0A8_0000, 16) // 192.168/16
            || within(0xE000_0000, 4) // multicast
            || address >= 0xF000_0000 // reserved and broadcast
    }
}

/// Collects one HTTP response, failing past `limit` body bytes.
private final class ResponseCollector: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = HTTPClientResponsePart

    private let promise: EventLoopPromise<RemoteFetcher.Response>
    private let limit: Int
    private var head: HTTPResponseHead?
    private var body: [UInt8] = []

    init(promise: EventLoopPromise<RemoteFetcher.Response>, limit: Int) {
        self.promise = promise
        self.limit = limit
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            self.head = head
            if let length = head.headers.first(name: "content-length").flatMap(Int.init), length > limit {
                fail(context, RemoteFetcher.Failure(code: .tooLarge, message: "the remote image is \(length) bytes; the limit is \(limit)", retryable: false))
            }
        case .body(var buffer):
            guard body.count + buffer.readableBytes <= limit else {
                return fail(context, RemoteFetcher.Failure(code: .tooLarge, message: "the remote image is over the limit of \(limit) bytes", retryable: false))
            }
            body += buffer.readBytes(length: buffer.readableBytes) ?? []
        case .end:
            guard let head else { return fail(context, ChannelError.inputClosed) }
            promise.succeed(.init(status: head.status, headers: head.headers, body: body))
            context.close(promise: nil)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        promise.fail(RemoteFetcher.Failure(code: .internal, message: "the connection closed before the response was complete", retryable: true))
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        fail(context, error)
    }

    private func fail(_ context: ChannelHandlerContext, _ error: any Error) {
        promise.fail(error)
        context.close(promise: nil)
    }
}
