import CanopyMessages
import CanopyOutbound
import CanopyServiceKit
import Foundation
import Synchronization

/// What canopy-remind does for requests, one method per operation: the rules, over a store
/// that holds the data (``ReminderStoring``; no SQL here). Every method takes the owner (the
/// request's principal); nothing is read or changed for anyone else.
final class ReminderLibrary: Sendable {
    /// The time it goes by (`--clock`).
    let clock: ServiceClock
    let store: any ReminderStoring
    /// Hosts webhooks and ntfy topics may name even on loopback or private addresses.
    let allowedHosts: Set<String>
    /// The channels this service delivers through; devices of others are refused.
    let channels: Set<Reminders.Channel>

    init(
        store: any ReminderStoring, allowedHosts: Set<String> = [], channels: Set<Reminders.Channel> = Set(Reminders.Channel.allCases),
        clock: ServiceClock = .system
    ) {
        self.clock = clock
        self.store = store
        self.allowedHosts = allowedHosts
        self.channels = channels
    }

    // MARK: - The window from canopy-care

    /// Replaces the owner's pending reminders with `tasks` by difference (``SyncPlan``).
    ///
    /// One write transaction plans and makes the changes (one that changes nothing writes
    /// nothing). It waits for the store without holding a thread: syncs of many people at
    /// once queue for the one writer. (A read first, to skip the writer when nothing changed,
    /// and running the whole sync on a Dispatch thread were both slower, measured:
    /// docs/PERFORMANCE.md.)
    ///
    /// - Returns: the reminders now pending whose time is new or changed, for the dispatcher.
    func sync(_ tasks: [Care.Task], owner: String, now: Date? = nil) async throws -> [(id: Int64, fireAt: Double)] {
        let now = now ?? clock.now()
        return try await store.write { data in
            try data.waitForOwner(owner) // one sync of a person at a time, on any replica
            let plan = SyncPlan(window: tasks, known: try data.knownReminders(owner: owner))
            guard !plan.isEmpty else { return [] }
            return try data.apply(plan, owner: owner, now: now)
        }
    }

    /// Forgets a deleted plant: every reminder of it, in any state, and every notification
    /// that carried only its reminders (sent or not, with their attempts). A digest that also
    /// named another plant stays for that plant.
    func cancel(plantID: String, owner: String) throws {
        try store.write { data in
            try data.waitForOwner(owner) // before the rows: in the order a recorded attempt takes them
            try data.cancelPlant(plantID, owner: owner)
        }
    }

    // MARK: - Devices

    func register(_ request: Reminders.RegisterDevice.Request, owner: String, now: Date? = nil) throws -> Reminders.Device {
        let now = now ?? clock.now()
        guard channels.contains(request.channel) else {
            throw CanopyError(
                .badRequest,
                "this Canopy does not deliver through \(request.channel.rawValue) (its operator has not configured it); register a \(channels.map(\.rawValue).sorted().joined(separator: ", ")) device instead"
            )
        }
        if request.channel == .webhook || request.channel == .ntfy {
            try AddressPolicy(allowedHosts: allowedHosts).check(request.address)
        }
        let address = request.channel == .apns ? request.address.lowercased() : request.address
        return try store.write { data in
            try data.waitForOwner(owner) // the count below holds across replicas
            if let id = try data.deviceID(owner: owner, channel: request.channel, address: address) {
                try data.reactivateDevice(id: id, name: request.name, secret: request.secret, accessToken: request.accessToken)
                return try data.device(owner: owner, id: id)!.device
            }
            let count = try data.deviceCount(owner: owner)
            guard count < Reminders.Limits.devices else {
                throw CanopyError(.tooLarge, "you have \(count) devices, the most one person may register; remove one with devices.remove first")
            }
            let device = Reminders.Device(
                id: UUID().uuidString.lowercased(), channel: request.channel, address: address, name: request.name,
                active: true, registeredAt: now, deactivatedReason: nil)
            try data.insertDevice(device, owner: owner, secret: request.secret, accessToken: request.accessToken)
            return try data.device(owner: owner, id: device.id)!.device
        }
    }

    /// Forgets a person who deleted their account: devices, reminders, notifications.
    func forget(owner: String) throws {
        try store.write { data in
            try data.waitForOwner(owner)
            try data.forgetPerson(owner)
        }
        store.eraseResidue()
    }

