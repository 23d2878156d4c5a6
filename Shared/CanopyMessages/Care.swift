import Foundation

/// The operations of `canopy-care`: the plant collection, care profiles, schedules and
/// tasks. Every operation except the catalog's acts for the principal and sees only their
/// plants and tasks.
public enum Care {
    /// The service name.
    public static let service = "care"

    // MARK: - Care profiles

    /// How much light a plant wants.
    public enum Light: String, Codable, Sendable, CaseIterable {
        case low, medium, brightIndirect, direct
    }

    /// How a plant should be looked after: from the species catalog, overridable per plant.
    public struct Profile: Codable, Sendable, Equatable {
        public var light: Light
        /// Days between waterings in the growing season.
        public var wateringIntervalDays: Int
        /// e.g. "water until it drains; let the top 3 cm dry".
        public var wateringAmount: String
        public var temperatureMinimumC: Double
        public var temperatureMaximumC: Double
        public var temperatureOptimumC: Double
        /// low, medium or high.
        public var humidity: String
        /// Days between feeds in the growing season; `nil` for plants that are not fed.
        public var fertilizerIntervalDays: Int?
        public var fertilizerType: String?
        /// Months (1-12, as in the northern hemisphere) of rest: watering stretches, no feeding.
        public var dormancyMonths: [Int]
        public var toxicToPets: Bool
        /// Days between mistings, for plants that like it.
        public var mistIntervalDays: Int?
        /// Months between repottings.
        public var repotIntervalMonths: Int?
        /// Whether it is pruned once a year, at the start of its growing season.
        public var prune: Bool?

        public init(
            light: Light, wateringIntervalDays: Int, wateringAmount: String, temperatureMinimumC: Double, temperatureMaximumC: Double,
            temperatureOptimumC: Double, humidity: String, fertilizerIntervalDays: Int?, fertilizerType: String?, dormancyMonths: [Int],
            toxicToPets: Bool, mistIntervalDays: Int? = nil, repotIntervalMonths: Int? = nil, prune: Bool? = nil
        ) {
            self.light = light
            self.wateringIntervalDays = wateringIntervalDays
            self.wateringAmount = wateringAmount
            self.temperatureMinimumC = temperatureMinimumC
            self.temperatureMaximumC = temperatureMaximumC
            self.temperatureOptimumC = temperatureOptimumC
            self.humidity = humidity
            self.fertilizerIntervalDays = fertilizerIntervalDays
            self.fertilizerType = fertilizerType
            self.dormancyMonths = dormancyMonths
            self.toxicToPets = toxicToPets
            self.mistIntervalDays = mistIntervalDays
            self.repotIntervalMonths = repotIntervalMonths
            self.prune = prune
        }
    }

    /// A species in the shipped care catalog.
    public struct Species: Codable, Sendable, Equatable {
        public var scientificName: String
        public var commonNames: [String]
        public var family: String
        public var genus: String
        public var profile: Profile
        /// Keys into the catalog's list of sources.
        public var sources: [String]

        public init(scientificName: String, commonNames: [String], family: String, genus: String, profile: Profile, sources: [String]) {
            self.scientificName = scientificName
            self.commonNames = commonNames
            self.family = family
            self.genus = genus
            self.profile = profile
            self.sources = sources
        }
    }

    /// `care.catalog.search`: species whose common name, scientific name or family contains the text.
    public enum CatalogSearch: BusOperation {
        /// The text to look for (empty lists the catalog from its start) and how many species to
        /// answer, 1 to 100 (default 20).
        public struct Request: Codable, Sendable {
            public var text: String
            public var limit: Int?
            public init(text: String, limit: Int? = nil) {
                self.text = text
                self.limit = limit
            }
        }
        /// The matching species in catalog order, at most `limit`.
        public typealias Reply = [Species]
        public static let service = Care.service
        public static let name = "catalog.search"
        public static let access = Access.public
        public static let idempotent = true
        public static let coalescable = true
    }

    // MARK: - Plants

    /// How a plant was identified.
    public enum Source: String, Codable, Sendable, CaseIterable {
        case plantnet, manual, catalog, other
        /// canopy-identify's reference matcher, alone or with Pl@ntNet (`hybrid`).
        case reference, hybrid
    }

