import CanopyIO

/// Waits until `condition` holds, checking it every `interval`, for at most `limit`: the
/// one way tests wait for something to happen (never a fixed sleep).
///
/// ```swift
/// #expect(try await eventually { receiver.received.count == 2 })
/// ```
///
/// - Returns: whether the condition held (checked once more at the end).
public func eventually(
    within limit: Duration = .seconds(10), every interval: Duration = .milliseconds(10),
    _ condition: () async throws -> Bool
) async throws -> Bool {
    let deadline = ContinuousClock.now + limit
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        try await Task.sleep(for: interval)
    }
    return try await condition()
}

extension ZMQSocket {
    /// The next message on this socket within `limit`, or nil when none came: waits without
    /// blocking a thread of the cooperative pool.
    public func receive(within limit: Duration, every interval: Duration = .milliseconds(5)) async throws -> [[UInt8]]? {
        var frames: [[UInt8]]?
        _ = try await eventually(within: limit, every: interval) {
            frames = try receive()
            return frames != nil
        }
        return frames
    }
}
