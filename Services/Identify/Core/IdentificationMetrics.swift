import CanopyMessages
import Metrics

/// canopy-identify's own figures in swift-metrics, created once (the service kit adds the
/// per-operation series every service has):
/// - `canopy_identify_submissions_total{result}`: `new` (a provider was asked) or `repeat`
///   (the same photos and organs, answered from the store);
/// - `canopy_identify_provider_duration_seconds{provider,outcome}`: each provider call;
/// - `canopy_identify_features_computed_total`: photos whose features were computed (once each);
/// - `canopy_identify_plantnet_quota_remaining`: what Pl@ntNet last said is left today.
final class IdentificationMetrics: Sendable {
    private let newSubmissions = Counter(label: "canopy_identify_submissions_total", dimensions: [("result", "new")])
    private let repeatedSubmissions = Counter(label: "canopy_identify_submissions_total", dimensions: [("result", "repeat")])
    private let featuresComputed = Counter(label: "canopy_identify_features_computed_total")
    let quotaRemaining = Gauge(label: "canopy_identify_plantnet_quota_remaining")

    func submission(repeated: Bool) {
        (repeated ? repeatedSubmissions : newSubmissions).increment()
    }

    func computedFeatures() {
        featuresComputed.increment()
    }

    /// Runs a provider call and records its time under the provider and the outcome (`ok`,
    /// `no_match`, or the error's code).
    func providerCall(_ provider: Identification.Provider, _ body: () async throws -> [Identification.Candidate]) async throws -> [Identification.Candidate] {
        let started = ContinuousClock.now
        var outcome = "ok"
        defer {
            let elapsed = ContinuousClock.now - started
            Metrics.Timer(label: "canopy_identify_provider_duration_seconds", dimensions: [("provider", provider.rawValue), ("outcome", outcome)])
                .recordNanoseconds(elapsed.nanoseconds)
        }
        do {
            let candidates = try await body()
            if candidates.isEmpty { outcome = "no_match" }
            return candidates
        } catch let error as CanopyError {
            outcome = error.code.rawValue
            throw error
        } catch {
            outcome = "internal"
            throw error
        }
    }
}