    /// A plant in someone's collection.
    public struct Plant: Codable, Sendable, Equatable {
        public var id: String
        public var scientificName: String
        public var commonNames: [String]
        public var family: String
        public var genus: String
        public var customName: String?
        public var location: String?
        public var notes: String?
        public var favourite: Bool
        /// Photo ids in canopy-images.
        public var imageIDs: [String]
        public var identificationSource: Source
        /// 0 to 1.
        public var identificationConfidence: Double?
        public var dateIdentified: Date?
        public var dateAdded: Date
        /// The care profile in force: the catalog's (by species, then genus), with this plant's overrides.
        public var profile: Profile?
        /// Whether `profile` holds overrides of the catalog.
        public var profileOverridden: Bool
        /// Bumped by every change: in a reply, the version stored (the HTTP API's `ETag`);
        /// in `care.plants.update`, when given, the version the change was made against
        /// (`If-Match`): a plant changed since is refused `stale`, never overwritten.
        public var version: Int?

        public init(
            id: String = "", scientificName: String, commonNames: [String] = [], family: String = "", genus: String = "",
            customName: String? = nil, location: String? = nil, notes: String? = nil, favourite: Bool = false, imageIDs: [String] = [],
            identificationSource: Source = .manual, identificationConfidence: Double? = nil, dateIdentified: Date? = nil,
            dateAdded: Date = Date(timeIntervalSince1970: 0), profile: Profile? = nil, profileOverridden: Bool = false,
            version: Int? = nil
        ) {
            self.id = id
            self.scientificName = scientificName
            self.commonNames = commonNames
            self.family = family
            self.genus = genus
            self.customName = customName
            self.location = location
            self.notes = notes
            self.favourite = favourite
            self.imageIDs = imageIDs
            self.identificationSource = identificationSource
            self.identificationConfidence = identificationConfidence
            self.dateIdentified = dateIdentified
            self.dateAdded = dateAdded
            self.profile = profile
            self.profileOverridden = profileOverridden
            self.version = version
        }
    }

    /// `care.plants.add`: adds a plant (family, genus and common names are filled in from
    /// the catalog when left empty) and schedules its care. Returns it with its id. With an
    /// `id` chosen by the caller, adding again returns the plant already added (no second
    /// plant); an id another person's plant has is refused `conflict`.
    public enum AddPlant: BusOperation {
        /// The plant to add: only `scientificName` is required; with `id` empty, canopy-care chooses
        /// one. A person keeps at most 10,000 plants (`tooLarge` past that).
        public typealias Request = Plant
        /// The plant as stored, with its id and version.
        public typealias Reply = Plant
        public static let service = Care.service
        public static let name = "plants.add"
    }

    /// `care.plants.get`.
    public enum GetPlant: BusOperation {
        /// One of the principal's plants, by id; another person's is `notFound`, as a missing one is.
        public struct Request: Codable, Sendable {
            public var id: String
            public init(id: String) { self.id = id }
        }
        /// The plant, with its care profile in force and its version.
        public typealias Reply = Plant
        public static let service = Care.service
        public static let name = "plants.get"
        public static let idempotent = true
    }

    /// `care.plants.update`: replaces the editable fields (names, location, notes, favourite,
    /// images, identification) and, when `profile` is given, overrides the care profile.
    /// With `version` given, only when the plant is still at that version (else `stale`).
    public enum UpdatePlant: BusOperation {
        /// The plant as it should be, found by `id`; `version`, when given, is the version the change
        /// was made against.
        public typealias Request = Plant
        /// The plant as stored after the change, with its new version.
        public typealias Reply = Plant
        public static let service = Care.service
        public static let name = "plants.update"
        public static let idempotent = true
    }

    /// `care.plants.delete`: removes the plant, its schedule, tasks and log, and records the
    /// follow-ups for other services (reminders, images, identifications) in the outbox.
    public enum DeletePlant: BusOperation {
        /// The plant to delete; one that is not there (deleted already) is no error.
        public struct Request: Codable, Sendable {
            public var id: String
            public init(id: String) { self.id = id }
        }
        /// Nothing: the plant is gone and its follow-ups wait in the outbox.
        public typealias Reply = Empty
        public static let service = Care.service
        public static let name = "plants.delete"
        public static let idempotent = true
    }

