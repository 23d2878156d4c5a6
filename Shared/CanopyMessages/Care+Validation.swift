import Foundation

// The limits of every field canopy-care takes, in one place per type. docs/operations/care.md
// ("Limits") lists the same. Sizes are UTF-8 bytes.

extension Care {
    /// Field limits, in bytes or counts.
    public enum Limits {
        public static let scientificNameBytes = 200
        public static let nameBytes = 100
        public static let commonNames = 20
        public static let locationBytes = 200
        public static let notesBytes = 10_000
        public static let imageIDs = 200
        public static let idBytes = 200
        /// A caller's idempotency key (`tasks.complete`, `tasks.skip`): canopy-api sends 64 hex digits.
        public static let requestKeyBytes = 128
        public static let searchBytes = 200
        public static let titleBytes = 200
        public static let timeZoneBytes = 64
        /// Plants one person may keep.
        public static let plantsPerPerson = 10_000
        /// Custom tasks one plant may have.
        public static let customTasksPerPlant = 50
        /// Largest page of `plants.list`.
        public static let pageSize = 500
        /// Entries `log` answers at most (newest first).
        public static let logEntries = 1_000
    }
}

extension Care.Profile: Validatable {
    public func validate() throws(CanopyError) {
        try Field.integer(wateringIntervalDays, "profile.wateringIntervalDays", 1...365)
        try Field.text(wateringAmount, "profile.wateringAmount", maximumBytes: Care.Limits.locationBytes)
        try Field.number(temperatureMinimumC, "profile.temperatureMinimumC", -60...60)
        try Field.number(temperatureMaximumC, "profile.temperatureMaximumC", -60...60)
        try Field.number(temperatureOptimumC, "profile.temperatureOptimumC", -60...60)
        guard temperatureMinimumC <= temperatureOptimumC, temperatureOptimumC <= temperatureMaximumC else {
            throw CanopyError(.badRequest, "profile temperatures must satisfy temperatureMinimumC <= temperatureOptimumC <= temperatureMaximumC")
        }
        guard ["low", "medium", "high"].contains(humidity) else {
            throw CanopyError(.badRequest, "profile.humidity is low, medium or high")
        }
        try Field.integer(fertilizerIntervalDays, "profile.fertilizerIntervalDays", 1...365)
        try Field.text(fertilizerType, "profile.fertilizerType", maximumBytes: Care.Limits.nameBytes)
        try Field.list(dormancyMonths, "profile.dormancyMonths", maximumCount: 12) { month, name throws(CanopyError) in
            try Field.integer(month, name, 1...12)
        }
        guard Set(dormancyMonths).count == dormancyMonths.count else {
            throw CanopyError(.badRequest, "profile.dormancyMonths names a month twice")
        }
        try Field.integer(mistIntervalDays, "profile.mistIntervalDays", 1...365)
        try Field.integer(repotIntervalMonths, "profile.repotIntervalMonths", 1...120)
    }
}

extension Care.Plant: Validatable {
    public func validate() throws(CanopyError) {
        if !id.isEmpty { try Field.identifier(id, "id", maximumBytes: Care.Limits.idBytes) }
        try Field.text(scientificName, "scientificName", maximumBytes: Care.Limits.scientificNameBytes, required: true)
        try Field.list(commonNames, "commonNames", maximumCount: Care.Limits.commonNames) { name, field throws(CanopyError) in
            try Field.text(name, field, maximumBytes: Care.Limits.nameBytes)
        }
        try Field.text(family, "family", maximumBytes: Care.Limits.nameBytes)
        try Field.text(genus, "genus", maximumBytes: Care.Limits.nameBytes)
        try Field.text(customName, "customName", maximumBytes: Care.Limits.nameBytes)
        try Field.text(location, "location", maximumBytes: Care.Limits.locationBytes)
        try Field.text(notes, "notes", maximumBytes: Care.Limits.notesBytes, multiline: true)
        try Field.list(imageIDs, "imageIDs", maximumCount: Care.Limits.imageIDs) { image, field throws(CanopyError) in
            try Field.identifier(image, field)
        }
        try Field.number(identificationConfidence, "identificationConfidence", 0...1)
        try Field.date(dateIdentified, "dateIdentified")
        try Field.date(dateAdded, "dateAdded")
        try Field.integer(version, "version", 1...Int(Int32.max))
        if profileOverridden, profile == nil {
            throw CanopyError(.badRequest, "profileOverridden is true but no profile is given")
        }
        try profile?.validate()
    }

