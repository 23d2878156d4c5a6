import HTTPTypes
import OpenAPIRuntime

/// Puts `ETag` on the wire as HTTP has it (`"3"`), not percent-encoded: the OpenAPI runtime
/// encodes every header value as a URI component (swift-openapi-generator issue 857), and
/// an ETag of `%223%22` would come back in `If-Match` as no tag a client or cache knows.
struct EntityTags: ServerMiddleware {
    func intercept(
        _ request: HTTPRequest, body: HTTPBody?, metadata: ServerRequestMetadata, operationID: String,
        next: (HTTPRequest, HTTPBody?, ServerRequestMetadata) async throws -> (HTTPResponse, HTTPBody?)
    )
        async throws -> (HTTPResponse, HTTPBody?)
    {
        var (response, body) = try await next(request, body, metadata)
        if let tag = response.headerFields[.eTag], tag.contains("%"), let decoded = tag.removingPercentEncoding {
            response.headerFields[.eTag] = decoded
        }
        return (response, body)
    }
}
