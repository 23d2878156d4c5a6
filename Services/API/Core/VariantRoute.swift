import CanopyMessages
import Foundation
import HTTPTypes
import Hummingbird

/// `GET /v1/photos/{photoID}/variants/{variant}` served by the edge middleware itself, past
/// the generated layer: the route a scrolling app calls most, and the one whose answer is
/// bytes. The generated server writes every response header URI-encoded (then undone here
/// for `ETag` and `Cache-Control`) and parses `Accept` into a list: a fifth of the edge's work
/// for a thumbnail. Both this and the generated handler answer through
/// ``APIHandlers/variant(photoID:variant:webp:ifNoneMatch:)``, and schemathesis checks the
/// route against the document like every other.
struct VariantRoute: Sendable {
    /// The document's template, for metrics.
    static let template = "/v1/photos/{photoID}/variants/{variant}"

    let api: APIHandlers

    /// The photo id and variant name when `path` is this route's (`/v1/photos/ID/variants/NAME`,
    /// read byte by byte: this runs for every GET).
    static func match(_ path: Substring) -> (photoID: String, variant: String)? {
        let bytes = path.utf8
        let prefix = "/v1/photos/".utf8, middle = "/variants/".utf8
        guard bytes.starts(with: prefix) else { return nil }
        let idStart = bytes.index(bytes.startIndex, offsetBy: prefix.count)
        guard let idEnd = bytes[idStart...].firstIndex(of: UInt8(ascii: "/")), idEnd > idStart,
            bytes[idEnd...].starts(with: middle)
        else { return nil }
        let nameStart = bytes.index(idEnd, offsetBy: middle.count)
        guard nameStart < bytes.endIndex, !bytes[nameStart...].contains(UInt8(ascii: "/")) else { return nil }
        return (String(path[idStart..<idEnd]), String(path[nameStart...]))
    }

    /// The answer, or an error for the middleware to turn into problem details.
    func respond(to request: Request, photoID: String, variant: String) async throws -> Response {
        guard photoID.utf8.count == 64, photoID.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }) else {
            throw RequestFieldError(field: "photoID", "photoID is the photo's SHA-256: 64 lower-case hexadecimal characters")
        }
        let answer = try await api.variant(
            photoID: photoID, variant: variant, webp: Self.acceptsWebP(request.headers[.accept]),
            ifNoneMatch: request.headers[.ifNoneMatch])
        switch answer {
        case .notModified(let eTag):
            return Response(status: .notModified, headers: [.eTag: eTag, .cacheControl: APIHandlers.variantCacheControl])
        case .bytes(let eTag, let bytes, let webp):
            return Response(
                status: .ok,
                headers: [
                    .contentType: webp ? "image/webp" : "image/jpeg", .eTag: eTag,
                    .cacheControl: APIHandlers.variantCacheControl, .vary: "Accept",
                ],
                body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
        }
    }

    /// Whether an `Accept` header names WebP with a quality above 0 (`image/webp` itself; a
    /// wildcard alone keeps JPEG, which every client takes).
    static func acceptsWebP(_ header: String?) -> Bool {
        guard let header else { return false }
        return header.split(separator: ",").contains { entry in
            let parameters = entry.split(separator: ";").map { $0.trimmingCharacters(in: .whitespaces) }
            guard parameters.first?.lowercased() == "image/webp" else { return false }
            let quality = parameters.dropFirst().first { $0.lowercased().hasPrefix("q=") }.flatMap { Double($0.dropFirst(2)) } ?? 1
            return quality > 0
        }
    }
}

/// What the HTTP listener runs: variant GETs go straight to the edge middleware (which
/// answers them itself, ``VariantRoute``) without the router resolving their path first;
/// everything else goes through the router, behind the same middleware.
public struct EdgeResponder: HTTPResponder {
    let router: RouterResponder<BasicRequestContext>
    let edge: EdgeMiddleware<BasicRequestContext>

    public func respond(to request: Request, context: BasicRequestContext) async throws -> Response {
        guard request.method == .get, let variant = VariantRoute.match(request.uri.path[...]) else {
            return try await router.respond(to: request, context: context)
        }
        return try await edge.handle(request, context: context, variant: variant) { _, _ in
            throw CanopyError(.internal, "a variant request reached the router") // the middleware answers it itself
        }
    }
}
