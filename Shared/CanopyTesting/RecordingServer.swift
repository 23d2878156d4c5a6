import Foundation
import Hummingbird
import Synchronization

/// A local HTTP server that records every request (a webhook receiver or an ntfy server),
/// answering with the statuses it is given, then 200.
public final class RecordingServer: Sendable {
    public struct Received: Sendable {
        public var path: String
        public var headers: [String: String]
        public var body: [UInt8]
    }

    private final class Shared: Sendable {
        let value = Mutex<(received: [Received], statuses: [Int], port: Int?)>(([], [], nil))
    }

    private let shared = Shared()
    public let application: Application<RouterResponder<BasicRequestContext>>

    /// - Parameter delay: how long each answer takes.
    public init(delay: Duration = .zero) {
        let shared = self.shared
        let router = Router()
        router.post("**") { request, _ -> Response in
            let body = try await request.body.collect(upTo: 1024 * 1024)
            if delay > .zero { try await Task.sleep(for: delay) }
            var headers: [String: String] = [:]
            for field in request.headers { headers[field.name.canonicalName] = field.value }
            let status = shared.value.withLock { state -> Int in
                state.received.append(Received(path: request.uri.path, headers: headers, body: Array(body.readableBytesView)))
                return state.statuses.isEmpty ? 200 : state.statuses.removeFirst()
            }
            return Response(status: .init(code: status))
        }
        application = Application(router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0), serverName: "recording"),
                                  onServerRunning: { channel in shared.value.withLock { $0.port = channel.localAddress?.port } })
    }

    public func url(_ path: String, within limit: Duration = .seconds(30)) async throws -> String {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            if let port = shared.value.withLock({ $0.port }) { return "http://127.0.0.1:\(port)\(path)" }
            try await Task.sleep(for: .milliseconds(10))
        }
        throw CancellationError()
    }

    /// The next answers' statuses, before the 200s.
    public func answer(_ statuses: [Int]) { shared.value.withLock { $0.statuses += statuses } }

    public var received: [Received] { shared.value.withLock { $0.received } }
}

