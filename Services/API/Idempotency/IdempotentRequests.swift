import CanopyMessages
import CanopyServiceKit
import Foundation
import HTTPTypes
import Hummingbird
import Logging

/// The edge's half of `Idempotency-Key`: a POST (or PATCH) that comes with a key asks the
/// store for it first (``IdempotencyDecision``). The first request with a key does the work
/// and its answer is kept; a repeat gets that answer again with `Idempotent-Replayed: true`;
/// the key with another request is 422; a repeat while the first runs is 409 with
/// `Retry-After`. An answer of 500 or more lets the key go, so a retry does the work (the
/// services' own keys keep it single: ``Caller/idempotencyKey``).
struct IdempotentRequests: Sendable {
    let store: any IdempotencyStoring
    /// How long a request holds its key before a repeat may take it over (its edge presumed dead).
    let lease: Duration

    static let keyHeader = HTTPField.Name(IdempotencyKeys.header)!
    static let replayedHeader = HTTPField.Name(IdempotencyKeys.replayedHeader)!
    private static let keptHeaders = IdempotencyKeys.keptHeaders.compactMap { HTTPField.Name($0) }

    /// Answers `request` of `person` that came with `key`: `work` runs (told the services'
    /// key) only when the store says this request holds the key.
    func run(
        _ request: Request, person: String, key: String, body: ByteBuffer, requestID: String, logger: Logger,
        work: (_ serviceKey: String) async -> Response
    ) async -> Response {
        let route = "\(request.method) \(request.uri.path)"
        let claim = IdempotencyClaim(
            person: person, route: route, key: key,
            fingerprint: IdempotencyKeys.fingerprint(
                method: request.method.rawValue, path: request.uri.description,
                contentType: request.headers[.contentType], body: body.readableBytesView),
            lease: lease.seconds)
        let decision: IdempotencyDecision
        do {
            decision = try await store.claim(claim, now: Date())
        } catch {
            logger.error("api.idempotency.unreadable", metadata: ["api.request": "\(requestID)", "api.error": "\(error)"])
            return Problem.response(
                .serviceUnavailable, "the store of idempotency keys cannot be read now; nothing was done; send the request again in a moment",
                requestID: requestID, headers: [.retryAfter: "1"])
        }
        switch decision {
        case .replay(let answer):
            var headers = HTTPFields()
            for pair in answer.headers where pair.count == 2 {
                if let name = HTTPField.Name(pair[0]) { headers[name] = pair[1] }
            }
            headers[Self.replayedHeader] = "true"
            return Response(status: .init(code: answer.status), headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: answer.body)))
        case .answeredNotKept:
            return Problem.response(
                .conflict,
                "this request was done already with this \(IdempotencyKeys.header); its answer was larger than is kept, so read what it changed instead",
                requestID: requestID)
        case .otherRequest:
            return Problem.response(
                .unprocessableContent,
                "idempotency key reused with another request: this \(IdempotencyKeys.header) was sent with another body or path; use a new key for a new request",
                requestID: requestID, field: IdempotencyKeys.header)
        case .running(let retryAfter):
            return Problem.response(
                .conflict, "a request with this \(IdempotencyKeys.header) is still running; its answer comes when it ends: send it again in \(retryAfter) s",
                requestID: requestID, headers: [.retryAfter: String(retryAfter)])
        case .proceed:
            break
        }
        var response = await work(IdempotencyKeys.serviceKey(person: person, route: route, key: key))
        // The answer, collected to be kept (the routes answer JSON they made whole anyway).
        let collector = CollectedBody()
        do {
            try await response.body.write(CollectingWriter(sink: collector))
        } catch {
            logger.error("api.idempotency.unanswered", metadata: ["api.request": "\(requestID)", "api.error": "\(error)"])
            try? await store.release(claim)
            return Problem.response(.internalServerError, "something failed inside canopy-api; the request id finds it in the log", requestID: requestID)
        }
        let bytes = collector.bytes
        response.body = .init(byteBuffer: ByteBuffer(bytes: bytes))
        do {
            if response.status.code >= 500 {
                try await store.release(claim)
            } else {
                let kept =
                    bytes.count <= IdempotencyKeys.maximumAnswerBytes
                    ? KeptAnswer(
                        status: response.status.code, headers: Self.keptHeaders.compactMap { name in response.headers[name].map { [name.rawName, $0] } },
                        body: bytes)
                    : nil
                try await store.answer(claim, with: kept, now: Date())
            }
        } catch {
            // The work is done and answered; the key stays held until its lease ends, and a repeat
            // after that runs it again, once in the services (their keys).
            logger.warning("api.idempotency.unkept", metadata: ["api.request": "\(requestID)", "api.error": "\(error)"])
        }
        return response
    }
}

/// A response body's bytes, as written.
private final class CollectedBody {
    var bytes: [UInt8] = []
}

private struct CollectingWriter: ResponseBodyWriter {
    let sink: CollectedBody

    mutating func write(_ buffer: ByteBuffer) async throws {
        sink.bytes.append(contentsOf: buffer.readableBytesView)
    }

    consuming func finish(_ trailingHeaders: HTTPFields?) async throws {}
}
