import Foundation

/// The operations of `canopy-remind`: the reminder windows canopy-care hands over, each
/// person's devices, and what is pending or failed. canopy-care calls `reminders.sync` and
/// `reminders.cancel-plant` through its outbox. Every operation acts for the principal:
/// nobody sees or uses another person's devices or reminders.
public enum Reminders {
    /// The reminder service's name.
    public static let service = "remind"

    /// `reminders.sync`: the principal's next window of care occurrences (at most 64, the
    /// number of pending local notifications an iPhone keeps), replacing what was handed over
    /// before. Each task comes once with the due times of its occurrences in the window: a
    /// window is a few tasks each due several times, and 64 keyed objects cost the decoder
    /// several times what a few tasks with a list of dates do (see docs/PERFORMANCE.md).
    public enum Sync: BusOperation {
        /// The principal's whole window, grouped by task: each task once, with its occurrences' due times.
        public struct Request: Codable, Sendable, Equatable {
            public var tasks: [Occurrences]

            public init(tasks: [Occurrences]) { self.tasks = tasks }

            /// A window of occurrences as canopy-care makes them (one `Care.Task` per due time),
            /// grouped by task in the order each task first comes.
            public init(window: [Care.Task]) {
                var grouped: [Occurrences] = []
                var index: [String: Int] = [:]
                for task in window {
                    if let at = index[task.id], grouped[at].plantID == task.plantID, grouped[at].kind == task.kind, grouped[at].title == task.title {
                        grouped[at].due.append(task.due)
                        if grouped[at].snoozedUntil == nil, let snoozed = task.snoozedUntil { grouped[at].snoozedUntil = snoozed }
                    } else {
                        index[task.id] = grouped.count
                        grouped.append(
                            Occurrences(
                                id: task.id, plantID: task.plantID, kind: task.kind, title: task.title, due: [task.due],
                                snoozedUntil: task.snoozedUntil))
                    }
                }
                tasks = grouped
            }

            /// One `Care.Task` per occurrence, soonest first; a task's snooze moves its first
            /// occurrence only.
            public var occurrences: [Care.Task] {
                tasks.flatMap { task in
                    task.due.sorted().enumerated().map { index, due in
                        Care.Task(
                            id: task.id, plantID: task.plantID, kind: task.kind, title: task.title, due: due,
                            snoozedUntil: index == 0 ? task.snoozedUntil : nil)
                    }
                }.sorted { ($0.due, $0.id) < ($1.due, $1.id) }
            }
        }
        /// Nothing: the reminders kept now follow the window.
        public typealias Reply = Empty
        public static let service = Reminders.service
        public static let name = "reminders.sync"
        public static let idempotent = true
        /// canopy-care's outbox hands a person's window over; never a person's request.
        public static let access = Access.service
    }

    /// A care task and when it is due within a window.
    public struct Occurrences: Codable, Sendable, Equatable {
        public var id: String
        public var plantID: String
        public var kind: Care.TaskKind
        public var title: String
        /// When each occurrence is due.
        public var due: [Date]
        /// Set while the task is snoozed: its first occurrence shows at this time instead.
        public var snoozedUntil: Date?

        public init(id: String, plantID: String, kind: Care.TaskKind, title: String, due: [Date], snoozedUntil: Date? = nil) {
            self.id = id
            self.plantID = plantID
            self.kind = kind
            self.title = title
            self.due = due
            self.snoozedUntil = snoozedUntil
        }
    }

    /// `account.forget`: canopy-care's follow-up when a person deletes their account: every
    /// device, reminder and notification of theirs goes.
    public enum ForgetPerson: BusOperation {
        /// Nothing: the person is the request's principal.
        public typealias Request = Empty
        /// Nothing; answered once their devices, reminders and notifications are gone.
        public typealias Reply = Empty
        public static let service = Reminders.service
        public static let name = "account.forget"
        public static let access = Access.service
        public static let erases = true
        public static let idempotent = true
    }

    /// `reminders.cancel-plant`: canopy-care's outbox follow-up to a deleted plant: every reminder
    /// of it goes, in any state, with the notifications that carried only its reminders.
    public enum CancelPlant: BusOperation {
        /// The deleted plant.
        public struct Request: Codable, Sendable, Equatable {
            public var plantID: String
            public init(plantID: String) { self.plantID = plantID }
        }
        /// Nothing; a plant with no reminders is no error.
        public typealias Reply = Empty
        public static let service = Reminders.service
        public static let name = "reminders.cancel-plant"
        public static let idempotent = true
        /// canopy-care's follow-up to a deleted plant; never a person's request.
        public static let access = Access.service
    }

    // MARK: - Devices

    /// How a notification reaches a device.
    public enum Channel: String, Codable, Sendable, CaseIterable {
        /// Apple's push notification service; `address` is the device token (hex).
        case apns
        /// An HTTP POST signed as Standard Webhooks do; `address` is the URL, `secret` the
        /// signing secret (`whsec_` and base64).
        case webhook
        /// A publish to an ntfy topic; `address` is the topic URL, `accessToken` optional.
        case ntfy
        /// The service's log (demos and the embedded default).
        case log
    }