    /// An upper bound of this plant's JSON size in a listing (no profile), in bytes: every
    /// text may double when escaped, and the rest is a fixed allowance.
    public var listingBytesBound: Int {
        let texts =
            [scientificName, family, genus, customName ?? "", location ?? "", notes ?? "", id].reduce(0) { $0 + $1.utf8.count }
            + commonNames.reduce(0) { $0 + $1.utf8.count + 3 } + imageIDs.reduce(0) { $0 + $1.utf8.count + 3 }
        return 2 * texts + 600
    }
}

extension Care.Preferences: Validatable {
    /// The time zone `timeZone` names when it is an IANA name (`Europe/Berlin`, `UTC`), the
    /// one rule for what a time zone is; nil for anything else (`CET+1`, `Mars/Olympus`).
    public var zone: TimeZone? {
        guard timeZone.contains("/") || timeZone == "UTC" || timeZone == "GMT" else { return nil }
        return TimeZone(identifier: timeZone)
    }

    public func validate() throws(CanopyError) {
        try Field.text(timeZone, "timeZone", maximumBytes: Care.Limits.timeZoneBytes, required: true)
        guard zone != nil else {
            throw CanopyError(.badRequest, "timeZone '\(timeZone)' is not an IANA time zone such as Europe/Berlin or America/New_York", field: "timeZone")
        }
        try Field.integer(preferredMinute, "preferredMinute", 0...1439)
        try Field.integer(quietStartMinute, "quietStartMinute", 0...1439)
        try Field.integer(quietEndMinute, "quietEndMinute", 0...1439)
        guard (quietStartMinute == nil) == (quietEndMinute == nil) else {
            throw CanopyError(.badRequest, "quietStartMinute and quietEndMinute come together, or neither")
        }
        try Field.number(wateringFactor, "wateringFactor", 0.2...5)
        try Field.date(pauseStart, "pauseStart")
        try Field.date(pauseEnd, "pauseEnd")
        guard (pauseStart == nil) == (pauseEnd == nil) else {
            throw CanopyError(.badRequest, "pauseStart and pauseEnd come together, or neither")
        }
        if let start = pauseStart, let end = pauseEnd, end <= start {
            throw CanopyError(.badRequest, "pauseEnd must be after pauseStart")
        }
    }
}

extension Care.CatalogSearch.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.text(text, "text", maximumBytes: Care.Limits.searchBytes)
        try Field.integer(limit, "limit", 1...100)
    }
}

extension Care.GetPlant.Request: Validatable {
    public func validate() throws(CanopyError) { try Field.identifier(id, "id", maximumBytes: Care.Limits.idBytes) }
}

extension Care.DeletePlant.Request: Validatable {
    public func validate() throws(CanopyError) { try Field.identifier(id, "id", maximumBytes: Care.Limits.idBytes) }
}

extension Care.ListPlants.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.text(search, "search", maximumBytes: Care.Limits.searchBytes)
        try Field.text(family, "family", maximumBytes: Care.Limits.nameBytes)
        try Field.date(addedFrom, "addedFrom")
        try Field.date(addedTo, "addedTo")
        try Field.integer(limit, "limit", 1...Care.Limits.pageSize)
        try Field.integer(offset, "offset", 0...Care.Limits.plantsPerPerson)
    }
}

extension Care.UpcomingTasks.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.integer(days, "days", 0...366)
        try Field.integer(limit, "limit", 1...5_000)
    }
}

extension Care.CompleteTask.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.identifier(id, "id", maximumBytes: Care.Limits.idBytes)
        try Field.date(at, "at")
        try Field.identifier(key, "key", maximumBytes: Care.Limits.requestKeyBytes)
    }
}

extension Care.SnoozeTask.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.identifier(id, "id", maximumBytes: Care.Limits.idBytes)
        try Field.date(until, "until")
    }
}

extension Care.SkipTask.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.identifier(id, "id", maximumBytes: Care.Limits.idBytes)
        try Field.identifier(key, "key", maximumBytes: Care.Limits.requestKeyBytes)
    }
}

extension Care.AddCustomTask.Request: Validatable {
    public func validate() throws(CanopyError) {
        try Field.identifier(plantID, "plantID", maximumBytes: Care.Limits.idBytes)
        try Field.text(title, "title", maximumBytes: Care.Limits.titleBytes, required: true)
        try Field.integer(everyDays, "everyDays", 1...3_650)
    }
}

extension Care.CareLog.Request: Validatable {
    public func validate() throws(CanopyError) { try Field.identifier(plantID, "plantID", maximumBytes: Care.Limits.idBytes) }
}

extension Care.RequestReminderSync.Request: Validatable {
    public func validate() throws(CanopyError) {}
}
