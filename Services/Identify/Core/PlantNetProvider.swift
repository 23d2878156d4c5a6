import AsyncHTTPClient
import CanopyMessages
import CanopyServiceKit
import Foundation
import Logging
import MultipartKit
import NIOCore
import NIOHTTP1
import Synchronization

/// Where and how to reach Pl@ntNet. The key is a secret: it goes in the request's query, as
/// the API requires, and nowhere else (never into a log line or an error message).
public struct PlantNetSettings: Sendable {
    /// The API's base URL (tests point it at a local server).
    public var baseURL: String = "https://my-api.plantnet.org"
    /// The API key (`api-key`).
    public var apiKey: String
    /// The flora to search (`all`, or a regional project such as `weurope`).
    public var project: String = "all"
    /// The language of common names.
    public var language: String = "en"
    /// Candidates asked for (`nb-results`).
    public var results: Int = Identification.Limits.candidates
    /// The daily allowance (500 on the free plan), for the quota report.
    public var dailyLimit: Int = 500
    /// Pause before each retry of a 429, a 5xx or a lost connection.
    public var backoff: [Duration] = [.seconds(1), .seconds(2), .seconds(4)]
    /// How long one call may take.
    public var timeout: Duration = .seconds(30)

    public init(apiKey: String) {
        self.apiKey = apiKey
    }
}

/// `plantnet`: the Pl@ntNet identification API v2, as documented
/// (https://my.plantnet.org/doc/openapi): `POST /v2/identify/{project}`, multipart with one
/// `images` part and one `organs` part per photo.
///
/// - 200: the ranked results; `remainingIdentificationRequests` is kept as the quota.
/// - 404 "Species not found": no match (an empty result, not a failure).
/// - 401 and 403: the key is wrong, a configuration error (`internal`), not retried.
/// - 429, 5xx and lost connections: retried after ``PlantNetSettings/backoff``, then `busy`.
/// - other 4xx: the photos were refused (`badRequest`), not retried.
///
/// When the quota is used up, no call is made until it resets (midnight UTC): the answer is
/// `busy`, naming when.
final class PlantNetProvider: IdentificationProvider {
    let settings: PlantNetSettings
    let store: any IdentificationStoring
    let client: HTTPClient
    let logger: Logger
    /// Calls made since the start.
    let calls = Atomic<Int>(0)
    let metrics: IdentificationMetrics?

    var kind: Identification.Provider { .plantnet }

    init(settings: PlantNetSettings, store: any IdentificationStoring, client: HTTPClient = .shared, metrics: IdentificationMetrics? = nil, logger: Logger) {
        self.settings = settings
        self.store = store
        self.client = client
        self.metrics = metrics
        self.logger = logger
    }

    static let quotaKey = "plantnet"

    /// The quota as last reported, and when an exhausted one resets.
    func quota(now: Date = Date()) throws -> ProviderQuota {
        var state = try store.quota(provider: Self.quotaKey)
        if let resetsAt = state.resetsAt, resetsAt <= now { state = .init(remaining: nil, resetsAt: nil) }
        return state
    }

    func identify(_ query: ProviderQuery) async throws -> [Identification.Candidate] {
        let quota = try await offThePool { try self.quota() } // a store read: off the cooperative pool
        if let remaining = quota.remaining, remaining <= 0 {
            let resets = (quota.resetsAt ?? Self.nextReset(after: Date())).formatted(.iso8601)
            throw CanopyError(.busy, "Pl@ntNet's daily quota of \(settings.dailyLimit) identifications is used up; it resets at \(resets)")
        }
        var parts: [MultipartPart] = []
        for (index, photo) in query.photos.enumerated() {
            let bytes = try await photo.gallery()
            var headers = HTTPHeaders()
            headers.add(name: "Content-Disposition", value: "form-data; name=\"images\"; filename=\"photo\(index + 1).jpg\"")
            headers.add(name: "Content-Type", value: "image/jpeg")
            parts.append(MultipartPart(headers: headers, body: ByteBuffer(bytes: bytes)))
            var organ = HTTPHeaders()
            organ.add(name: "Content-Disposition", value: "form-data; name=\"organs\"")
            parts.append(MultipartPart(headers: organ, body: ByteBuffer(string: photo.organ.rawValue)))
        }
        let boundary = "canopy-\(UUID().uuidString)"
        var body = ByteBuffer()
        try MultipartSerializer().serialize(parts: parts, boundary: boundary, into: &body)

        var request = HTTPClientRequest(url: requestURL())
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "multipart/form-data; boundary=\(boundary)")
        request.headers.add(name: "Accept", value: "application/json")
        request.body = .bytes(body)

