import CanopyMessages
import Foundation
import HTTPTypes
import OpenAPIRuntime

// MARK: - POST /v1/batch

extension APIHandlers {
    /// The most operations in one batch.
    static let maximumBatch = 50
    /// The largest answer of one operation kept in a batch's answer.
    static let maximumBatchedAnswerBytes = 1_048_576

    func runBatch(_ input: Operations.RunBatch.Input) async throws -> Operations.RunBatch.Output {
        guard case .json(let body) = input.body else { throw CanopyError(.badRequest, "the body is JSON") }
        guard let table = operations else { throw CanopyError(.internal, "this canopy-api runs no batches") }
        guard !body.operations.isEmpty, body.operations.count <= Self.maximumBatch else {
            throw RequestFieldError(field: "operations", "a batch has 1 to \(Self.maximumBatch) operations; this one has \(body.operations.count)")
        }
        metrics?.batchOperations.record(body.operations.count)
        let requestID = Caller.requestID
        let key = Caller.idempotencyKey
        // Independent operations, all at once; each answers for itself. With an Idempotency-Key,
        // each is told a key of its own, made from the batch's and its place in it.
        let results = await withTaskGroup(of: (Int, Components.Schemas.BatchResult).self) { group in
            for (index, operation) in body.operations.enumerated() {
                group.addTask {
                    await Caller.$idempotencyKey.withValue(key.map { IdempotencyKeys.partKey($0, part: index) }) {
                        (index, await Self.run(operation, table: table, requestID: "\(requestID).\(index)"))
                    }
                }
            }
            var results = [Components.Schemas.BatchResult?](repeating: nil, count: body.operations.count)
            for await (index, result) in group { results[index] = result }
            return results.compactMap { $0 }
        }
        return .ok(.init(body: .json(.init(results: results))))
    }

    private static let encoder = JSONEncoder()
    private static let decoder = JSONDecoder()

    /// One operation of a batch, as the route it names answers it.
    static func run(_ operation: Components.Schemas.BatchOperation, table: OperationTable, requestID: String) async -> Components.Schemas.BatchResult {
        func problem(_ made: Problem.Made) -> Components.Schemas.BatchResult {
            .init(status: made.status.code, body: try? decoder.decode(OpenAPIValueContainer.self, from: Data(made.bytes)))
        }
        let path = operation.path
        let pathOnly = path.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        guard path.hasPrefix("/v1/"), pathOnly != "/v1/batch" else {
            return problem(Problem.make(.badRequest, "a batched path is one of the API's under /v1/, not /v1/batch", requestID: requestID, field: "path"))
        }
        let method: HTTPRequest.Method =
            switch operation.method {
            case .get: .get
            case .post: .post
            case .put: .put
            case .delete: .delete
            }
        guard let (handler, metadata) = table.handler(method, pathOnly) else {
            return problem(
                Problem.make(
                    .notFound, "there is no \(operation.method.rawValue) \(pathOnly.prefix(200)); docs/openapi.yaml lists the routes",
                    requestID: requestID))
        }
        var request = HTTPRequest(method: method, scheme: nil, authority: nil, path: path)
        var body: HTTPBody?
        if let json = operation.body {
            guard let bytes = try? encoder.encode(json) else {
                return problem(Problem.make(.badRequest, "the body does not encode", requestID: requestID, field: "body"))
            }
            request.headerFields[.contentType] = "application/json"
            body = HTTPBody(bytes)
        }
        do {
            let (response, answer) = try await Caller.$requestID.withValue(requestID) { try await handler(request, body, metadata) }
            guard let answer else { return .init(status: response.status.code) }
            guard response.headerFields[.contentType]?.hasPrefix("application/json") == true else {
                return problem(Problem.make(.badRequest, "\(pathOnly.prefix(200)) answers bytes, not JSON; call it on its own", requestID: requestID))
            }
            let bytes = try await Data(collecting: answer, upTo: maximumBatchedAnswerBytes)
            return .init(status: response.status.code, body: try decoder.decode(OpenAPIValueContainer.self, from: bytes))
        } catch {
            return problem(Problem.make(for: error, requestID: requestID))
        }
    }
}
