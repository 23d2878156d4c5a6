import CanopyServiceKit
import Testing

/// The edge decides which requests it records before making any span (``EdgeSampling``), as
/// the OpenTelemetry sampler the `OTEL_TRACES_SAMPLER` variables name would have.
struct EdgeSamplingTests {
    @Test func eachSamplerFollowsOrIgnoresTheCallerAsItsNameSays() {
        func sampling(_ name: String?, _ argument: String? = nil) -> EdgeSampling {
            var environment: [String: String] = [:]
            environment["OTEL_TRACES_SAMPLER"] = name
            environment["OTEL_TRACES_SAMPLER_ARG"] = argument
            return EdgeSampling(environment: environment)
        }
        // Canopy's default: only what an app's traceparent samples.
        for unset in [sampling(nil), sampling(""), sampling("parentbased_always_off")] {
            #expect(unset.records(parentSampled: true) && !unset.records(parentSampled: false) && !unset.records(parentSampled: nil))
        }
        let on = sampling("parentbased_always_on")
        #expect(on.records(parentSampled: nil) && on.records(parentSampled: true) && !on.records(parentSampled: false))
        #expect(sampling("always_on").records(parentSampled: false), "not parent-based: the caller's flag does not count")
        #expect(!sampling("always_off").records(parentSampled: true))
        #expect(sampling("parentbased_traceidratio", "0.25").root == .ratio(0.25))
        #expect(sampling("traceidratio").root == .always, "a ratio's argument defaults to 1")
        #expect(sampling("traceidratio", "0").root == .never)
        #expect(sampling("parentbased_traceidratio", "0.01").followsParent && !sampling("traceidratio", "0.01").followsParent)
    }

    @Test func aRatioRecordsItsShareOfNewRequestsAndFollowsCallers() {
        let onePercent = EdgeSampling(followsParent: true, root: .ratio(0.01))
        let draws = 200_000
        let recorded = (0..<draws).count { _ in onePercent.records(parentSampled: nil) }
        // 2,000 expected; the standard deviation is about 44.
        #expect((1_750...2_250).contains(recorded), "\(recorded) of \(draws)")
        #expect((0..<1_000).allSatisfy { _ in onePercent.records(parentSampled: true) })
        #expect((0..<1_000).allSatisfy { _ in !onePercent.records(parentSampled: false) })
        let half = EdgeSampling(followsParent: false, root: .ratio(0.5))
        let halves = (0..<draws).count { _ in half.records(parentSampled: false) }
        #expect((95_000...105_000).contains(halves), "\(halves) of \(draws): a caller's flag does not count")
    }
}
