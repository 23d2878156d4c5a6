import CanopyBus
import CanopyMessages
import Foundation
import Synchronization

/// Operations of the `test` service that the live tests and `canopy-test-worker` use.
public enum TestService {
    /// The service name.
    public static let name = "test"

    /// What a test request asks the worker to do.
    public struct Request: Codable, Sendable, Equatable {
        /// Text echoed back.
        public var text: String
        /// Milliseconds the handler sleeps before answering (cancellable).
        public var sleepMilliseconds: Int
        /// Bytes of padding added to the echoed text (a small request with a large reply).
        public var replyPaddingBytes: Int?

        /// - Parameters:
        ///   - text: echoed back.
        ///   - sleepMilliseconds: how long the handler sleeps first.
        ///   - replyPaddingBytes: bytes of `x` appended to the echoed text.
        public init(text: String, sleepMilliseconds: Int = 0, replyPaddingBytes: Int? = nil) {
            self.text = text
            self.sleepMilliseconds = sleepMilliseconds
            self.replyPaddingBytes = replyPaddingBytes
        }
    }

    /// What a test worker answers.
    public struct Reply: Codable, Sendable, Equatable {
        /// The request's text.
        public var text: String
        /// The principal the worker saw.
        public var principal: String?
        /// The worker's process id, so tests see which worker answered.
        public var pid: Int32
        /// The worker's name, so tests see which in-process worker answered.
        public var worker: String
    }

    /// `test.echo`: idempotent; sleeps, then echoes.
    public enum Echo: BusOperation {
        /// The text to echo, how long to sleep first, and padding for the reply.
        public typealias Request = TestService.Request
        /// The text (padded), with the principal and the worker that answered.
        public typealias Reply = TestService.Reply
        public static let service = TestService.name
        public static let name = "echo"
        public static let access = Access.public
        public static let idempotent = true
    }

    /// `test.append`: not idempotent; sleeps, then echoes.
    public enum Append: BusOperation {
        /// The text to echo and record, how long to sleep first, and padding for the reply.
        public typealias Request = TestService.Request
        /// The text (padded), with the principal and the worker that answered.
        public typealias Reply = TestService.Reply
        public static let service = TestService.name
        public static let name = "append"
        public static let access = Access.public
    }

    /// Bytes that travel as attachments, and a label in the JSON.
    public struct Blobs: AttachmentCarrying, Sendable, Equatable {
        /// A label, in the JSON body.
        public var label: String
        /// The attachments.
        public var blobs: [Data]

        enum CodingKeys: String, CodingKey { case label }

        /// - Parameters:
        ///   - label: in the JSON body.
        ///   - blobs: the attachments.
        public init(label: String, blobs: [Data]) {
            self.label = label
            self.blobs = blobs
        }

        public init(from decoder: any Decoder) throws {
            label = try decoder.container(keyedBy: CodingKeys.self).decode(String.self, forKey: .label)
            blobs = []
        }

        public var attachments: [Data] {
            get { blobs }
            set { blobs = newValue }
        }

        public static let attachmentCount = 0...Wire.maximumAttachments
    }

    /// `test.blobs`: answers its attachments reversed, each reversed too, and counts them in
    /// the label. Coalescable, so tests see attachments compared as flights are joined.
    public enum ReverseBlobs: BusOperation {
        /// A label and the attachments to reverse.
        public typealias Request = Blobs
        /// The attachments reversed, each reversed too; the label followed by `:` and their count.
        public typealias Reply = Blobs
        public static let service = TestService.name
        public static let name = "blobs"
        public static let access = Access.public
        public static let idempotent = true
        public static let coalescable = true
    }

    /// `test.fail`: sleeps, then answers the error it is asked for (`text` is the code).
    /// Coalescable, so tests see an error fan out.
    public enum Fail: BusOperation {
        /// The error code to answer (in `text`), and how long to sleep first.
        public typealias Request = TestService.Request
        /// Never sent: the handler always answers the error.
        public typealias Reply = TestService.Reply
        public static let service = TestService.name
        public static let name = "fail"
        public static let access = Access.public
        public static let idempotent = true
        public static let coalescable = true
    }

    /// `test.lookup`: like echo, but coalescable: identical requests in flight share one call.
    public enum Lookup: BusOperation {
        /// The text to echo, how long to sleep first, and padding for the reply.
        public typealias Request = TestService.Request
        /// The text (padded), with the principal and the worker that answered.
        public typealias Reply = TestService.Reply
        public static let service = TestService.name
        public static let name = "lookup"
        public static let access = Access.public
        public static let idempotent = true
        public static let coalescable = true
    }
}

/// The `test` service: counts the calls it handles and the cancellations it sees.
public struct TestWorkerService: BusService {
    public let name = TestService.name
    /// Tells in-process workers apart in replies.
    public let workerName: String
    /// Calls handled, cancellations seen.
    public let counters = TestCounters()

    /// - Parameter workerName: a name that shows in replies.
    public init(workerName: String) {
        self.workerName = workerName
    }

    public func register(_ handlers: inout OperationHandlers) {
        let respond: @Sendable (TestService.Request, RequestContext) async throws -> TestService.Reply = { [workerName, counters] request, context in
            counters.calls.add(1, ordering: .relaxed)
            counters.enter()
            defer { counters.running.subtract(1, ordering: .relaxed) }
            do {
                if request.sleepMilliseconds > 0 { try await Task.sleep(for: .milliseconds(request.sleepMilliseconds)) }
            } catch {
                counters.cancellations.add(1, ordering: .relaxed)
                throw error
            }
            let padding = String(repeating: "x", count: min(max(0, request.replyPaddingBytes ?? 0), 64 * 1024 * 1024))
            return TestService.Reply(text: request.text + padding, principal: context.principal, pid: getpid(), worker: workerName)
        }
        handlers.on(TestService.Echo.self, respond)
        handlers.on(TestService.Append.self) { [counters] request, context in
            counters.appended.withLock { $0.append(request.text) }
            return try await respond(request, context)
        }
        handlers.on(TestService.Lookup.self, respond)
        handlers.on(TestService.ReverseBlobs.self) { [counters] request, _ in
            counters.calls.add(1, ordering: .relaxed)
            return TestService.Blobs(label: "\(request.label):\(request.blobs.count)", blobs: request.blobs.reversed().map { Data($0.reversed()) })
        }
        handlers.on(TestService.Fail.self) { [counters] request, _ in
            counters.calls.add(1, ordering: .relaxed)
            if request.sleepMilliseconds > 0 { try await Task.sleep(for: .milliseconds(request.sleepMilliseconds)) }
            throw CanopyError(CanopyError.Code(rawValue: request.text) ?? .internal, "failed as asked")
        }
    }
}

/// Counters a test reads after the fact.
public final class TestCounters: Sendable {
    /// Calls that reached a handler.
    public let calls = Atomic<Int>(0)
    /// Handlers that saw their task cancelled.
    public let cancellations = Atomic<Int>(0)
    /// Handlers running now.
    public let running = Atomic<Int>(0)
    /// The most handlers that ever ran at once.
    public let mostRunning = Atomic<Int>(0)
    /// The text of every `test.append` (not idempotent) that reached a handler, in order: a
    /// test sees one run twice.
    public let appended = Mutex<[String]>([])

    init() {}

    func enter() {
        let now = running.add(1, ordering: .relaxed).newValue
        var seen = mostRunning.load(ordering: .relaxed)
        while now > seen {
            let (exchanged, original) = mostRunning.compareExchange(expected: seen, desired: now, ordering: .relaxed)
            if exchanged { break }
            seen = original
        }
    }
}
