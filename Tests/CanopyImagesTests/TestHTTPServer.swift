import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

/// A small HTTP server on 127.0.0.1 with an ephemeral port, standing in for the web sites
/// photos are fetched from. It counts requests per path and the most it served at once.
final class TestHTTPServer: Sendable {
    enum Route: Sendable {
        case body([UInt8])
        case redirect(String)
        /// Answers 500 this many times, then the body.
        case failing(times: Int, then: [UInt8])
        case slow(Duration, [UInt8])
        case status(Int)
    }

    struct Counters {
        var requests: [String: Int] = [:]
        var current = 0
        var most = 0
        var times: [ContinuousClock.Instant] = []
    }

    /// The counters behind a lock, shared with the connection handlers.
    final class Shared: Sendable {
        private let state = Mutex(Counters())
        func withLock<T>(_ body: (inout Counters) -> T) -> T { state.withLock { body(&$0) } }
    }

    let port: Int
    let counters = Shared()
    private let channel: any Channel

    init(routes: [String: Route]) async throws {
        let counters = self.counters
        channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                    try channel.pipeline.syncOperations.addHandler(Responder(routes: routes, counters: counters))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        port = channel.localAddress!.port!
    }

    func stop() async {
        try? await channel.close()
    }

    func url(_ path: String, host: String = "127.0.0.1") -> String { "http://\(host):\(port)\(path)" }

    private final class Responder: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = HTTPServerRequestPart
        typealias OutboundOut = HTTPServerResponsePart

        let routes: [String: Route]
        let counters: Shared
        private var path = ""

        init(routes: [String: Route], counters: Shared) {
            self.routes = routes
            self.counters = counters
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            switch unwrapInboundIn(data) {
            case .head(let head):
                path = head.uri
            case .body:
                break
            case .end:
                let seen = counters.withLock { counters in
                    counters.requests[path, default: 0] += 1
                    counters.current += 1
                    counters.most = max(counters.most, counters.current)
                    counters.times.append(.now)
                    return counters.requests[path]!
                }
                switch routes[path] {
                case .body(let bytes): respond(context, 200, bytes)
                case .redirect(let location): respond(context, 302, [], headers: ["Location": location])
                case .failing(let times, let bytes): seen <= times ? respond(context, 500, []) : respond(context, 200, bytes)
                case .slow(let delay, let bytes):
                    let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
                    context.eventLoop.scheduleTask(in: .milliseconds(delay.wholeMilliseconds)) {
                        let (responder, context) = loopBound.value
                        responder.respond(context, 200, bytes)
                    }
                case .status(let code): respond(context, code, [])
                case nil: respond(context, 404, [])
                }
            }
        }

        func respond(_ context: ChannelHandlerContext, _ status: Int, _ body: [UInt8], headers extra: [String: String] = [:]) {
            var headers = HTTPHeaders([("Content-Length", "\(body.count)"), ("Connection", "close")])
            for (name, value) in extra { headers.add(name: name, value: value) }
            context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .init(statusCode: status), headers: headers))), promise: nil)
            var buffer = context.channel.allocator.buffer(capacity: body.count)
            buffer.writeBytes(body)
            context.write(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
            let channel = context.channel
            let counters = self.counters
            context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in
                counters.withLock { $0.current -= 1 }
                channel.close(promise: nil)
            }
        }
    }
}
