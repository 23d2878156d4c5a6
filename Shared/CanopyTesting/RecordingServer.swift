import Foundation
import Hummingbird
import Synchronization

/// A local HTTP server that records every request (a webhook receiver or an ntfy server),
/// answering with the statuses it is given, then 200.
public final class RecordingServer: Sendable {
    /// One POST the server received: its path, its headers by canonical name, and its body.
    public struct Received: Sendable {
        public var path: String
        public var headers: [String: String]
        public var body: [UInt8]
    }

    private final class Shared: Sendable {
        let value = Mutex<(received: [Received], statuses: [Int], port: Int?, arrived: Int, holding: Bool)>(([], [], nil, 0, false))
    }

    private let shared = Shared()
    private let host: String
    public let application: Application<RouterResponder<BasicRequestContext>>

    /// - Parameters:
    ///   - delay: how long each answer takes.
    ///   - host: the loopback address it listens on (127.0.0.2 is another host than 127.0.0.1).
    public init(delay: Duration = .zero, host: String = "127.0.0.1") {
        let shared = self.shared
        let router = Router()
        router.post("**") { request, _ -> Response in
            let body = try await request.body.collect(upTo: 1024 * 1024)
            shared.value.withLock { $0.arrived += 1 }
            if delay > .zero { try await Task.sleep(for: delay) }
            // A receiver that does not answer, until released (or the server stops).
            _ = try await eventually(within: .seconds(3_600)) { !shared.value.withLock { $0.holding } }
            var headers: [String: String] = [:]
            for field in request.headers { headers[field.name.canonicalName] = field.value }
            let status = shared.value.withLock { state -> Int in
                state.received.append(Received(path: request.uri.path, headers: headers, body: Array(body.readableBytesView)))
                return state.statuses.isEmpty ? 200 : state.statuses.removeFirst()
            }
            return Response(status: .init(code: status))
        }
        self.host = host
        application = Application(
            router: router, configuration: .init(address: .hostname(host, port: 0), serverName: "recording"),
            onServerRunning: { channel in shared.value.withLock { $0.port = channel.localAddress?.port } })
    }

    /// `http://HOST:PORT/path` once the server listens (within 90 s by default: amid the whole
    /// suite a 2-core machine has starved a server's start for over 30).
    public func url(_ path: String, within limit: Duration = .seconds(90)) async throws -> String {
        guard try await eventually(within: limit, { shared.value.withLock { $0.port } != nil }),
            let port = shared.value.withLock({ $0.port })
        else { throw LiveBusError("the recording server did not start listening within \(limit)") }
        return "http://\(host):\(port)\(path)"
    }

    /// The next answers' statuses, before the 200s.
    public func answer(_ statuses: [Int]) { shared.value.withLock { $0.statuses += statuses } }

    public var received: [Received] { shared.value.withLock { $0.received } }

    /// Requests that arrived, answered or not.
    public var arrived: Int { shared.value.withLock { $0.arrived } }

    /// Answers nothing from now on, until ``release()``: a receiver that hangs.
    public func hold() { shared.value.withLock { $0.holding = true } }

    /// Answers what it held, and everything after.
    public func release() { shared.value.withLock { $0.holding = false } }
}
