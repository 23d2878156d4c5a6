import CanopyMessages
import Foundation

/// Turns a care profile and a person's preferences into due times. Pure: the time is an
/// argument, the calendar comes from the time zone, nothing is stored.
///
/// Rules: water, fertilize and mist repeat an interval counted from when the care was last
/// actually done; repot repeats in months; rotate falls on the first Saturday of each month
/// (a calendar rule). In the species' dormancy months (shifted by six months south of the
/// equator) watering intervals stretch by half and fertilizing stops. Every task falls at the
/// person's preferred local time; a time that does not exist that day (a daylight-saving
/// jump) moves to the next valid time, a time that happens twice happens the first time;
/// quiet hours push it to their end; a pause window pushes it to the pause's end.
struct Scheduler: Sendable {
    /// Watering intervals stretch by this much in dormancy.
    static let dormantWateringStretch = 1.5

    let preferences: Care.Preferences
    let calendar: Calendar

    /// - Throws: `badRequest` for a time zone that is not an IANA name.
    init(preferences: Care.Preferences) throws(CanopyError) {
        guard let zone = TimeZone(identifier: preferences.timeZone), preferences.timeZone.contains("/") || preferences.timeZone == "UTC" || preferences.timeZone == "GMT" else {
            throw CanopyError(.badRequest, "'\(preferences.timeZone)' is not an IANA time zone such as Europe/Berlin or America/New_York")
        }
        guard (0..<1440).contains(preferences.preferredMinute) else {
            throw CanopyError(.badRequest, "preferredMinute is minutes after midnight, 0 to 1439")
        }
        guard preferences.wateringFactor > 0.2, preferences.wateringFactor < 5 else {
            throw CanopyError(.badRequest, "wateringFactor must be between 0.2 and 5")
        }
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = zone
        self.preferences = preferences
        self.calendar = calendar
    }

    /// The care kinds a profile calls for.
    static func kinds(for profile: Care.Profile) -> [Care.TaskKind] {
        var kinds: [Care.TaskKind] = [.water, .rotate]
        if profile.fertilizerIntervalDays != nil { kinds.append(.fertilize) }
        if profile.mistIntervalDays != nil { kinds.append(.mist) }
        if profile.repotIntervalMonths != nil { kinds.append(.repot) }
        return kinds
    }

    /// Whether `date` falls in a dormancy month where the person lives.
    func isDormant(_ date: Date, _ profile: Care.Profile) -> Bool {
        var month = calendar.component(.month, from: date)
        if preferences.southernHemisphere { month = (month + 5) % 12 + 1 } // July south is January north
        return profile.dormancyMonths.contains(month)
    }

    /// When `kind` is next due after care was last done at `anchor` (or the plant was added).
    func nextDue(_ kind: Care.TaskKind, profile: Care.Profile, after anchor: Date) -> Date? {
        let day = calendar.startOfDay(for: anchor)
        let candidate: Date?
        switch kind {
        case .water:
            var days = Double(profile.wateringIntervalDays) * preferences.wateringFactor
            let plain = calendar.date(byAdding: .day, value: max(1, Int(days.rounded())), to: day)!
            if isDormant(plain, profile) { days *= Self.dormantWateringStretch }
            candidate = calendar.date(byAdding: .day, value: max(1, Int(days.rounded())), to: day)
        case .fertilize:
            guard let interval = profile.fertilizerIntervalDays else { return nil }
            var date = calendar.date(byAdding: .day, value: interval, to: day)!
            // No feeding at rest: the first day of the first growing month after it.
            var guardMonths = 0
            while isDormant(date, profile), guardMonths < 12 {
                let month = calendar.date(from: calendar.dateComponents([.year, .month], from: date))!
                date = calendar.date(byAdding: .month, value: 1, to: month)!
                guardMonths += 1
            }
            candidate = guardMonths == 12 ? nil : date
        case .mist:
            candidate = profile.mistIntervalDays.flatMap { calendar.date(byAdding: .day, value: $0, to: day) }
        case .repot:
            candidate = profile.repotIntervalMonths.flatMap { calendar.date(byAdding: .month, value: $0, to: day) }
        case .rotate:
            // Calendar rule: the first Saturday of each month.
            candidate = calendar.nextDate(after: day, matching: DateComponents(weekday: 7, weekdayOrdinal: 1), matchingPolicy: .nextTime)
        case .prune, .custom:
            candidate = nil
        }
        return candidate.map { place(onDayOf: $0) }
    }

    /// The preferred local time on `date`'s day, moved out of quiet hours and pauses.
    func place(onDayOf date: Date) -> Date {
        var due = outOfQuietHours(atLocalMinute(preferences.preferredMinute, onDayOf: date))
        if let start = preferences.pauseStart, let end = preferences.pauseEnd, due >= start, due < end {
            due = atLocalMinute(preferences.preferredMinute, onDayOf: end)
            if due < end { due = atLocalMinute(preferences.preferredMinute, onDayOf: calendar.date(byAdding: .day, value: 1, to: end)!) }
            due = outOfQuietHours(due)
        }
        return due
    }

    /// `due`, or the end of the quiet hours it falls in.
    private func outOfQuietHours(_ due: Date) -> Date {
        guard let start = preferences.quietStartMinute, let end = preferences.quietEndMinute,
              isQuiet(minuteOfDay(due), start: start, end: end) else { return due }
        let sameDay = atLocalMinute(end, onDayOf: due)
        return sameDay > due ? sameDay : atLocalMinute(end, onDayOf: calendar.date(byAdding: .day, value: 1, to: due)!)
    }

    /// `minute` after local midnight on `date`'s day. A time skipped by a daylight-saving jump
    /// becomes the next valid time; a repeated one the first.
    func atLocalMinute(_ minute: Int, onDayOf date: Date) -> Date {
        let day = calendar.startOfDay(for: date)
        return calendar.date(bySettingHour: minute / 60, minute: minute % 60, second: 0, of: day,
                             matchingPolicy: .nextTime, repeatedTimePolicy: .first, direction: .forward) ?? day
    }

    func minuteOfDay(_ date: Date) -> Int {
        let parts = calendar.dateComponents([.hour, .minute], from: date)
        return parts.hour! * 60 + parts.minute!
    }

    func isQuiet(_ minute: Int, start: Int, end: Int) -> Bool {
        start <= end ? (minute >= start && minute < end) : (minute >= start || minute < end)
    }

    /// Every task a profile brings over `days` from `start`, assuming each is done when due.
    func plan(profile: Care.Profile, from start: Date, days: Int) -> [(kind: Care.TaskKind, due: Date)] {
        let end = calendar.date(byAdding: .day, value: days, to: start)!
        var plan: [(Care.TaskKind, Date)] = []
        for kind in Self.kinds(for: profile) {
            var anchor = start
            while let due = nextDue(kind, profile: profile, after: anchor), due < end {
                plan.append((kind, due))
                anchor = due
            }
        }
        return plan.sorted { $0.1 < $1.1 }
    }
}
