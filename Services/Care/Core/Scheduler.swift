import CanopyMessages
import Foundation

/// Turns a care profile and a person's preferences into due times. Pure: the time is an
/// argument, the calendar comes from the time zone, nothing is stored.
///
/// Rules: water, fertilize and mist repeat an interval counted from when the care was last
/// actually done; repot repeats in months; rotate falls on the first Saturday of each month
/// and prune on the first day of the growing season (calendar rules); custom tasks repeat
/// their own interval. In the species' dormancy months (shifted by six months south of the
/// equator) watering intervals stretch by half and fertilizing stops. Every task falls at the
/// person's preferred local time; a time that does not exist that day (a daylight-saving
/// jump) moves to the next valid time, a time that happens twice happens the first time;
/// quiet hours push it to their end; a pause window pushes it to the pause's end.
struct Scheduler: Sendable {
    /// Watering intervals stretch by this much in dormancy.
    static let dormantWateringStretch = 1.5

    let preferences: Care.Preferences
    let calendar: Calendar

    /// - Parameter preferences: validated (the runtime validates a request before its
    ///   handler runs; stored preferences were validated when they were set).
    /// - Throws: `badRequest` for a time zone that is not an IANA name, the one check a
    ///   calendar cannot be made without.
    init(preferences: Care.Preferences) throws(CanopyError) {
        guard let zone = preferences.zone else {
            throw CanopyError(
                .badRequest, "timeZone '\(preferences.timeZone)' is not an IANA time zone such as Europe/Berlin or America/New_York", field: "timeZone")
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
        if profile.prune == true { kinds.append(.prune) }
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
        case .prune:
            // Calendar rule: once a year, on the first day of the growing season.
            candidate = calendar.nextDate(after: day, matching: DateComponents(month: pruneMonth(profile), day: 1), matchingPolicy: .nextTime)
        case .custom:
            candidate = nil // custom tasks carry their own interval: ``nextDue(everyDays:after:)``
        }
        return candidate.map { place(onDayOf: $0) }
    }

    /// A custom task's next time: `everyDays` after it was last done.
    func nextDue(everyDays: Int, after anchor: Date) -> Date {
        place(onDayOf: calendar.date(byAdding: .day, value: max(1, everyDays), to: calendar.startOfDay(for: anchor))!)
    }

    /// The local month growth starts: the first month after the dormancy months (March in the
    /// north, September in the south, for plants that do not rest).
    func pruneMonth(_ profile: Care.Profile) -> Int {
        let resting = Set(profile.dormancyMonths)
        let north = (1...12).first { !resting.contains($0) && resting.contains($0 == 1 ? 12 : $0 - 1) } ?? 3
        return preferences.southernHemisphere ? (north + 5) % 12 + 1 : north
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
            isQuiet(minuteOfDay(due), start: start, end: end)
        else { return due }
        let sameDay = atLocalMinute(end, onDayOf: due)
        return sameDay > due ? sameDay : atLocalMinute(end, onDayOf: calendar.date(byAdding: .day, value: 1, to: due)!)
    }

