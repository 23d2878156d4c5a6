import CanopyMessages
import Foundation
import HTTPTypes
import OpenAPIRuntime
import Synchronization

/// Every operation of the document, registered by the same generated code that registers
/// them with Hummingbird, so that `POST /v1/batch` runs the other routes in process, exactly
/// as they run alone (the same parsing, handlers and errors), without a second routing table
/// to keep in step with the document.
///
/// Thread-safety: filled once at start, then only read.
final class OperationTable: ServerTransport, Sendable {
    typealias Handler = @Sendable (HTTPRequest, HTTPBody?, ServerRequestMetadata) async throws -> (HTTPResponse, HTTPBody?)

    private struct Route {
        var method: HTTPRequest.Method
        /// The template's segments; `{name}` ones are parameters.
        var segments: [Substring]
        var handler: Handler
    }

    private let routes = Mutex<[Route]>([])

    func register(_ handler: @escaping Handler, method: HTTPRequest.Method, path: String) throws {
        let route = Route(method: method, segments: path.split(separator: "/"), handler: handler)
        routes.withLock { $0.append(route) }
    }

    /// The handler for `method` and `path` (without its query), with the path's parameters.
    func handler(_ method: HTTPRequest.Method, _ path: Substring) -> (Handler, ServerRequestMetadata)? {
        let segments = path.split(separator: "/")
        return routes.withLock { routes in
            for route in routes where route.method == method && route.segments.count == segments.count {
                var parameters: [String: Substring] = [:]
                let matches = zip(route.segments, segments).allSatisfy { template, segment in
                    if template.hasPrefix("{"), template.hasSuffix("}") {
                        parameters[String(template.dropFirst().dropLast())] = segment.removingPercentEncoding.map { Substring($0) } ?? segment
                        return true
                    }
                    return template == segment
                }
                if matches { return (route.handler, ServerRequestMetadata(pathParameters: parameters)) }
            }
            return nil
        }
    }
}