    /// A registered device as its owner sees it (secrets are never answered).
    public struct Device: Codable, Sendable, Equatable {
        public var id: String
        public var channel: Channel
        public var address: String
        public var name: String?
        /// False once the channel said the device is gone (APNs 410); registering again
        /// makes it active.
        public var active: Bool
        public var registeredAt: Date
        /// Why it is inactive, when it is.
        public var deactivatedReason: String?

        public init(id: String, channel: Channel, address: String, name: String?, active: Bool, registeredAt: Date, deactivatedReason: String? = nil) {
            self.id = id
            self.channel = channel
            self.address = address
            self.name = name
            self.active = active
            self.registeredAt = registeredAt
            self.deactivatedReason = deactivatedReason
        }
    }

    /// `devices.register`: adds a device, or makes it active again (the same channel and
    /// address answer the same device).
    public enum RegisterDevice: BusOperation {
        /// The channel and its address (an APNs device token in hex, or an http(s) URL for a webhook
        /// or ntfy), a name, and the channel's secrets: a webhook needs its signing secret. The
        /// channel must be one the service has configured; a person registers at most 20 devices.
        public struct Request: Codable, Sendable, Equatable {
            public var channel: Channel
            public var address: String
            public var name: String?
            /// webhook: the signing secret, `whsec_` then base64 of 24 to 64 bytes.
            public var secret: String?
            /// ntfy: an access token, if the topic needs one.
            public var accessToken: String?

            public init(channel: Channel, address: String, name: String? = nil, secret: String? = nil, accessToken: String? = nil) {
                self.channel = channel
                self.address = address
                self.name = name
                self.secret = secret
                self.accessToken = accessToken
            }
        }
        /// The device as stored, active; its secrets are never answered.
        public typealias Reply = Device
        public static let service = Reminders.service
        public static let name = "devices.register"
        public static let idempotent = true
    }

    /// `devices.remove`.
    public enum RemoveDevice: BusOperation {
        /// One of the principal's devices, by id; an id that is not theirs removes nothing.
        public struct Request: Codable, Sendable, Equatable {
            public var id: String
            public init(id: String) { self.id = id }
        }
        /// Nothing, whether or not there was such a device.
        public typealias Reply = Empty
        public static let service = Reminders.service
        public static let name = "devices.remove"
        public static let idempotent = true
    }

    /// `devices.list`: the principal's devices, oldest first.
    public enum ListDevices: BusOperation {
        /// Nothing: the devices listed are the principal's.
        public typealias Request = Empty
        /// Every device of the principal's, active or not, without secrets.
        public typealias Reply = [Device]
        public static let service = Reminders.service
        public static let name = "devices.list"
        public static let idempotent = true
    }

    // MARK: - Reminders

    /// Where a reminder is.
    public enum State: String, Codable, Sendable, CaseIterable {
        /// Waiting for its time.
        case pending
        /// Its notification is being delivered (or retried).
        case sending
        /// Every active device's channel accepted it.
        case delivered
        /// Past the staleness limit when its time came (after a long outage): not sent.
        case stale
        /// Retries ran out on a device (see `reminders.failures`).
        case failed
    }

    /// One reminder: a task's occurrence.
    public struct Reminder: Codable, Sendable, Equatable {
        public var taskID: String
        public var plantID: String
        public var kind: Care.TaskKind
        public var title: String
        /// When it is due (the occurrence).
        public var due: Date
        public var state: State

        public init(taskID: String, plantID: String, kind: Care.TaskKind, title: String, due: Date, state: State) {
            self.taskID = taskID
            self.plantID = plantID
            self.kind = kind
            self.title = title
            self.due = due
            self.state = state
        }
    }

    /// `reminders.pending`: the principal's next reminders, soonest first (for phones that
    /// schedule local notifications themselves: iOS keeps 64).
    public enum Pending: BusOperation {
        /// At most how many reminders to answer.
        public struct Request: Codable, Sendable, Equatable {
            /// 1 to 256, default 64.
            public var limit: Int?
            public init(limit: Int? = nil) { self.limit = limit }
        }
        /// Reminders waiting for their time or being sent, soonest first.
        public typealias Reply = [Reminder]
        public static let service = Reminders.service
        public static let name = "reminders.pending"
        public static let idempotent = true
    }

    /// A delivery that did not happen: retries ran out on a device, or it was stale.
    public struct Failure: Codable, Sendable, Equatable {
        public var reminder: Reminder
        /// The device, for a delivery that failed; `nil` for a stale reminder.
        public var deviceID: String?
        public var attempts: Int
        public var lastError: String
        public var at: Date

        public init(reminder: Reminder, deviceID: String?, attempts: Int, lastError: String, at: Date) {
            self.reminder = reminder
            self.deviceID = deviceID
            self.attempts = attempts
            self.lastError = lastError
            self.at = at
        }
    }

