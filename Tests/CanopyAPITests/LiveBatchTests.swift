import Testing

/// The suites that run canopy-batch over HTTP, one after another: some count what the
/// process's metrics registry gained, which another suite's requests must not change meanwhile.
@Suite(.serialized)
struct LiveBatchTests {}
