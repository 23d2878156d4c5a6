import CanopyMessages
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization

/// HTTP/1.1 requests to addresses a person named, made safely: the host is resolved here,
/// every address it resolves to must be public (``PublicAddress``) unless the operator allowed
/// the host, the connection goes to one of those checked addresses (so the name cannot resolve
/// elsewhere between the check and the connect: no DNS-rebinding window), and the address the
/// connection actually reached is checked again. TLS names the host (SNI and the certificate
/// check). A connect timeout, a total timeout, and a bound on the answer's bytes. Connections
/// the server keeps open are kept for the next request to the same host (at most 8 a host):
/// they go to the address checked when they were made.
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
        /// Which way the request failed, as ``Failure`` lists them.
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

    /// Sends the request and collects the answer: on a kept connection to the same host when
    /// one is idle (it went to an address checked when it was made), else on a new one.
    public func send(_ request: Request) async throws(Failure) -> Response {
        let target = try Target(request.url)
        let key = Pool.Key(host: target.host, port: target.port, secure: target.secure)
        while let kept = pool.take(key) {
            do {
                return try await exchange(request, target: target, on: kept, key: key)
            } catch let failure as Failure where failure.kind == .unreachable && !kept.answered {
                continue // the server closed it meanwhile: another, or a new one
            } catch let failure as Failure {
                throw failure
            } catch {
                throw Failure(kind: .unreachable, message: "\(target.host): \(error)")
            }
        }
        let trusted = settings.allowedHosts.contains(target.host)
        let addresses = trusted ? try await Self.resolve(target.host, port: target.port) : try await publicAddresses(target.host, port: target.port)
        do {
            let connection = try await connect(target: target, address: addresses[0], trusted: trusted)
            return try await exchange(request, target: target, on: connection, key: key)
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

    /// A connection to a checked address, with its response collector.
    final class Connection: Sendable {
        let channel: any Channel
        let collector: ResponseCollector
        /// Whether the answer to the request on it now began (a kept one that fails before
        /// that, closed by the server meanwhile, is tried again on another).
        var answered: Bool { collector.answered.load(ordering: .relaxed) }

        init(channel: any Channel, collector: ResponseCollector) {
            self.channel = channel
            self.collector = collector
        }
    }

    /// Connects to `address` (one of the host's, checked) and checks the address reached.
    private func connect(target: Target, address: SocketAddress, trusted: Bool) async throws -> Connection {
        let (limit, tls) = (settings.maximumBytes, self.tls)
        let collector = ResponseCollector(limit: limit)
        let bootstrap = ClientBootstrap(group: group)
            .connectTimeout(.milliseconds(settings.connectTimeout.wholeMilliseconds))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if target.secure {
                        try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: tls, serverHostname: target.host))
                    }
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    try channel.pipeline.syncOperations.addHandler(collector)
                }
            }
        let channel: any Channel
        do {
            channel = try await bootstrap.connect(to: address).get()
        } catch {
            throw Failure(kind: .unreachable, message: "cannot connect to \(target.host): \(error)")
        }
        // The address actually connected to is checked again.
        if !trusted, let remote = channel.remoteAddress, PublicAddress.isInternal(remote) {
            channel.close(promise: nil)
            throw Failure(kind: .refused, message: "\(target.host) connected to an internal address; refused")
        }
        return Connection(channel: channel, collector: collector)
    }

    /// One request and its answer on `connection`; the connection is kept for the next
    /// request to the same host when the server keeps it open, else closed.
    private func exchange(_ request: Request, target: Target, on connection: Connection, key: Pool.Key) async throws -> Response {
        let channel = connection.channel
        let promise = channel.eventLoop.makePromise(of: Response.self)
        try await channel.eventLoop.submit { connection.collector.begin(promise) }.get()
        let total = settings.totalTimeout
        let timeout = channel.eventLoop.scheduleTask(in: .milliseconds(total.wholeMilliseconds)) {
            promise.fail(Failure(kind: .timeout, message: "\(target.host) did not answer within \(total)"))
            channel.close(promise: nil)
        }
        defer { timeout.cancel() }
        var head = HTTPRequestHead(version: .http1_1, method: request.method, uri: target.pathAndQuery)
        head.headers.add(name: "Host", value: target.port == (target.secure ? 443 : 80) ? target.host : "\(target.host):\(target.port)")
        head.headers.add(name: "User-Agent", value: settings.userAgent)
        head.headers.add(contentsOf: request.headers)
        if request.method != .GET || !request.body.isEmpty { head.headers.replaceOrAdd(name: "Content-Length", value: "\(request.body.count)") }
        channel.write(HTTPClientRequestPart.head(head), promise: nil)
        if !request.body.isEmpty { channel.write(HTTPClientRequestPart.body(.byteBuffer(ByteBuffer(bytes: request.body))), promise: nil) }
        channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
        let response: Response
        do {
            response = try await withTaskCancellationHandler {
                try await promise.futureResult.get()
            } onCancel: {
                channel.close(promise: nil)
            }
        } catch {
            channel.close(promise: nil)
            throw error
        }
        let closes = response.headers[canonicalForm: "connection"].contains { $0.lowercased() == "close" }
        if closes || !channel.isActive || !pool.put(connection, for: key) { channel.close(promise: nil) }
        return response
    }

    /// Idle kept connections by host: at most ``Pool/perHost`` each and ``Pool/total`` in all
    /// (more are closed); a kept one the server closed meanwhile is dropped when taken.
    final class Pool: Sendable {
        struct Key: Hashable, Sendable {
            var host: String
            var port: Int
            var secure: Bool
        }

        static let perHost = 8
        static let total = 512
        private let idle = Mutex<(byKey: [Key: [Connection]], count: Int)>(([:], 0))

        /// An idle connection to `key`'s host that is still open, if one is kept.
        func take(_ key: Key) -> Connection? {
            idle.withLock { idle in
                while var list = idle.byKey[key], let connection = list.popLast() {
                    idle.byKey[key] = list.isEmpty ? nil : list
                    idle.count -= 1
                    if connection.channel.isActive { return connection }
                }
                return nil
            }
        }

        /// Keeps `connection` for the next request to its host; false when the pool is full.
        func put(_ connection: Connection, for key: Key) -> Bool {
            idle.withLock { idle in
                guard idle.count < Self.total, idle.byKey[key, default: []].count < Self.perHost else { return false }
                idle.byKey[key, default: []].append(connection)
                idle.count += 1
                return true
            }
        }
    }

    private let pool = Pool()

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