        var attempt = 0
        while true {
            let outcome = await call(request)
            switch outcome {
            case .answered(let candidates): return candidates
            case .refused(let error): throw error
            case .retry(let reason):
                guard attempt < settings.backoff.count else {
                    throw CanopyError(.busy, "Pl@ntNet is not answering (\(reason)) after \(attempt + 1) tries; try again later")
                }
                logger.warning("identify.plantnet.retry", metadata: ["identify.reason": "\(reason)", "identify.attempt": "\(attempt + 1)"])
                try await Task.sleep(for: settings.backoff[attempt])
                attempt += 1
            }
        }
    }

    private enum Outcome {
        case answered([Identification.Candidate])
        case refused(CanopyError)
        case retry(String)
    }

    private func call(_ request: HTTPClientRequest) async -> Outcome {
        calls.add(1, ordering: .relaxed)
        let response: HTTPClientResponse
        let body: ByteBuffer
        do {
            let (seconds, attoseconds) = settings.timeout.components
            response = try await client.execute(request, timeout: .nanoseconds(seconds * 1_000_000_000 + attoseconds / 1_000_000_000))
            body = try await response.body.collect(upTo: 4 * 1024 * 1024)
        } catch {
            // Only the error's kind: its text could carry the request's URL, and so the key.
            return .retry("connection failed: \(type(of: error))")
        }
        let status = response.status.code
        switch status {
        case 200:
            do {
                let decoded = try JSONDecoder().decode(PlantNetResponse.self, from: Data(buffer: body))
                let remaining = decoded.remainingIdentificationRequests
                try await offThePool { try self.recordQuota(remaining) }
                return .answered(decoded.candidates())
            } catch let error as CanopyError {
                return .refused(error)
            } catch {
                return .refused(CanopyError(.internal, "Pl@ntNet answered with JSON canopy-identify cannot read: \(error)"))
            }
        case 404:
            return .answered([]) // "Species not found": nothing matched
        case 401, 403:
            return .refused(
                CanopyError(
                    .internal,
                    "Pl@ntNet refused canopy-identify's API key (HTTP \(status)): a configuration error; set --plantnet-key (CANOPY_PLANTNET_KEY) to a valid key"
                ))
        case 429:
            return .retry("HTTP 429 Too Many Requests")
        case 500...599:
            return .retry("HTTP \(status)")
        default:
            let message = (try? JSONDecoder().decode(PlantNetError.self, from: Data(buffer: body)).message) ?? "HTTP \(status)"
            return .refused(CanopyError(.badRequest, "Pl@ntNet refused the photos: \(message.prefix(300))"))
        }
    }

    private func requestURL() -> String {
        var components = URLComponents(string: settings.baseURL)!
        components.path = (components.path.hasSuffix("/") ? String(components.path.dropLast()) : components.path) + "/v2/identify/\(settings.project)"
        components.queryItems = [
            URLQueryItem(name: "include-related-images", value: "false"),
            URLQueryItem(name: "no-reject", value: "false"),
            URLQueryItem(name: "nb-results", value: "\(settings.results)"),
            URLQueryItem(name: "lang", value: settings.language),
            URLQueryItem(name: "api-key", value: settings.apiKey),
        ]
        return components.string!
    }

    private func recordQuota(_ remaining: Int?, now: Date = Date()) throws {
        guard let remaining else { return }
        metrics?.quotaRemaining.record(remaining)
        try store.saveQuota(.init(remaining: remaining, resetsAt: remaining <= 0 ? Self.nextReset(after: now) : nil), provider: Self.quotaKey, now: now)
    }

    /// Pl@ntNet's daily quota starts again at midnight UTC.
    static func nextReset(after date: Date) -> Date {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        return calendar.nextDate(after: date, matching: DateComponents(hour: 0, minute: 0, second: 0), matchingPolicy: .nextTime)!
    }
}

/// The parts of Pl@ntNet's answer Canopy keeps.
struct PlantNetResponse: Decodable {
    struct Result: Decodable {
        var score: Double
        var species: Species
        var gbif: External?
    }

    struct Species: Decodable {
        var scientificNameWithoutAuthor: String
        var scientificNameAuthorship: String?
        var scientificName: String?
        var genus: Taxon?
        var family: Taxon?
        var commonNames: [String]?
    }

    struct Taxon: Decodable {
        var scientificNameWithoutAuthor: String?
        var scientificName: String?
    }

    /// `{"id": "5330776"}`: GBIF's id, a string of digits in the API's answers.
    struct External: Decodable {
        var id: Int?

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            if let text = try? container.decodeIfPresent(String.self, forKey: .id) {
                id = Int(text)
            } else {
                id = try? container.decodeIfPresent(Int.self, forKey: .id)
            }
        }

        enum CodingKeys: String, CodingKey { case id }
    }

    var results: [Result]
    var remainingIdentificationRequests: Int?

    /// Candidates, with every field brought within Canopy's limits.
    func candidates() -> [Identification.Candidate] {
        func clip(_ text: String?, _ bytes: Int) -> String {
            var text = (text ?? "").filter { !$0.isASCII || $0.asciiValue! >= 0x20 }
            while text.utf8.count > bytes { text.removeLast() }
            return text
        }
        return results.prefix(Identification.Limits.candidates).map { result in
            let species = result.species
            let without = clip(species.scientificNameWithoutAuthor, Care.Limits.scientificNameBytes)
            let authorship = clip(species.scientificNameAuthorship, Care.Limits.nameBytes)
            return Identification.Candidate(
                rank: 0, score: result.score.isFinite ? min(1, max(0, result.score)) : 0,
                scientificName: clip(species.scientificName ?? (authorship.isEmpty ? without : "\(without) \(authorship)"), Care.Limits.scientificNameBytes),
                scientificNameWithoutAuthor: without, authorship: authorship,
                commonNames: (species.commonNames ?? []).prefix(Care.Limits.commonNames).map { clip($0, Care.Limits.nameBytes) },
                genus: clip(species.genus?.scientificNameWithoutAuthor ?? species.genus?.scientificName, Care.Limits.nameBytes),
                family: clip(species.family?.scientificNameWithoutAuthor ?? species.family?.scientificName, Care.Limits.nameBytes),
                gbifID: result.gbif?.id, provider: .plantnet)
        }.ranked()
    }
}

/// Pl@ntNet's error body: `{"statusCode": 400, "error": "Bad Request", "message": "..."}`.
struct PlantNetError: Decodable {
    var message: String
}
