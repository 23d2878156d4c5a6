import CanopyMessages
import Foundation
import Testing

@testable import CanopyRemind

/// The dispatcher's decisions and a sync's plan, as values: no clock, no store, no network.
struct DispatchPlanTests {
    let plan = DispatchPlan(settings: DispatchSettings())
    let now = Date(timeIntervalSince1970: 1_780_000_000)

    func row(_ id: Int64, owner: String = "alice", task: String, firesIn seconds: TimeInterval) -> ReminderRow {
        let at = now.addingTimeInterval(seconds)
        return ReminderRow(
            id: id, owner: owner, reminder: Reminders.Reminder(taskID: task, plantID: "p1", kind: .water, title: "Water \(task)", due: at, state: .pending),
            fireAt: at)
    }

    func device(_ id: String) -> DeviceRecord {
        DeviceRecord(device: Reminders.Device(id: id, channel: .log, address: "log", name: nil, active: true, registeredAt: now), owner: "alice")
    }

    // MARK: What is due, and when to wake

    @Test func theQueueHandsOutWhatIsDueInOrderAndSaysWhenToWake() {
        var queue = DispatchPlan.DueQueue()
        #expect(queue.wake == nil)
        let first = queue.schedule([(id: 2, fireAt: 200), (id: 1, fireAt: 100)])
        let later = queue.schedule([(id: 3, fireAt: 300)])
        let earlier = queue.schedule([(id: 4, fireAt: 50)])
        #expect(first, "the first entries are earlier than nothing")
        #expect(!later, "a later one does not wake the dispatcher")
        #expect(earlier, "an earlier one does")
        queue.retry(9, at: 120)
        queue.load(reminders: [.init(at: 150, id: 5)], sends: [.init(at: 10, id: 8)])
        #expect(queue.wake == 10)
        let due = queue.takeDue(at: 150)
        #expect(due.reminders == [4, 1, 5] && due.sends == [8, 9])
        #expect(queue.wake == 200)
        let early = queue.takeDue(at: 199)
        #expect(early.reminders.isEmpty, "nothing is due before its time")
    }

    // MARK: What due reminders become

    @Test func remindersDueTogetherGoAsOneNotificationPerActiveDevice() throws {
        let reminders = [row(1, task: "p1:water", firesIn: 0), row(2, task: "p2:water", firesIn: 300)]
        let digest = plan.digest(reminders, now: now) { [device("phone"), device("tablet")] }
        #expect(digest.stale.isEmpty && digest.fresh == reminders && digest.state == .sending)
        #expect(digest.notifications.map(\.deviceID) == ["phone", "tablet"])
        let occurrences = reminders.map { ($0.reminder.taskID, $0.reminder.due.timeIntervalSince1970) }
        #expect(digest.notifications[0].notification.id == ReminderNotification.key(deviceID: "phone", reminders: occurrences))
        #expect(digest.notifications[0].notification.id != digest.notifications[1].notification.id, "a key per device")
        #expect(digest.notifications[0].notification.reminders.count == 2)
        #expect(plan.digestHorizon(now: now) == now.addingTimeInterval(600))
    }

    @Test func staleRemindersAreSetAsideAndWithoutADeviceTheRestCountAsDone() throws {
        let late = row(1, task: "p1:water", firesIn: -13 * 3_600) // past the 12 h staleness limit
        let fresh = row(2, task: "p2:water", firesIn: -60)
        let digest = plan.digest([late, fresh], now: now) { [] }
        #expect(digest.stale == [late] && digest.fresh == [fresh])
        #expect(digest.state == .delivered && digest.notifications.isEmpty, "nothing to wait for")
        // Nothing fresh: the devices are not even read.
        var asked = false
        let onlyStale = plan.digest([late], now: now) {
            asked = true
            return [device("phone")]
        }
        #expect(onlyStale.stale == [late] && onlyStale.fresh.isEmpty && !asked)
    }

    // MARK: What an attempt makes of its send

    @Test func retriesBackOffExponentiallyWithinTheirCapAndThenGiveUp() {
        let at = now.timeIntervalSince1970
        let pauses = (1..<8).map { attempt -> Double? in
            guard case .retry(let next, _) = plan.update(after: .retry("503"), attempt: attempt, now: at, jitter: 1) else { return nil }
            return next - at
        }
        #expect(pauses == [1, 2, 4, 8, 16, 32, 64])
        var capped = DispatchSettings()
        capped.maximumAttempts = 20
        #expect(DispatchPlan(settings: capped).update(after: .retry("503"), attempt: 15, now: at, jitter: 1) == .retry(at: at + 300, reason: "503"))
        #expect(plan.update(after: .retry("503"), attempt: 1, now: at, jitter: 1.2) == .retry(at: at + 1.2, reason: "503"), "the jitter spreads retries")
        #expect(plan.update(after: .retry("503"), attempt: 8, now: at, jitter: 1) == .failed(reason: "503", deactivateDevice: false), "the eighth was the last")
        #expect(plan.update(after: .accepted("200"), attempt: 3, now: at, jitter: 1) == .delivered)
        #expect(
            plan.update(after: .rejected("410 Unregistered", deactivate: true), attempt: 1, now: at, jitter: 1)
                == .failed(reason: "410 Unregistered", deactivateDevice: true))
    }

    // MARK: What a sync changes

    @Test func aSyncChangesOnlyWhatDiffersAndNeverResendsWhatWasSent() {
        func task(_ id: String, due: TimeInterval, title: String? = nil, snoozed: TimeInterval? = nil) -> Care.Task {
            Care.Task(
                id: id, plantID: "p1", kind: .water, title: title ?? id, due: now.addingTimeInterval(due), snoozedUntil: snoozed.map(now.addingTimeInterval))
        }
        func known(_ id: Int64, _ task: String, due: TimeInterval, pending: Bool = true, title: String? = nil) -> KnownReminder {
            KnownReminder(
                id: id, occurrence: .init(taskID: task, due: now.addingTimeInterval(due).timeIntervalSince1970), pending: pending,
                fireAt: now.addingTimeInterval(due).timeIntervalSince1970, title: title ?? task)
        }
        let plan = SyncPlan(
            window: [
                task("same", due: 100),
                task("renamed", due: 100, title: "Water Monty"),
                task("snoozed", due: 100, snoozed: 500),
                task("sent", due: 100),
                task("new", due: 100),
                task("new", due: 100), // twice in one window: once
            ],
            known: [
                known(1, "same", due: 100), known(2, "renamed", due: 100), known(3, "snoozed", due: 100),
                known(4, "sent", due: 100, pending: false), known(5, "gone", due: 100), known(6, "sent before", due: 50, pending: false),
            ])
        #expect(plan.updates.map(\.id) == [2, 3])
        #expect(plan.inserts.map(\.id) == ["new"])
        #expect(plan.deletes == [5], "a pending one no longer wanted goes; a sent one stays as it is")
        #expect(SyncPlan(window: [task("same", due: 100)], known: [known(1, "same", due: 100)]).isEmpty)
    }
}
