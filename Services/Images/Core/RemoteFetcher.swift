import CanopyBus
import CanopyMessages
import CanopyOutbound
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix

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
    private let limiter: ConcurrencyLimiter<String>
    /// Every request goes to a checked public address (``PinnedHTTP``).
    private let http: PinnedHTTP

    init(policy: Policy = Policy(), group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) throws {
        self.policy = policy
        limiter = ConcurrencyLimiter(maximum: policy.maximumPerHost)
        var settings = PinnedHTTP.Settings()
        settings.connectTimeout = policy.connectTimeout
        settings.totalTimeout = policy.totalTimeout
        settings.maximumBytes = policy.maximumBytes
        settings.allowedHosts = Set(policy.allowedHosts.map { $0.lowercased() })
        settings.userAgent = "canopy-images"
        http = try PinnedHTTP(settings: settings, group: group)
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
            let target = try Self.target(location)
            let url = location
            let response = try await limiter.run(target.host) { try await self.get(url) }
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

    private static func target(_ url: String) throws -> PinnedHTTP.Target {
        do {
            return try PinnedHTTP.Target(url)
        } catch {
            throw Failure(error)
        }
    }

    private func get(_ url: String) async throws -> PinnedHTTP.Response {
        var headers = HTTPHeaders()
        headers.add(name: "Accept", value: "image/jpeg, image/png, image/webp, image/heif")
        do {
            return try await http.send(.init(url: url, headers: headers))
        } catch {
            throw Failure(error)
        }
    }
}

extension RemoteFetcher.Failure {
    /// A pinned request's failure as a fetch's.
    init(_ failure: PinnedHTTP.Failure) {
        switch failure.kind {
        case .refused: self.init(code: .badRequest, message: failure.message, retryable: false)
        case .unreachable: self.init(code: .internal, message: failure.message, retryable: true)
        case .timeout: self.init(code: .timeout, message: failure.message, retryable: true)
        case .tooLarge: self.init(code: .tooLarge, message: "the remote image: \(failure.message)", retryable: false)
        }
    }
}
