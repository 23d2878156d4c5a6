import CanopyMessages
import Foundation
import HeapModule

/// The dispatcher's decisions, with no clock, store or network: times and rows are
/// arguments, answers are values. ``Dispatcher`` reads and writes the store, keeps the time
/// and delivers; this decides what is due and when to wake (``DueQueue``), what a person's due
/// reminders become (``digest(_:now:devices:)``) and what an attempt makes of its send
/// (``update(after:attempt:now:jitter:)``).
struct DispatchPlan: Sendable {
    let settings: DispatchSettings

    // MARK: - What is due, and when to wake

    /// Every pending reminder and unfinished send as (time, row id), earliest first: what is
    /// due at a time, and when the next thing is.
    struct DueQueue: Sendable {
        struct Entry: Comparable, Sendable {
            var at: Double
            var id: Int64
            static func < (lhs: Self, rhs: Self) -> Bool { (lhs.at, lhs.id) < (rhs.at, rhs.id) }
        }

        private(set) var reminders = Heap<Entry>()
        private(set) var sends = Heap<Entry>()

        /// When the next reminder or send is due, if any: when to wake.
        var wake: Double? { [reminders.min?.at, sends.min?.at].compactMap { $0 }.min() }

        /// Adds the store's pending reminders and sends (loaded at start) to what is held.
        mutating func load(reminders loaded: [Entry], sends loadedSends: [Entry]) {
            reminders = Heap(loaded + reminders.unordered)
            sends = Heap(loadedSends + sends.unordered)
        }

        /// Adds reminders whose time is new or changed; true when one is earlier than
        /// everything held (so a sleeping dispatcher must wake to look again). An entry held
        /// twice does no harm: a due reminder is checked against the store.
        mutating func schedule(_ entries: [(id: Int64, fireAt: Double)]) -> Bool {
            let earliest = wake
            for entry in entries { reminders.insert(Entry(at: entry.fireAt, id: entry.id)) }
            return earliest.map { earliest in entries.contains { $0.fireAt < earliest } } ?? !entries.isEmpty
        }

        mutating func remind(_ id: Int64, at: Double) { reminders.insert(Entry(at: at, id: id)) }
        mutating func retry(_ sendID: Int64, at: Double) { sends.insert(Entry(at: at, id: sendID)) }

        /// Takes out everything due at `now`.
        mutating func takeDue(at now: Double) -> (reminders: [Int64], sends: [Int64]) {
            var dueReminders: [Int64] = [], dueSends: [Int64] = []
            while let first = reminders.min, first.at <= now { dueReminders.append(reminders.removeMin().id) }
            while let first = sends.min, first.at <= now { dueSends.append(sends.removeMin().id) }
            return (dueReminders, dueSends)
        }
    }

    // MARK: - What due reminders become

    /// What one person's due reminders (with the rest of the digest window) become.
    struct Digest: Equatable {
        /// Past the staleness limit: not sent.
        var stale: [ReminderRow] = []
        /// To send, in one notification per active device.
        var fresh: [ReminderRow] = []
        /// The state the fresh ones take: sending, or delivered when there is no active
        /// device to send to (nothing to wait for).
        var state: Reminders.State = .sending
        /// One notification per active device, keyed so that a resend is recognisable.
        var notifications: [Addressed] = []
    }

    /// A notification and the device it goes to.
    struct Addressed: Equatable {
        var deviceID: String
        var notification: ReminderNotification
    }

    /// Until when reminders come along with one due at `now` (they fire after `now` and up to this).
    func digestHorizon(now: Date) -> Date { now.addingTimeInterval(settings.digestWindow.seconds) }

    /// What `reminders` (one person's due ones and those firing within the digest window)
    /// become at `now`: stale ones are set aside; the rest go as one notification per active
    /// device (`devices` is asked only when something is to be sent).
    func digest(_ reminders: [ReminderRow], now: Date, devices: () throws -> [DeviceRecord]) rethrows -> Digest {
        let staleBefore = now.timeIntervalSince1970 - settings.staleness.seconds
        var digest = Digest()
        for row in reminders {
            if row.fireAt.timeIntervalSince1970 < staleBefore { digest.stale.append(row) } else { digest.fresh.append(row) }
        }
        guard !digest.fresh.isEmpty else { return digest }
        let active = try devices()
        digest.state = active.isEmpty ? .delivered : .sending
        let occurrences = digest.fresh.map { ($0.reminder.taskID, $0.reminder.due.timeIntervalSince1970) }
        digest.notifications = active.map { device in
            Addressed(
                deviceID: device.device.id,
                notification: ReminderNotification(
                    id: ReminderNotification.key(deviceID: device.device.id, reminders: occurrences),
                    reminders: digest.fresh.map(\.reminder)))
        }
        return digest
    }

    // MARK: - What an attempt makes of its send

    /// What the `attempt`-th try of a send (1 for the first) that ended in `outcome` at `now`
    /// makes of it: delivered; tried again after 1, 2, 4 … up to the maximum backoff times
    /// `jitter` (0.8 to 1.2, so retries of many sends spread out); or given up once the
    /// attempts run out or the channel says it will never work.
    func update(after outcome: DeliveryOutcome, attempt: Int, now: Double, jitter: Double) -> SendUpdate {
        switch outcome {
        case .accepted:
            return .delivered
        case .retry(let reason) where attempt < settings.maximumAttempts:
            let pause = min(settings.maximumBackoff.seconds, settings.firstBackoff.seconds * pow(2, Double(attempt - 1))) * jitter
            return .retry(at: now + pause, reason: reason)
        case .retry(let reason):
            return .failed(reason: reason, deactivateDevice: false)
        case .rejected(let reason, let deactivate):
            return .failed(reason: reason, deactivateDevice: deactivate)
        }
    }
}