    /// `care.account.delete`: a person deletes their account. Every plant of theirs goes as a
    /// deleted plant does, and their preferences; the follow-ups in the same transaction tell
    /// canopy-remind, canopy-identify and canopy-images to forget the person (`account.forget`),
    /// delivered by the outbox however long a service is down. Answers how many plants went.
    ///
    /// The same transaction schedules a second pass (`secondPass`), sent by the outbox to
    /// canopy-care itself a while later (`--erasure-second-pass`, 60 s): it erases again, and
    /// has the other services forget again, whatever requests an edge let through before it
    /// saw the sign-out added meanwhile on a replica or a restarted service (which
    /// ``ErasedPeople`` did not refuse). It schedules no further pass.
    public enum DeleteAccount: BusOperation {
        /// Empty from a person; canopy-care's outbox sets `secondPass` on the pass it scheduled.
        public struct Request: Codable, Sendable, Equatable {
            /// Whether this is canopy-care's own second pass.
            public var secondPass: Bool?
            public init(secondPass: Bool? = nil) { self.secondPass = secondPass }
        }
        /// How many of the person's plants were deleted.
        public struct Reply: Codable, Sendable, Equatable {
            public var plants: Int
            public init(plants: Int) { self.plants = plants }
        }
        public static let service = Care.service
        public static let name = "account.delete"
        public static let erases = true
        public static let idempotent = true
    }

    /// What `care.plants.list` sorts by: when a plant was added or identified, its name (nickname,
    /// else first common name, else scientific name), or its family.
    public enum SortKey: String, Codable, Sendable, CaseIterable { case dateAdded, dateIdentified, name, family }

    /// Watering frequency buckets: often (every 1-4 days), weekly (5-10), rarely (11+).
    public enum WateringFrequency: String, Codable, Sendable, CaseIterable { case often, weekly, rarely }

    /// `care.plants.list`: search, filter, sort and page through the collection (all in SQL).
    /// Listings leave each plant's `profile` out (`profileOverridden` still says whether it has
    /// overrides); `plants.get` has it.
    public enum ListPlants: BusOperation {
        /// Filters (each optional; all given must match), the sort, and the page: `limit` plants,
        /// 1 to 500 (default 50), from `offset`.
        public struct Request: Codable, Sendable, Equatable {
            /// Case-insensitive, partial: matches common names, scientific name and family.
            public var search: String?
            public var favourite: Bool?
            public var family: String?
            public var light: Light?
            public var watering: WateringFrequency?
            public var source: Source?
            public var addedFrom: Date?
            public var addedTo: Date?
            public var sort: SortKey
            public var descending: Bool
            public var limit: Int
            public var offset: Int

            public init(
                search: String? = nil, favourite: Bool? = nil, family: String? = nil, light: Light? = nil, watering: WateringFrequency? = nil,
                source: Source? = nil, addedFrom: Date? = nil, addedTo: Date? = nil, sort: SortKey = .dateAdded, descending: Bool = true,
                limit: Int = 50, offset: Int = 0
            ) {
                self.search = search
                self.favourite = favourite
                self.family = family
                self.light = light
                self.watering = watering
                self.source = source
                self.addedFrom = addedFrom
                self.addedTo = addedTo
                self.sort = sort
                self.descending = descending
                self.limit = limit
                self.offset = offset
            }
        }
        /// One page of the principal's plants, without profiles, with the total and the next page's offset.
        public struct Reply: Codable, Sendable, Equatable {
            public var plants: [Plant]
            /// How many match in all (for paging).
            public var total: Int
            /// The offset of the next page; absent on the last. A page may hold fewer than
            /// `limit` plants when more would not fit in one reply on the bus.
            public var nextOffset: Int?

            public init(plants: [Plant], total: Int, nextOffset: Int? = nil) {
                self.plants = plants
                self.total = total
                self.nextOffset = nextOffset
            }
        }
        public static let service = Care.service
        public static let name = "plants.list"
        public static let idempotent = true
    }

    /// `care.statistics`.
    public enum Statistics: BusOperation {
        /// Nothing: the figures are the principal's.
        public typealias Request = Empty
        /// The principal's collection in figures: plants, favourites, plants by family and by
        /// identification source, plants added this calendar month (in their time zone), and tasks
        /// showing within the next 7 days or overdue.
        public struct Reply: Codable, Sendable, Equatable {
            public var total: Int
            public var favourites: Int
            public var families: [String: Int]
            public var sources: [String: Int]
            public var addedThisMonth: Int
            public var upcomingTasks: Int
            public var overdueTasks: Int

