import CanopyTesting
import Foundation
import Hummingbird
import MultipartKit
import NIOCore
import Synchronization

/// A local HTTP server that behaves as the Pl@ntNet identification API v2 is documented to
/// (https://my.plantnet.org/doc/openapi): `POST /v2/identify/{project}` with the `api-key`,
/// `nb-results`, `lang`, `include-related-images` and `no-reject` query parameters and a
/// multipart body of `images` and `organs` parts.
///
/// - a wrong or missing key: 401 `{"statusCode":401,"error":"Unauthorized","message":"Invalid API key"}`
/// - no images, more than 5, organs not matching, an unknown organ, a part that is not an
///   image: 400 with Pl@ntNet's error body
/// - the daily quota used up: 429 "Too Many Requests"
/// - otherwise 200 with ranked results, `remainingIdentificationRequests` counting down.
///
/// Tests can also script the next answers (`script`): a status with Pl@ntNet's error body,
/// or 404 "Species not found".
final class FakePlantNet: Sendable {
    static let key = "test-key-3f9a"

    /// One request as the server saw it.
    struct Call: Sendable {
        var project: String
        var query: [String: String]
        var organs: [String]
        var imageBytes: [Int]
    }

    enum Scripted: Sendable {
        case status(Int)
        case notFound
    }

    private struct State: Sendable {
        var remaining: Int
        var scripted: [Scripted] = []
        var calls: [Call] = []
        var port: Int?
    }

    /// The server's state, shared with its route handlers.
    private final class Shared: Sendable {
        let value: Mutex<State>
        init(_ state: State) { value = Mutex(state) }
        func withLock<T>(_ body: (inout State) -> T) -> T { value.withLock { body(&$0) } }
    }

    private let state: Shared
    let application: Application<RouterResponder<BasicRequestContext>>