    func removeDevice(_ id: String, owner: String) throws {
        try store.write { data in try data.removeDevice(owner: owner, id: id) }
    }

    func devices(owner: String) throws -> [Reminders.Device] {
        try store.read { data in try data.devices(owner: owner, activeOnly: false).map(\.device) }
    }

    // MARK: - Reading

    func pending(owner: String, limit: Int) throws -> [Reminders.Reminder] {
        try store.read { data in try data.upcoming(owner: owner, limit: limit) }
    }

    /// Dead letters: sends that gave up, and reminders that were stale when their time came.
    func failures(owner: String, limit: Int) throws -> [Reminders.Failure] {
        try store.read { data in
            let stale = try data.staleReminders(owner: owner, limit: limit).map { stale in
                Reminders.Failure(
                    reminder: stale.reminder, deviceID: nil, attempts: 0,
                    lastError: "not sent: past the staleness limit when its time came (the service was down)", at: stale.at)
            }
            return Array((try data.failedSends(owner: owner, limit: limit) + stale).sorted { $0.at > $1.at }.prefix(limit))
        }
    }
}

/// What a sync changes, by difference between the window canopy-care handed over and the
/// reminders kept: an occurrence already pending keeps its reminder (its title and snooze
/// brought up to date), a new one is added, a pending one no longer in the window is dropped,
/// and one already sent (or given up) for that due time is left as it is, so it is never
/// sent twice. Pure.
struct SyncPlan: Sendable {
    /// An occurrence: a task at a due time (seconds since 1970, as stored).
    struct Occurrence: Hashable, Sendable {
        var taskID: String
        var due: Double
    }

    /// Pending reminders whose time or title changed.
    var updates: [(id: Int64, task: Care.Task)] = []
    /// Occurrences to add.
    var inserts: [Care.Task] = []
    /// Pending reminders no longer in the window.
    var deletes: [Int64] = []

    var isEmpty: Bool { updates.isEmpty && inserts.isEmpty && deletes.isEmpty }

    init(window tasks: [Care.Task], known: [KnownReminder]) {
        var existing: [Occurrence: KnownReminder] = [:]
        existing.reserveCapacity(known.count)
        for reminder in known { existing[reminder.occurrence] = reminder }
        var wanted = Set<Occurrence>()
        wanted.reserveCapacity(tasks.count)
        for task in tasks {
            let key = Occurrence(taskID: task.id, due: task.due.timeIntervalSince1970)
            guard wanted.insert(key).inserted else { continue } // the same occurrence twice in one window
            if let reminder = existing[key] {
                let fireAt = (task.snoozedUntil ?? task.due).timeIntervalSince1970
                if reminder.pending, reminder.fireAt != fireAt || reminder.title != task.title { updates.append((reminder.id, task)) }
            } else {
                inserts.append(task)
            }
        }
        for (key, reminder) in existing where reminder.pending && !wanted.contains(key) {
            deletes.append(reminder.id)
        }
    }
}

/// Which addresses webhooks and ntfy topics may name when they are registered: http(s) URLs
/// of hosts that resolve, and only to public addresses (``PublicAddress``, the one rule the
/// project has), unless the operator allowed the host. Deliveries check again when they
/// connect (``PinnedHTTP``), so a name that resolves elsewhere later is refused then.
struct AddressPolicy: Sendable {
    let allowedHosts: Set<String>

    func check(_ address: String) throws(CanopyError) {
        guard let url = URL(string: address), let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https",
            let host = url.host?.lowercased(), !host.isEmpty
        else {
            throw CanopyError(.badRequest, "'\(address.prefix(100))' is not an http(s) URL")
        }
        if allowedHosts.contains(host) { return }
        let bare = host.hasPrefix("[") ? String(host.dropFirst().dropLast()) : host
        if bare == "localhost" || bare.hasSuffix(".localhost") || bare.hasSuffix(".local") || bare.hasSuffix(".internal") {
            throw refusal(host)
        }
        let addresses = PinnedHTTP.addresses(of: bare)
        guard !addresses.isEmpty else {
            throw CanopyError(.badRequest, "'\(host.prefix(100))' does not resolve; check the address")
        }
        if addresses.contains(where: PublicAddress.isInternal) { throw refusal(host) }
    }

    private func refusal(_ host: String) -> CanopyError {
        CanopyError(
            .badRequest,
            "'\(host)' is a loopback, private or internal address; notifications go to public hosts only (an operator can allow a host with --allow-host)")
    }
}
