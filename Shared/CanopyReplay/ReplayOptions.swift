import Foundation

/// How a replay is paced and compared.
public struct ReplayOptions: Sendable {
    /// When each captured request is sent again.
    public enum Pacing: Sendable, Equatable {
        /// At the captured times, `speed` times faster (1: as recorded).
        case recorded(speed: Double)
        /// A fixed number of requests a second, whatever the captured times.
        case rate(Double)
        /// As fast as the stack answers.
        case fast
    }

    public var pacing: Pacing = .recorded(speed: 1)
    /// Paths left out of the comparison (`--ignore`).
    public var ignore: [String] = []
    /// Requests read ahead of their answers at most (a bound on memory).
    public var window = 10_000
    /// Differing answers described in the report (all are counted).
    public var examples = 50
    /// When set, every request waits this long instead of its captured deadline.
    public var timeout: Duration?
    /// Every request waits until the replay has had answered every request whose captured
    /// answer came before it was captured, whichever client sent it (not only its own
    /// client's): what one client did before another asked (an operator's reference photos
    /// loaded before a person's identification) happens before it again; and waits until the
    /// stack has answered as many of services' own requests of each operation as the capture
    /// had before it (canopy-care's follow-ups to canopy-remind: a person's pending reminders
    /// read after the window reached canopy-remind are read after it again), for at most 3 s.
    /// `--fresh` replays so.
    public var causalOrder = false
    /// The clock the stack replayed against goes by.
    public var clock: ReplayClock = .system
    /// Date-times that differ by the clocks' shift (give or take the requests' own time and
    /// this) are the same time (`--time-tolerance-ms`); nil compares them as text.
    public var timeTolerance: Duration? = .milliseconds(250)
    /// Where this replay's answers are written as a capture of their own (the captured
    /// requests, each with this replay's answer, its new ids put back to the captured ones):
    /// what `--compare-with` replays another build against.
    public var answersPath: String?

    public init() {}
}

/// The clock of the stack a replay drives.
public enum ReplayClock: Sendable, Equatable {
    /// The system's (a running stack): a replayed time is later than the captured one by
    /// how much later the request went.
    case system
    /// A clock that stood at `captureTime` (ns since 1970) at the wall-clock instant `at` and
    /// runs (a fresh stack's `--clock from:…,at:…`): the replay begins sending then, each
    /// request at its captured distance from `captureTime`, so it meets the stack's clock at
    /// the captured time.
    case anchored(captureTime: Int64, at: Date)
}

/// What a replay found.
public struct ReplayReport: Codable, Sendable, Equatable {
    /// One answer that differed, or a request that failed.
    public struct Example: Codable, Sendable, Equatable {
        public var client: String
        public var service: String
        public var operation: String
        /// When the request was captured, ns since 1970.
        public var time: Int64
        public var principal: String
        /// For a failure: what went wrong.
        public var failure: String?
        public var differences: [Difference]
    }

    public var requests = 0
    /// The answer was the captured one (ids the replay rebound and ignored paths aside).
    public var matched = 0
    public var differed = 0
    /// The stack did not answer (timeout, no workers, worker lost, busy) where the capture had an answer.
    public var failed = 0
    /// Not sent: the capture left their attachments out.
    public var skipped = 0
    /// Sent, but the capture holds no answer to compare with (it ended first).
    public var unanswered = 0
    /// Captured answers whose request began before the capture.
    public var answersWithoutRequest = 0
    /// Requests services made themselves (``RequestHeader/Flag/derived``): not sent, since the
    /// replayed requests make the services make them again.
    public var derived = 0
    /// Ids learned from answers and put into later requests.
    public var rebound = 0
    public var seconds = 0.0
    public var requestsPerSecond = 0.0
    public var replayedP50Micros: UInt64 = 0
    public var replayedP99Micros: UInt64 = 0
    public var capturedP50Micros: UInt64 = 0
    public var capturedP99Micros: UInt64 = 0
    /// How reading the capture ended.
    public var ending = ""
    public var examples: [Example] = []
    /// Where date-times were compared as times, and matched once moved by the clocks' shift
    /// (`$.plant.createdAt`, `$.tasks[*].due`), sorted.
    public var timeFields: [String] = []
    /// Marks in the capture (a snapshot's cut).
    public var marks = 0
    /// Requests that waited for background work the capture had seen done before them
    /// (``ReplayOptions/causalOrder``) and went without it after a while.
    public var backgroundWaitsEnded = 0
    /// Where answers differed: `service.operation $.path` (indexes as `[*]`) and how many
    /// answers differed there (at most ``ReplayReport/pathLimit`` places).
    public var differingPaths: [String: Int] = [:]
    public static let pathLimit = 1_000

    public init() {}

    /// Whether anything differed or failed (or the capture was cut short).
    public var isClean: Bool { differed == 0 && failed == 0 && ending == "complete" }
}

/// Progress of a running replay, for a progress bar.
public struct ReplayProgress: Sendable {
    public var bytesRead: Int
    public var sent: Int
    public var completed: Int
}