    /// `reminders.failures`: the principal's dead letters, newest first.
    public enum Failures: BusOperation {
        /// At most how many failures to answer.
        public struct Request: Codable, Sendable, Equatable {
            /// 1 to 500, default 100.
            public var limit: Int?
            public init(limit: Int? = nil) { self.limit = limit }
        }
        /// Deliveries whose retries ran out and reminders that went stale, newest first.
        public typealias Reply = [Failure]
        public static let service = Reminders.service
        public static let name = "reminders.failures"
        public static let idempotent = true
    }

    /// `reminders.send-test`: a test notification to one of the principal's devices, now.
    public enum SendTest: BusOperation {
        /// One of the principal's devices (another person's is `notFound`), on a channel the service
        /// has configured.
        public struct Request: Codable, Sendable, Equatable {
            public var deviceID: String
            public init(deviceID: String) { self.deviceID = deviceID }
        }
        /// Whether the channel accepted the test notification, and what it said.
        public struct Reply: Codable, Sendable, Equatable {
            public var accepted: Bool
            /// What the channel said.
            public var detail: String
            public init(accepted: Bool, detail: String) {
                self.accepted = accepted
                self.detail = detail
            }
        }
        public static let service = Reminders.service
        public static let name = "reminders.send-test"
    }

    /// Field limits, in bytes or counts.
    public enum Limits {
        /// Occurrences in one window.
        public static let window = 64
        /// Devices one person may register.
        public static let devices = 20
        public static let addressBytes = 2_048
        public static let nameBytes = 100
        public static let secretBytes = 200
        public static let idBytes = 200
    }
}

extension Reminders.Sync.Request: Validatable {
    public func validate() throws(CanopyError) {
        let limit = Reminders.Limits.window * 2
        try Field.list(tasks, "tasks", maximumCount: limit) { task, name throws(CanopyError) in
            try Field.identifier(task.id, "\(name).id", maximumBytes: Reminders.Limits.idBytes)
            try Field.identifier(task.plantID, "\(name).plantID", maximumBytes: Care.Limits.idBytes)
            try Field.text(task.title, "\(name).title", maximumBytes: Care.Limits.titleBytes)
            guard !task.due.isEmpty else { throw CanopyError(.badRequest, "\(name).due lists at least one due time", field: "\(name).due") }
            try Field.list(task.due, "\(name).due", maximumCount: limit) { due, name throws(CanopyError) in try Field.date(due, name) }
            try Field.date(task.snoozedUntil, "\(name).snoozedUntil")
        }
        let count = tasks.reduce(0) { $0 + $1.due.count }
        guard count <= limit else {
            throw CanopyError(.tooLarge, "the window has \(count) occurrences; the limit is \(limit)")
        }
    }
}

extension Reminders.CancelPlant.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.identifier(plantID, "plantID", maximumBytes: Care.Limits.idBytes)
    }
}

extension Reminders.RegisterDevice.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.text(address, "address", maximumBytes: Reminders.Limits.addressBytes, required: true)
        try Field.text(name, "name", maximumBytes: Reminders.Limits.nameBytes)
        try Field.text(secret, "secret", maximumBytes: Reminders.Limits.secretBytes)
        try Field.text(accessToken, "accessToken", maximumBytes: Reminders.Limits.secretBytes)
        switch channel {
        case .apns:
            // A device token: 32 bytes or more, as hexadecimal.
            guard address.utf8.count >= 64, address.utf8.count <= 200, address.utf8.count % 2 == 0,
                address.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) || ($0 >= 0x41 && $0 <= 0x46) })
            else {
                throw CanopyError(.badRequest, "an APNs device token is 64 to 200 hexadecimal characters, as the phone reports it")
            }
        case .webhook, .ntfy:
            guard let url = URL(string: address), let scheme = url.scheme?.lowercased(), ["http", "https"].contains(scheme), url.host?.isEmpty == false else {
                throw CanopyError(.badRequest, "a \(channel.rawValue) address is an http(s) URL")
            }
            if channel == .webhook {
                guard let secret, secret.hasPrefix("whsec_"), let key = Data(base64Encoded: String(secret.dropFirst(6))), (24...64).contains(key.count) else {
                    throw CanopyError(.badRequest, "a webhook needs a signing secret: 'whsec_' then base64 of 24 to 64 random bytes")
                }
            }
        case .log:
            break
        }
    }
}

extension Reminders.RemoveDevice.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.identifier(id, "id", maximumBytes: Reminders.Limits.idBytes)
    }
}

extension Reminders.Pending.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.integer(limit, "limit", 1...256)
    }
}

extension Reminders.Failures.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.integer(limit, "limit", 1...500)
    }
}

extension Reminders.SendTest.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.identifier(deviceID, "deviceID", maximumBytes: Reminders.Limits.idBytes)
    }
}
