/// Operations other services will serve that canopy-care already calls (through its
/// outbox, retried until they are confirmed). Defined here, in the shared contract, so both
/// sides use one definition; canopy-remind implements them in its issue. (`identifications.forget-plant`,
/// the other one care calls, is in `Identification.swift` with the rest of canopy-identify.)
public enum Reminders {
    /// The reminder service's name.
    public static let service = "remind"

    /// `reminders.sync`: the principal's next window of tasks (at most 64, the number of
    /// pending local notifications an iPhone keeps), replacing what was handed over before.
    public enum Sync: BusOperation {
        public struct Request: Codable, Sendable, Equatable {
            public var tasks: [Care.Task]
            public init(tasks: [Care.Task]) { self.tasks = tasks }
        }
        public typealias Reply = Empty
        public static let service = Reminders.service
        public static let name = "reminders.sync"
        public static let idempotent = true
    }

    /// `reminders.cancel-plant`: drop every pending reminder of a deleted plant.
    public enum CancelPlant: BusOperation {
        public struct Request: Codable, Sendable, Equatable {
            public var plantID: String
            public init(plantID: String) { self.plantID = plantID }
        }
        public typealias Reply = Empty
        public static let service = Reminders.service
        public static let name = "reminders.cancel-plant"
        public static let idempotent = true
    }
}
