import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// One HTTP/1.1 request to an address a person named, made safely: the host is resolved here,
/// every address it resolves to must be public (``PublicAddress``) unless the operator allowed
/// the host, the connection goes to one of those checked addresses (so the name cannot resolve
/// elsewhere between the check and the connect: no DNS-rebinding window), and the address the
/// connection actually reached is checked again. TLS names the host (SNI and the certificate
/// check). A connect timeout, a total timeout, and a bound on the answer's bytes.
///
/// Used for remote photos (canopy-images) and for webhooks and ntfy topics (canopy-remind).
/// Thread-safe.
public final class PinnedHTTP: Sendable {
    /// One request.
    public struct Request: Sendable {
        public var url: String
        public var method: HTTPMethod = .GET
        public var headers: HTTPHeaders = [:]
        public var body: [UInt8] = []

        public init(url: String, method: HTTPMethod = .GET, headers: HTTPHeaders = [:], body: [UInt8] = []) {
            self.url = url
            self.method = method
            self.headers = headers
            self.body = body
        }
    }

    /// The answer.
    public struct Response: Sendable {
        public var status: HTTPResponseStatus
        public var headers: HTTPHeaders
        public var body: [UInt8]
    }

    /// Why a request failed: `refused` (not an http(s) URL, an internal address), `unreachable`
    /// (no such host, no connection), `timeout`, or `tooLarge` (the answer past its bound).
    public struct Failure: Error, CustomStringConvertible, Sendable {
        public enum Kind: Sendable { case refused, unreachable, timeout, tooLarge }
        public var kind: Kind
        public var message: String
        public var description: String { message }
        /// Whether trying again later may work.
        public var retryable: Bool { kind == .unreachable || kind == .timeout }
    }

    /// Settings.
    public struct Settings: Sendable {
        public var connectTimeout: Duration = .seconds(5)
        public var totalTimeout: Duration = .seconds(30)
        /// The most bytes an answer's body may have.
        public var maximumBytes = 25 * 1024 * 1024
        /// Hosts (as written in URLs, lowercased) that may resolve to any address: the
        /// operator's own (`--allow-host`).
        public var allowedHosts: Set<String> = []
        /// The User-Agent sent.
        public var userAgent = "canopy"

        public init() {}
    }

    public let settings: Settings
    private let group: any EventLoopGroup
    private let tls: NIOSSLContext

    public init(settings: Settings = Settings(), group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) throws {
        self.settings = settings
        self.group = group
        tls = try NIOSSLContext(configuration: .makeClientConfiguration())
    }

    /// A URL's parts as a request needs them.
    public struct Target: Sendable {
        public var secure: Bool
        public var host: String
        public var port: Int
        public var pathAndQuery: String

        public init(_ text: String) throws(Failure) {
            guard let url = URL(string: text), let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https",
                  let host = url.host, !host.isEmpty
            else { throw Failure(kind: .refused, message: "'\(text.prefix(200))' is not an http(s) URL") }
            secure = scheme == "https"
            self.host = host.lowercased().trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
            port = url.port ?? (secure ? 443 : 80)
            let path = url.path.isEmpty ? "/" : url.path
            pathAndQuery = url.query.map { "\(path)?\($0)" } ?? path
        }
    }

    /// Whether `host` may be connected to: every address it resolves to is public (or the
    /// operator allowed it). Throws `refused` for an internal one, `unreachable` when it does
    /// not resolve. What registration checks; ``send(_:)`` checks again at connect time.
    public func check(host: String) async throws(Failure) {
        let host = host.lowercased()
        guard !settings.allowedHosts.contains(host) else { return }
        _ = try await publicAddresses(host, port: 80)
    }

    /// Sends the request and collects the answer.
    public func send(_ request: Request) async throws(Failure) -> Response {
        let target = try Target(request.url)
        let trusted = settings.allowedHosts.contains(target.host)
        let addresses = trusted ? try await Self.resolve(target.host, port: target.port) : try await publicAddresses(target.host, port: target.port)
        do {
            return try await exchange(request, target: target, address: addresses[0], trusted: trusted)
        } catch let failure as Failure {
            throw failure
        } catch {
            throw Failure(kind: .unreachable, message: "\(target.host): \(error)")
        }
    }

    /// The host's addresses, when every one is public.
    private func publicAddresses(_ host: String, port: Int) async throws(Failure) -> [SocketAddress] {
        let addresses = try await Self.resolve(host, port: port)
        guard !addresses.contains(where: PublicAddress.isInternal) else {
            throw Failure(kind: .refused, message: "'\(host)' is a loopback, private or internal address, or resolves to one; only public hosts are reached")
        }
        return addresses
    }