            public init(
                total: Int, favourites: Int, families: [String: Int], sources: [String: Int], addedThisMonth: Int, upcomingTasks: Int, overdueTasks: Int
            ) {
                self.total = total
                self.favourites = favourites
                self.families = families
                self.sources = sources
                self.addedThisMonth = addedThisMonth
                self.upcomingTasks = upcomingTasks
                self.overdueTasks = overdueTasks
            }
        }
        public static let service = Care.service
        public static let name = "statistics"
        public static let idempotent = true
    }

    // MARK: - Preferences, tasks

    /// A person's scheduling preferences.
    public struct Preferences: Codable, Sendable, Equatable {
        /// IANA name, e.g. Europe/Berlin.
        public var timeZone: String
        /// Minutes after local midnight, e.g. 540 for 09:00.
        public var preferredMinute: Int
        /// Quiet hours as minutes after midnight (may wrap past midnight); nothing is due then.
        public var quietStartMinute: Int?
        public var quietEndMinute: Int?
        /// Multiplies watering intervals (1.2 waters less often).
        public var wateringFactor: Double
        /// A holiday: nothing falls due in [start, end); it moves to the end.
        public var pauseStart: Date?
        public var pauseEnd: Date?
        /// Whether the person lives south of the equator (dormancy months shift by six).
        public var southernHemisphere: Bool

        public init(
            timeZone: String = "UTC", preferredMinute: Int = 540, quietStartMinute: Int? = nil, quietEndMinute: Int? = nil,
            wateringFactor: Double = 1, pauseStart: Date? = nil, pauseEnd: Date? = nil, southernHemisphere: Bool = false
        ) {
            self.timeZone = timeZone
            self.preferredMinute = preferredMinute
            self.quietStartMinute = quietStartMinute
            self.quietEndMinute = quietEndMinute
            self.wateringFactor = wateringFactor
            self.pauseStart = pauseStart
            self.pauseEnd = pauseEnd
            self.southernHemisphere = southernHemisphere
        }
    }

    /// `care.preferences.set`: replaces the principal's preferences and reschedules.
    public enum SetPreferences: BusOperation {
        /// The principal's preferences in full; fields left out take their defaults.
        public typealias Request = Preferences
        /// The preferences as saved.
        public typealias Reply = Preferences
        public static let service = Care.service
        public static let name = "preferences.set"
        public static let idempotent = true
    }

    /// What a task asks for: care a plant's profile schedules (water, rotate, and fertilize, mist,
    /// repot or prune when the profile calls for them), or a person's own `custom` task.
    public enum TaskKind: String, Codable, Sendable, CaseIterable { case water, fertilize, mist, repot, prune, rotate, custom }

    /// A piece of care due at a time.
    public struct Task: Codable, Sendable, Equatable {
        public var id: String
        public var plantID: String
        public var kind: TaskKind
        public var title: String
        public var due: Date
        /// Set while snoozed: the task shows at this time instead, its rule unchanged.
        public var snoozedUntil: Date?

        public init(id: String, plantID: String, kind: TaskKind, title: String, due: Date, snoozedUntil: Date? = nil) {
            self.id = id
            self.plantID = plantID
            self.kind = kind
            self.title = title
            self.due = due
            self.snoozedUntil = snoozedUntil
        }
    }

    /// `care.tasks.reminder-sync`: canopy-care sends the principal's window to canopy-remind
    /// again (`reminders.sync`, its outbox's follow-up, or a newer one already waiting) —
    /// canopy-remind's refill when a window runs low. Through the outbox, a refill goes in
    /// order with the syncs that changes send: it never lands after a newer window (a window
    /// read, then overtaken by a snooze's sync, would have put the snoozed reminder back).
    public enum RequestReminderSync: BusOperation {
        /// Nothing: the window sent is the principal's.
        public struct Request: Codable, Sendable, Equatable { public init() {} }
        /// Nothing: the window goes to canopy-remind through the outbox, not in this reply.
        public typealias Reply = Empty
        public static let service = Care.service
        public static let name = "tasks.reminder-sync"
        public static let idempotent = true
        /// canopy-remind's refill; never a person's request.
        public static let access = Access.service
    }

