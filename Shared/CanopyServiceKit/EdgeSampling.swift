import Foundation
import OTel
import Synchronization

/// Which requests the HTTP edge records, decided before any span is made: the edge is where
/// traces begin (every other process records a request only when its caller's context is
/// sampled), and starting spans it then did not record (with their attributes, and the bus
/// calls' checks under them) was about 4% of canopy-api's CPU samples at 1% sampling
/// (docs/PERFORMANCE.md, "Tracing"). So the edge applies the
/// configured sampler (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`) itself, and its tracer
/// records every span the edge makes (``tracerSampler``).
///
/// Parent-based samplers follow an app's `traceparent` (its sampled flag); the others, and a
/// request without one, go by the root rule: always, never, or a share of requests drawn at
/// random (`traceidratio`: not from the trace id, which nothing after the edge reads; a trace
/// that goes on is marked sampled in its context, and the services follow that flag).
public struct EdgeSampling: Sendable, Equatable {
    /// What decides a request without a caller's sampled context.
    public enum Root: Sendable, Equatable {
        case never
        case always
        /// This share of requests, 0 to 1.
        case ratio(Double)
    }

    /// Whether a caller's context decides (the `parentbased_*` samplers).
    public let followsParent: Bool
    /// What decides the rest.
    public let root: Root

    public init(followsParent: Bool, root: Root) {
        self.followsParent = followsParent
        self.root = root
    }

    /// The sampler `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` in `environment` name
    /// (unset: `parentbased_always_off`, Canopy's default; a ratio's argument unset: 1, as
    /// OpenTelemetry's specification says). Values ``TraceOptions`` validated.
    public init(environment: [String: String]) {
        let name = environment["OTEL_TRACES_SAMPLER"].flatMap { $0.isEmpty ? nil : $0 } ?? "parentbased_always_off"
        let ratio = environment["OTEL_TRACES_SAMPLER_ARG"].flatMap(Double.init).map { min(1, max(0, $0)) } ?? 1
        followsParent = name.hasPrefix("parentbased_")
        switch name.replacingOccurrences(of: "parentbased_", with: "") {
        case "always_on": root = .always
        case "traceidratio": root = ratio >= 1 ? .always : ratio <= 0 ? .never : .ratio(ratio)
        default: root = .never
        }
    }

    /// Whether to record a request whose caller's context is sampled (`true`), not sampled
    /// (`false`), or that has none (`nil`).
    public func records(parentSampled: Bool?) -> Bool {
        if followsParent, let parentSampled { return parentSampled }
        switch root {
        case .never: return false
        case .always: return true
        case .ratio(let share): return Self.draw() < share
        }
    }

    /// What the edge's tracer samples with: everything the edge decided to record (and, under
    /// a parent-based rule, a span's children as their parent is).
    public var tracerSampler: OTel.Configuration.TracesConfiguration.SamplerConfiguration {
        followsParent ? .parentBasedAlwaysOn : .alwaysOn
    }

    /// A number in [0, 1): SplitMix64 over a shared counter, seeded once from the system; no
    /// lock and no system call per request.
    static func draw() -> Double {
        var mixed = state.wrappingAdd(0x9E37_79B9_7F4A_7C15, ordering: .relaxed).newValue
        mixed = (mixed ^ (mixed >> 30)) &* 0xBF58_476D_1CE4_E5B9
        mixed = (mixed ^ (mixed >> 27)) &* 0x94D0_49BB_1331_11EB
        mixed ^= mixed >> 31
        return Double(mixed >> 11) / Double(1 << 53)
    }

    private static let state = Atomic<UInt64>(UInt64.random(in: .min ... .max))
}