    private func exchange(_ request: Request, target: Target, address: SocketAddress, trusted: Bool) async throws -> Response {
        let promise = group.next().makePromise(of: Response.self)
        let (limit, tls) = (settings.maximumBytes, self.tls)
        let bootstrap = ClientBootstrap(group: group)
            .connectTimeout(.milliseconds(settings.connectTimeout.wholeMilliseconds))
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
            throw Failure(kind: .unreachable, message: "cannot connect to \(target.host): \(error)")
        }
        // The address actually connected to is checked again.
        if !trusted, let remote = channel.remoteAddress, PublicAddress.isInternal(remote) {
            channel.close(promise: nil)
            promise.fail(ChannelError.ioOnClosedChannel)
            throw Failure(kind: .refused, message: "\(target.host) connected to an internal address; refused")
        }
        let total = settings.totalTimeout
        let timeout = channel.eventLoop.scheduleTask(in: .milliseconds(total.wholeMilliseconds)) {
            promise.fail(Failure(kind: .timeout, message: "\(target.host) did not answer within \(total)"))
            channel.close(promise: nil)
        }
        defer {
            timeout.cancel()
            channel.close(promise: nil)
        }
        var head = HTTPRequestHead(version: .http1_1, method: request.method, uri: target.pathAndQuery)
        head.headers.add(name: "Host", value: target.port == (target.secure ? 443 : 80) ? target.host : "\(target.host):\(target.port)")
        head.headers.add(name: "User-Agent", value: settings.userAgent)
        head.headers.add(contentsOf: request.headers)
        if request.method != .GET || !request.body.isEmpty { head.headers.replaceOrAdd(name: "Content-Length", value: "\(request.body.count)") }
        head.headers.replaceOrAdd(name: "Connection", value: "close")
        channel.write(HTTPClientRequestPart.head(head), promise: nil)
        if !request.body.isEmpty { channel.write(HTTPClientRequestPart.body(.byteBuffer(ByteBuffer(bytes: request.body))), promise: nil) }
        channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
        return try await withTaskCancellationHandler {
            try await promise.futureResult.get()
        } onCancel: {
            channel.close(promise: nil)
        }
    }

    /// The host's addresses (``addresses(of:port:)``, off the event loops); `unreachable` when none.
    static func resolve(_ host: String, port: Int) async throws(Failure) -> [SocketAddress] {
        let found = await Task.detached { Self.addresses(of: host, port: port) }.value
        guard !found.isEmpty else { throw Failure(kind: .unreachable, message: "'\(host)' does not resolve") }
        return found
    }

    /// The host's addresses as `getaddrinfo` gives them (blocking; an IP literal is itself),
    /// none when it does not resolve.
    public static func addresses(of host: String, port: Int = 80) -> [SocketAddress] {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var result: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &result) == 0, let first = result else { return [] }
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
    }
}

extension Duration {
    fileprivate var wholeMilliseconds: Int64 {
        let (seconds, attoseconds) = components
        return max(0, seconds * 1000 + attoseconds / 1_000_000_000_000_000)
    }
}

/// Collects one HTTP response, failing past `limit` body bytes.
private final class ResponseCollector: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = HTTPClientResponsePart

    private let promise: EventLoopPromise<PinnedHTTP.Response>
    private let limit: Int
    private var head: HTTPResponseHead?
    private var body: [UInt8] = []

    init(promise: EventLoopPromise<PinnedHTTP.Response>, limit: Int) {
        self.promise = promise
        self.limit = limit
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            self.head = head
            if let length = head.headers.first(name: "content-length").flatMap(Int.init), length > limit {
                fail(context, PinnedHTTP.Failure(kind: .tooLarge, message: "the answer is \(length) bytes; the limit is \(limit)"))
            }
        case .body(var buffer):
            guard body.count + buffer.readableBytes <= limit else {
                return fail(context, PinnedHTTP.Failure(kind: .tooLarge, message: "the answer is over the limit of \(limit) bytes"))
            }
            body += buffer.readBytes(length: buffer.readableBytes) ?? []
        case .end:
            guard let head else { return fail(context, ChannelError.inputClosed) }
            promise.succeed(.init(status: head.status, headers: head.headers, body: body))
            context.close(promise: nil)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        promise.fail(PinnedHTTP.Failure(kind: .unreachable, message: "the connection closed before the answer was complete"))
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        fail(context, error)
    }

    private func fail(_ context: ChannelHandlerContext, _ error: any Error) {
        promise.fail(error)
        context.close(promise: nil)
    }
}