    /// `care.tasks.upcoming`: the principal's tasks due within `days`, overdue ones first, in due order.
    public enum UpcomingTasks: BusOperation {
        /// How many days ahead to look, 0 to 366 (default 7), and at most how many tasks to answer,
        /// 1 to 5,000 (default 1,000).
        public struct Request: Codable, Sendable {
            public var days: Int
            public var limit: Int?
            public init(days: Int = 7, limit: Int? = nil) {
                self.days = days
                self.limit = limit
            }
        }
        /// The tasks showing before now (overdue) and those showing within `days`, each soonest first.
        public struct Reply: Codable, Sendable, Equatable {
            public var overdue: [Task]
            public var upcoming: [Task]

            public init(overdue: [Task], upcoming: [Task]) {
                self.overdue = overdue
                self.upcoming = upcoming
            }
        }
        public static let service = Care.service
        public static let name = "tasks.upcoming"
        public static let idempotent = true
    }

    /// `care.tasks.complete`: logs the care as done (at `at`, default now) and schedules the next.
    /// With a `key` (the caller's idempotency key), a repeat of the same key within a day does
    /// nothing more and answers the task as it is: the care is logged once.
    public enum CompleteTask: BusOperation {
        /// The task, when the care was done (`at`, default now), and the caller's idempotency key, if any.
        public struct Request: Codable, Sendable {
            public var id: String
            public var at: Date?
            public var key: String?
            public init(id: String, at: Date? = nil, key: String? = nil) {
                self.id = id
                self.at = at
                self.key = key
            }
        }
        /// The task as it is now: next due counted from when the care was done.
        public typealias Reply = Task
        public static let service = Care.service
        public static let name = "tasks.complete"
    }

    /// `care.tasks.snooze`: shows the task again at `until`; its rule does not change.
    public enum SnoozeTask: BusOperation {
        /// The task, and when to show it again.
        public struct Request: Codable, Sendable {
            public var id: String
            public var until: Date
            public init(id: String, until: Date) {
                self.id = id
                self.until = until
            }
        }
        /// The task as it is now, showing at `snoozedUntil`.
        public typealias Reply = Task
        public static let service = Care.service
        public static let name = "tasks.snooze"
        public static let idempotent = true
    }

    /// `care.tasks.skip`: moves to the next occurrence without logging care. With a `key`, as
    /// `tasks.complete`: a repeat of the key skips nothing more.
    public enum SkipTask: BusOperation {
        /// The task, and the caller's idempotency key, if any.
        public struct Request: Codable, Sendable {
            public var id: String
            public var key: String?
            public init(id: String, key: String? = nil) {
                self.id = id
                self.key = key
            }
        }
        /// The task moved to its next occurrence, counted from when it was due.
        public typealias Reply = Task
        public static let service = Care.service
        public static let name = "tasks.skip"
    }

    /// `care.tasks.add-custom`: a task of the person's own for a plant, repeating every
    /// `everyDays` days from when it was last done.
    public enum AddCustomTask: BusOperation {
        /// The principal's plant, the task's title (required, at most 200 bytes) and its interval,
        /// 1 to 3,650 days. A plant has at most 50 custom tasks (`tooLarge` past that).
        public struct Request: Codable, Sendable {
            public var plantID: String
            public var title: String
            public var everyDays: Int
            public init(plantID: String, title: String, everyDays: Int) {
                self.plantID = plantID
                self.title = title
                self.everyDays = everyDays
            }
        }
        /// The new task, first due `everyDays` days from today at the person's preferred time.
        public typealias Reply = Task
        public static let service = Care.service
        public static let name = "tasks.add-custom"
    }

    /// One entry of the care log.
    public struct LogEntry: Codable, Sendable, Equatable {
        public var plantID: String
        public var kind: TaskKind
        public var at: Date

        public init(plantID: String, kind: TaskKind, at: Date) {
            self.plantID = plantID
            self.kind = kind
            self.at = at
        }
    }

    /// `care.log`: what was done for a plant, newest first.
    public enum CareLog: BusOperation {
        /// One of the principal's plants; another person's is `notFound`.
        public struct Request: Codable, Sendable {
            public var plantID: String
            public init(plantID: String) { self.plantID = plantID }
        }
        /// At most 1,000 entries, newest first.
        public typealias Reply = [LogEntry]
        public static let service = Care.service
        public static let name = "log"
        public static let idempotent = true
    }
}

