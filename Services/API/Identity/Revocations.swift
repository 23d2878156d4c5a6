import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation
import Logging
import ServiceLifecycle
import Synchronization

/// What is revoked now: tokens by their id (`jti`), until they would have ended anyway; and
/// people signed out everywhere, every token issued to them (`iat`) before a time, by the
/// ``SignOutDigest`` of their id.
public struct Revocations: Sendable, Equatable {
    public var tokens: [String: Date] = [:]
    public var signedOut: [String: Date] = [:]

    public init() {}

    /// Whether a token with this id, naming the person whose sign-out digests are `digests`
    /// (``SignOutDigest/candidates(_:)``) and issued at `issuedAt`, is revoked.
    public func revokes(id: String?, signedOutAs digests: [String], issuedAt: Date?) -> Bool {
        if let id, tokens[id] != nil { return true }
        guard let before = digests.lazy.compactMap({ signedOut[$0] }).max() else { return false }
        // A token that does not say when it was issued is issued before any sign-out.
        return (issuedAt ?? .distantPast) < before
    }
}

/// The revocations in force, as every request checks them (one lock), kept up to date from
/// the store: its generation read every ``interval`` (a single-row read), everything loaded
/// again when it moved. A revocation reaches every edge within ``interval``.
///
/// The watching runs on a thread of its own from the start (a blocking read every interval:
/// neither the cooperative pool nor the global queues, which a busy process may keep full, can
/// delay a revocation); ``run()`` only ends it at graceful shutdown.
public final class RevocationWatcher: Service, Sendable {
    private let store: any RevocationStoring
    private let current: Mutex<Revocations>
    /// Sign-outs this edge recorded (``note(signOut:before:)``), until a reload has them.
    private let noted = Mutex<[String: Date]>([:])
    private let stop = Mutex(false)
    private let finished = DispatchSemaphore(value: 0)
    public static let interval: Duration = .milliseconds(100)

    /// - Parameters:
    ///   - store: where revocations are kept.
    ///   - digests: how sign-outs name people; with it, sign-outs another (older) edge records
    ///     under a person's id are digested as soon as they are seen (a rolling upgrade).
    ///   - logger: where a store that cannot be read is told.
    public init(store: any RevocationStoring, digests: SignOutDigest? = nil, logger: Logger) throws {
        self.store = store
        // The generation read before loading: a change in between is loaded again, never missed.
        let generation = try store.generation()
        current = Mutex(try store.load(now: Date()))
        let thread = Thread { [weak self] in
            var seen = generation
            while let watcher = self, !watcher.stop.withLock({ $0 }) {
                Thread.sleep(forTimeInterval: Self.interval.seconds)
                do {
                    let now = try watcher.store.generation()
                    guard now != seen else { continue }
                    if let digests { try watcher.store.digestLegacySignOuts(digests) }
                    var loaded = try watcher.store.load(now: Date())
                    watcher.merge(into: &loaded)
                    watcher.current.withLock { $0 = loaded }
                    seen = now
                } catch {
                    logger.warning("api.revocations.unreadable", metadata: ["api.error": "\(error)"])
                }
            }
            self?.finished.signal()
        }
        thread.name = "canopy-revocations"
        thread.start()
    }

    /// The revocations in force now.
    public var revocations: Revocations { current.withLock { $0 } }

    /// Whether a token is revoked (see ``Revocations/revokes(id:signedOutAs:issuedAt:)``).
    public func revokes(id: String?, signedOutAs digests: [String], issuedAt: Date?) -> Bool {
        current.withLock { $0.revokes(id: id, signedOutAs: digests, issuedAt: issuedAt) }
    }

    /// A sign-out this edge recorded itself: in force here at once, before the store is read
    /// again (every other edge has it within ``interval``), and kept through a reload that read
    /// the store before it was committed.
    public func note(signOut digest: String, before: Date) {
        let at = Date(timeIntervalSince1970: before.timeIntervalSince1970.rounded(.down))
        noted.withLock { $0[digest] = max($0[digest] ?? .distantPast, at) }
        current.withLock { $0.signedOut[digest] = max($0.signedOut[digest] ?? .distantPast, at) }
    }

    /// Adds to `loaded` the sign-outs noted here that it does not have yet; forgets those it has.
    private func merge(into loaded: inout Revocations) {
        noted.withLock { noted in
            for (digest, at) in noted {
                if let stored = loaded.signedOut[digest], stored >= at {
                    noted[digest] = nil
                } else {
                    loaded.signedOut[digest] = at
                }
            }
        }
    }

    /// Waits for graceful shutdown, then ends the watching thread.
    public func run() async throws {
        try? await gracefulShutdown()
        stop.withLock { $0 = true }
        let finished = self.finished
        await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                _ = finished.wait(timeout: .now() + 1)
                continuation.resume()
            }
        }
    }
}
