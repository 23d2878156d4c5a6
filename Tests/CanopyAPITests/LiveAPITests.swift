import Testing

/// The suites that run canopy-api over HTTP, one after another: some count what the
/// process's metrics registry gained, which another suite's requests must not change meanwhile.
@Suite(.serialized)
struct LiveAPITests {}