    init(remaining: Int = 500) {
        let state = Shared(State(remaining: remaining))
        self.state = state
        let router = Router()
        router.post("/v2/identify/:project") { request, context -> Response in
            let project = context.parameters.get("project") ?? ""
            var query: [String: String] = [:]
            for (name, value) in request.uri.queryParameters { query[String(name)] = String(value) }
            let body = try await request.body.collect(upTo: 60 * 1024 * 1024)
            let boundary = request.headers[.contentType].flatMap { type in
                type.split(separator: ";").map { $0.trimmingCharacters(in: .whitespaces) }.first { $0.hasPrefix("boundary=") }.map { String($0.dropFirst(9)) }
            }
            let parts = boundary.flatMap { try? Self.parts(body, boundary: $0) } ?? []
            let organs = parts.filter { $0.name == "organs" }.map { String(decoding: $0.body, as: UTF8.self) }
            let images = parts.filter { $0.name == "images" }.map(\.body)
            let call = Call(project: project, query: query, organs: organs, imageBytes: images.map(\.count))
            let scripted: Scripted? = state.withLock { state in
                state.calls.append(call)
                return state.scripted.isEmpty ? nil : state.scripted.removeFirst()
            }
            guard query["api-key"] == Self.key else { return Self.error(401, "Unauthorized", "Invalid API key") }
            switch scripted {
            case .status(let status)?: return Self.error(status, "Scripted", "scripted answer")
            case .notFound?: return Self.error(404, "Not Found", "Species not found")
            case nil: break
            }
            guard boundary != nil, !images.isEmpty else { return Self.error(400, "Bad Request", "\"images\" is required") }
            guard images.count <= 5 else { return Self.error(400, "Bad Request", "\"images\" must contain less than or equal to 5 items") }
            guard organs.count == images.count else { return Self.error(400, "Bad Request", "\"organs\" must be as many as \"images\"") }
            let allowed: Set<String> = ["leaf", "flower", "fruit", "bark", "auto", "habit", "other"]
            guard organs.allSatisfy(allowed.contains) else {
                return Self.error(400, "Bad Request", "\"organs\" must be one of [leaf, flower, fruit, bark, auto, habit, other]")
            }
            guard images.allSatisfy({ $0.starts(with: [0xFF, 0xD8, 0xFF]) || $0.starts(with: [0x89, 0x50, 0x4E, 0x47]) }) else {
                return Self.error(400, "Bad Request", "Unsupported file type for image")
            }
            let remaining: Int? = state.withLock { state in
                guard state.remaining > 0 else { return nil }
                state.remaining -= 1
                return state.remaining
            }
            guard let remaining else { return Self.error(429, "Too Many Requests", "Too Many Requests") }
            let results = Int(query["nb-results"] ?? "") ?? 10
            return Response(
                status: .ok, headers: [.contentType: "application/json"],
                body: .init(byteBuffer: ByteBuffer(string: Self.answer(organs: organs, results: results, remaining: remaining, project: project))))
        }
        application = Application(
            router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0), serverName: "fake-plantnet"),
            onServerRunning: { channel in state.withLock { $0.port = channel.localAddress?.port } })
    }

    /// The base URL, once the server listens.
    func baseURL(within limit: Duration = .seconds(30)) async throws -> String {
        guard try await eventually(within: limit, { state.withLock { $0.port } != nil }),
            let port = state.withLock({ $0.port })
        else { throw CancellationError() }
        return "http://127.0.0.1:\(port)"
    }

    /// The next answers, before the normal ones.
    func script(_ answers: [Scripted]) {
        state.withLock { $0.scripted += answers }
    }

    func setRemaining(_ remaining: Int) {
        state.withLock { $0.remaining = remaining }
    }

    var calls: [Call] { state.withLock { $0.calls } }

    // MARK: - Answers

    static func error(_ status: Int, _ error: String, _ message: String) -> Response {
        let body = #"{"statusCode":\#(status),"error":"\#(error)","message":"\#(message.replacingOccurrences(of: "\"", with: "\\\""))"}"#
        return Response(status: .init(code: status), headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: body)))
    }

    /// Three candidates, as Pl@ntNet writes them (genus and family as objects, GBIF's id a string).
    static func answer(organs: [String], results: Int, remaining: Int, project: String) -> String {
        let species: [(String, String, String, String, [String], String, Double)] = [
            ("Monstera deliciosa", "Liebm.", "Monstera", "Araceae", ["Swiss cheese plant", "Ceriman"], "2868241", 0.8231),
            ("Philodendron bipinnatifidum", "Schott ex Endl.", "Philodendron", "Araceae", ["Lacy tree philodendron"], "2872557", 0.0912),
            ("Epipremnum aureum", "(Linden & André) G.S.Bunting", "Epipremnum", "Araceae", ["Golden pothos"], "2868323", 0.0311),
        ]
        let items = species.prefix(results).map { name, author, genus, family, common, gbif, score in
            """
            {"score":\(score),"species":{"scientificNameWithoutAuthor":"\(name)","scientificNameAuthorship":"\(author)",\
            "genus":{"scientificNameWithoutAuthor":"\(genus)","scientificNameAuthorship":"","scientificName":"\(genus)"},\
            "family":{"scientificNameWithoutAuthor":"\(family)","scientificNameAuthorship":"","scientificName":"\(family)"},\
            "commonNames":[\(common.map { "\"\($0)\"" }.joined(separator: ","))],"scientificName":"\(name) \(author)"},\
            "gbif":{"id":"\(gbif)"},"powo":{"id":"000-1"}}
            """
        }
        return """
            {"query":{"project":"\(project)","images":[],"organs":[\(organs.map { "\"\($0)\"" }.joined(separator: ","))],\
            "includeRelatedImages":false,"noReject":false},"language":"en","preferedReferential":"k-world-flora",\
            "bestMatch":"Monstera deliciosa Liebm.","results":[\(items.joined(separator: ","))],"version":"2025-01-17 (7.3)",\
            "remainingIdentificationRequests":\(remaining)}
            """
    }

    /// The parts of a multipart body: each part's form name and bytes.
    static func parts(_ body: ByteBuffer, boundary: String) throws -> [(name: String, body: [UInt8])] {
        let parser = MultipartParser(boundary: boundary)
        var parts: [(name: String, body: [UInt8])] = []
        var name = ""
        var bytes: [UInt8] = []
        parser.onHeader = { field, value in
            guard field.lowercased() == "content-disposition" else { return }
            for item in value.split(separator: ";") {
                let pair = item.trimmingCharacters(in: .whitespaces)
                if pair.hasPrefix("name=") { name = String(pair.dropFirst(5)).trimmingCharacters(in: CharacterSet(charactersIn: "\"")) }
            }
        }
        parser.onBody = { buffer in bytes += buffer.readableBytesView }
        parser.onPartComplete = {
            parts.append((name, bytes))
            (name, bytes) = ("", [])
        }
        try parser.execute(body)
        return parts
    }
}
