import CanopyBus
import CanopyMessages

/// The lookups canopy-api batches implicitly (``ImplicitBatcher``): photo variants from
/// canopy-images and plants' next tasks from canopy-care, the two a collection screen asks
/// for a hundred of at once.
struct Lookups: Sendable {
    let variants: ImplicitBatcher<Images.GetVariants.Key, Images.GetVariant.Reply>
    let nextTasks: ImplicitBatcher<Care.NextTasks.Key, Care.NextTasks.Next>

    /// - Parameters:
    ///   - window: how long the first lookup of a batch waits for others.
    ///   - maximumKeys: the most keys in one bus request.
    ///   - maximumInFlight: batches of one kind in the air before lookups wait for one.
    ///   - timeout: how long one bus request may take.
    init(bus: any BusCalling, window: Duration, maximumKeys: Int, maximumInFlight: Int, timeout: Duration) {
        variants = ImplicitBatcher(kind: "variant", window: window, maximumKeys: maximumKeys, maximumInFlight: maximumInFlight) { keys in
            await Self.each(of: keys) {
                try await bus.call(Images.GetVariants.self, .init(keys: keys), timeout: timeout).variants(for: keys)
            }
        }
        nextTasks = ImplicitBatcher(kind: "next-task", window: window, maximumKeys: maximumKeys, maximumInFlight: maximumInFlight) { keys in
            await Self.each(of: keys) {
                try await bus.call(Care.NextTasks.self, .init(keys: keys), timeout: timeout).results.map { result in
                    Result { () throws(CanopyError) in try result.get() }
                }
            }
        }
    }

    /// Each key's result, or the call's own failure (the bus's: timeout, no workers) for every key.
    private static func each<Value>(of keys: [some Any], _ call: () async throws -> [Result<Value, CanopyError>]) async -> [Result<Value, any Error>] {
        do {
            return try await call().map { $0.mapError { $0 } }
        } catch {
            return keys.map { _ in .failure(error) }
        }
    }
}