    /// `minute` after local midnight on `date`'s day. A time skipped by a daylight-saving jump
    /// becomes the next valid time; a repeated one the first.
    func atLocalMinute(_ minute: Int, onDayOf date: Date) -> Date {
        let day = calendar.startOfDay(for: date)
        return calendar.date(
            bySettingHour: minute / 60, minute: minute % 60, second: 0, of: day,
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
        plan(profile: profile, table: DayTable(self, from: start, days: days))
    }

    /// The same with a day table built once for many plants (compute once what every plant
    /// of one person shares: each local day's due time, month and next first Saturday).
    func plan(profile: Care.Profile, table: DayTable) -> [(kind: Care.TaskKind, due: Date)] {
        var plan: [(Care.TaskKind, Date)] = []
        plan.reserveCapacity(128)
        let factor = preferences.wateringFactor
        let dormant = table.dormantMask(profile.dormancyMonths)
        for kind in Self.kinds(for: profile) {
            var day = 0
            while true {
                let next: Int?
                switch kind {
                case .water:
                    var days = Double(profile.wateringIntervalDays) * factor
                    let plain = day + max(1, Int(days.rounded()))
                    if plain < table.count, dormant[plain] { days *= Self.dormantWateringStretch }
                    next = day + max(1, Int(days.rounded()))
                case .fertilize:
                    var candidate = day + (profile.fertilizerIntervalDays ?? 0)
                    var months = 0
                    while candidate < table.count, dormant[candidate], months < 12 {
                        candidate = table.firstOfNextMonth[candidate]
                        months += 1
                    }
                    next = months == 12 ? nil : candidate
                case .mist:
                    next = profile.mistIntervalDays.map { day + $0 }
                case .rotate:
                    next = table.nextFirstSaturday[day]
                case .repot:
                    // Months apart: at most once a year; the calendar does it.
                    next = profile.repotIntervalMonths.flatMap { months in
                        calendar.date(byAdding: .month, value: months, to: table.day(day)).flatMap(table.index)
                    }
                case .prune:
                    next = calendar.nextDate(
                        after: table.day(day), matching: DateComponents(month: pruneMonth(profile), day: 1),
                        matchingPolicy: .nextTime
                    ).flatMap(table.index)
                case .custom:
                    next = nil
                }
                guard let index = next, index < table.count, index > day else { break } // always forward
                plan.append((kind, table.due[index]))
                // The care is done when due: a pause or quiet hours may have moved that to a later day.
                guard let doneDay = table.dueDay[index] else { break }
                day = doneDay
            }
        }
        return plan.sorted { $0.1 < $1.1 }
    }
}

/// For a window of local days: the due time of each (preferred time, quiet hours and pause
/// applied, daylight-saving safe), its month, the next first Saturday and the first day of
/// the next month, as indices. Built with the calendar once; read with integer arithmetic.
struct DayTable {
    /// Days in the window.
    let count: Int
    let due: [Date]
    let month: [Int]
    /// Index of the first day of the next month (may be `count` past the end).
    let firstOfNextMonth: [Int]
    /// Index of the next first Saturday strictly after each day, if within the window.
    let nextFirstSaturday: [Int?]
    /// Index of the local day each day's due time falls on (later when moved by a pause or
    /// quiet hours; `nil` past the window).
    private(set) var dueDay: [Int?] = []
    private let starts: [Date]
    private let end: Date
    private let southern: Bool

    init(_ scheduler: Scheduler, from start: Date, days: Int) {
        let calendar = scheduler.calendar
        let first = calendar.startOfDay(for: start)
        count = days + 1
        var starts: [Date] = [], due: [Date] = [], month: [Int] = [], firstSaturday: [Bool] = []
        starts.reserveCapacity(count)
        for offset in 0..<count {
            let day = calendar.date(byAdding: .day, value: offset, to: first)!
            let parts = calendar.dateComponents([.month, .day, .weekday], from: day)
            starts.append(day)
            due.append(scheduler.place(onDayOf: day))
            month.append(parts.month!)
            firstSaturday.append(parts.weekday == 7 && parts.day! <= 7)
        }
        var nextMonth = [Int](repeating: count, count: count)
        var nextSaturday = [Int?](repeating: nil, count: count)
        var upcomingMonthStart = count
        var upcomingSaturday: Int?
        for index in stride(from: count - 1, through: 0, by: -1) {
            nextMonth[index] = upcomingMonthStart
            nextSaturday[index] = upcomingSaturday
            if calendar.component(.day, from: starts[index]) == 1 { upcomingMonthStart = index }
            if firstSaturday[index] { upcomingSaturday = index }
        }
        self.starts = starts
        end = calendar.date(byAdding: .day, value: count, to: first)!
        self.due = due
        self.month = month
        firstOfNextMonth = nextMonth
        nextFirstSaturday = nextSaturday
        southern = scheduler.preferences.southernHemisphere
        dueDay = due.map { index($0) }
    }

    /// Which days fall in a dormancy month where the person lives.
    func dormantMask(_ months: [Int]) -> [Bool] {
        guard !months.isEmpty else { return [Bool](repeating: false, count: count) }
        var set = [Bool](repeating: false, count: 13)
        for month in months { set[southern ? (month + 5) % 12 + 1 : month] = true }
        return month.map { set[$0] }
    }

    func day(_ index: Int) -> Date { starts[min(index, starts.count - 1)] }

    /// The index of the local day holding `date`, or `nil` outside the window.
    func index(_ date: Date) -> Int? {
        var low = 0, high = starts.count - 1
        guard let first = starts.first, date >= first, date < end else { return nil }
        while low < high {
            let middle = (low + high + 1) / 2
            if starts[middle] <= date { low = middle } else { high = middle - 1 }
        }
        return low
    }
}