extension Care.Plant {
    /// Decodes what a client sends: only `scientificName` is required; everything else
    /// takes its default (as `canopy send care plants.add --json '{"scientificName":"..."}'`).
    public init(from decoder: any Decoder) throws {
        let values = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            id: try values.decodeIfPresent(String.self, forKey: .id) ?? "",
            scientificName: try values.decode(String.self, forKey: .scientificName),
            commonNames: try values.decodeIfPresent([String].self, forKey: .commonNames) ?? [],
            family: try values.decodeIfPresent(String.self, forKey: .family) ?? "",
            genus: try values.decodeIfPresent(String.self, forKey: .genus) ?? "",
            customName: try values.decodeIfPresent(String.self, forKey: .customName),
            location: try values.decodeIfPresent(String.self, forKey: .location),
            notes: try values.decodeIfPresent(String.self, forKey: .notes),
            favourite: try values.decodeIfPresent(Bool.self, forKey: .favourite) ?? false,
            imageIDs: try values.decodeIfPresent([String].self, forKey: .imageIDs) ?? [],
            identificationSource: try values.decodeIfPresent(Care.Source.self, forKey: .identificationSource) ?? .manual,
            identificationConfidence: try values.decodeIfPresent(Double.self, forKey: .identificationConfidence),
            dateIdentified: try values.decodeIfPresent(Date.self, forKey: .dateIdentified),
            dateAdded: try values.decodeIfPresent(Date.self, forKey: .dateAdded) ?? Date(timeIntervalSince1970: 0),
            profile: try values.decodeIfPresent(Care.Profile.self, forKey: .profile),
            profileOverridden: try values.decodeIfPresent(Bool.self, forKey: .profileOverridden) ?? false,
            version: try values.decodeIfPresent(Int.self, forKey: .version))
    }
}

extension Care.Preferences {
    /// Decodes what a client sends: every field is optional and takes its default.
    public init(from decoder: any Decoder) throws {
        let values = try decoder.container(keyedBy: CodingKeys.self)
        let defaults = Care.Preferences()
        self.init(
            timeZone: try values.decodeIfPresent(String.self, forKey: .timeZone) ?? defaults.timeZone,
            preferredMinute: try values.decodeIfPresent(Int.self, forKey: .preferredMinute) ?? defaults.preferredMinute,
            quietStartMinute: try values.decodeIfPresent(Int.self, forKey: .quietStartMinute),
            quietEndMinute: try values.decodeIfPresent(Int.self, forKey: .quietEndMinute),
            wateringFactor: try values.decodeIfPresent(Double.self, forKey: .wateringFactor) ?? defaults.wateringFactor,
            pauseStart: try values.decodeIfPresent(Date.self, forKey: .pauseStart),
            pauseEnd: try values.decodeIfPresent(Date.self, forKey: .pauseEnd),
            southernHemisphere: try values.decodeIfPresent(Bool.self, forKey: .southernHemisphere) ?? false)
    }
}

extension Care.ListPlants.Request {
    /// Every field is optional: `{}` lists the newest 50.
    public init(from decoder: any Decoder) throws {
        let values = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            search: try values.decodeIfPresent(String.self, forKey: .search),
            favourite: try values.decodeIfPresent(Bool.self, forKey: .favourite),
            family: try values.decodeIfPresent(String.self, forKey: .family),
            light: try values.decodeIfPresent(Care.Light.self, forKey: .light),
            watering: try values.decodeIfPresent(Care.WateringFrequency.self, forKey: .watering),
            source: try values.decodeIfPresent(Care.Source.self, forKey: .source),
            addedFrom: try values.decodeIfPresent(Date.self, forKey: .addedFrom),
            addedTo: try values.decodeIfPresent(Date.self, forKey: .addedTo),
            sort: try values.decodeIfPresent(Care.SortKey.self, forKey: .sort) ?? .dateAdded,
            descending: try values.decodeIfPresent(Bool.self, forKey: .descending) ?? true,
            limit: try values.decodeIfPresent(Int.self, forKey: .limit) ?? 50,
            offset: try values.decodeIfPresent(Int.self, forKey: .offset) ?? 0)
    }
}

extension Care.UpcomingTasks.Request {
    /// `days` defaults to 7.
    public init(from decoder: any Decoder) throws {
        let values = try decoder.container(keyedBy: CodingKeys.self)
        self.init(days: try values.decodeIfPresent(Int.self, forKey: .days) ?? 7, limit: try values.decodeIfPresent(Int.self, forKey: .limit))
    }
}
