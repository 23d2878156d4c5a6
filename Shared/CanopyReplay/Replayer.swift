import CanopyBus
import CanopyCapture
import Foundation

/// Sends a capture's requests again and compares each answer with the captured one.
///
/// Each captured client becomes a lane: its requests go in their captured order, and a
/// request waits for the answers its client had received before sending it in the capture
/// (so a create is answered before the request that uses its id); requests the client had
/// in the air together go together again. Lanes run concurrently, spread over a few DEALER
/// connections. Answers teach the replay ids that changed (``Rebindings``), which later
/// requests are sent with.
///
/// The replay runs on one thread of its own: ``ReplayEngine`` reads the capture and sends and
/// receives frames, and ``ReplaySchedule`` (no IO) decides when each request goes and compares
/// the answers. No task, continuation or lock per request, so replaying keeps up with the
/// stack it drives.
public final class Replayer: Sendable {
    /// Where the stack's broker is, and how to reach it.
    public struct Connection: Sendable {
        public var endpoint: String
        /// CurveZMQ client settings when the broker runs CURVE.
        public var curve: CurveClientSettings?
        /// DEALER connections the lanes are spread over.
        public var count: Int

        public init(endpoint: String, curve: CurveClientSettings? = nil, count: Int = 2) {
            self.endpoint = endpoint
            self.curve = curve
            self.count = max(1, count)
        }
    }

    private let connection: Connection
    private let options: ReplayOptions

    public init(connection: Connection, options: ReplayOptions) {
        self.connection = connection
        self.options = options
    }

    /// Replays every request of `reader`'s capture; `progress` is called now and then from
    /// the replay's thread.
    public func run(_ reader: CaptureReader, progress: @escaping @Sendable (ReplayProgress) -> Void = { _ in }) async throws -> ReplayReport {
        let box = ReaderBox(reader)
        let (connection, options) = (self.connection, self.options)
        return try await withCheckedThrowingContinuation { continuation in
            LoopThread.start(name: "canopy-replay") {
                do {
                    var engine = try ReplayEngine(connection: connection, options: options)
                    continuation.resume(returning: try engine.run(box.reader, progress: progress))
                } catch {
                    continuation.resume(throwing: error)
                }
            }
        }
    }
}

/// Hands the reader to the replay's thread, which alone uses it from then on.
private final class ReaderBox: @unchecked Sendable {
    let reader: CaptureReader
    init(_ reader: CaptureReader) { self.reader = reader }
}
