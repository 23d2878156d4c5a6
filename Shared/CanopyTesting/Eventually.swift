/// Waits until `condition` holds, checking it every `interval`, for at most `limit`: the
/// one way tests wait for something to happen (never a fixed sleep).
///
/// ```swift
/// #expect(try await eventually { receiver.received.count == 2 })
/// ```
///
/// - Returns: whether the condition held (checked once more at the end).
public func eventually(within limit: Duration = .seconds(10), every interval: Duration = .milliseconds(10),
                       _ condition: () async throws -> Bool) async throws -> Bool {
    let deadline = ContinuousClock.now + limit
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        try await Task.sleep(for: interval)
    }
    return try await condition()
}