/// Collects the responses of one connection, one request at a time (``begin(_:)`` on the
/// channel's event loop before each), failing past `limit` body bytes. Its state belongs to
/// the event loop.
final class ResponseCollector: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = HTTPClientResponsePart

    private var promise: EventLoopPromise<PinnedHTTP.Response>?
    private let limit: Int
    private var head: HTTPResponseHead?
    private var body: [UInt8] = []
    /// Whether the response to the request under way began (read from other threads).
    let answered = Atomic<Bool>(false)

    init(limit: Int) {
        self.limit = limit
    }

    /// The next response goes to `promise`.
    func begin(_ promise: EventLoopPromise<PinnedHTTP.Response>) {
        self.promise = promise
        head = nil
        body = []
        answered.store(false, ordering: .relaxed)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            answered.store(true, ordering: .relaxed)
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
            let response = PinnedHTTP.Response(status: head.status, headers: head.headers, body: body)
            self.head = nil
            body = []
            promise?.succeed(response)
            promise = nil
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        promise?.fail(PinnedHTTP.Failure(kind: .unreachable, message: "the connection closed before the answer was complete"))
        promise = nil
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        fail(context, error)
    }

    private func fail(_ context: ChannelHandlerContext, _ error: any Error) {
        promise?.fail(error)
        promise = nil
        context.close(promise: nil)
    }
}
