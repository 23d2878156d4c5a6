import CanopyMessages
import CanopyServiceKit
import Foundation
import Testing

@testable import CanopyCare

/// Local times across daylight-saving changes in both hemispheres, dormancy, pauses and
/// quiet hours. The calendar is the person's; the time is an argument.
struct SchedulerTests {
    let monstera = Catalog.shipped.lookup("Monstera deliciosa")!.profile

    func scheduler(_ zone: String, minute: Int = 540, _ configure: (inout Care.Preferences) -> Void = { _ in }) throws -> Scheduler {
        var preferences = Care.Preferences(timeZone: zone, preferredMinute: minute)
        configure(&preferences)
        return try Scheduler(preferences: preferences)
    }

    /// A local wall-clock time in `zone`.
    func local(_ zone: String, _ year: Int, _ month: Int, _ day: Int, _ hour: Int = 12, _ minute: Int = 0) -> Date {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: zone)!
        return calendar.date(from: DateComponents(year: year, month: month, day: day, hour: hour, minute: minute))!
    }

    func utc(_ text: String) -> Date { try! Date(text, strategy: .iso8601) }

    @Test(arguments: [
        // zone, day of the jump: a 09:00 task stays at 09:00 local, whatever the offset.
        ("Europe/Berlin", (2026, 3, 29), "2026-03-29T07:00:00Z"),
        ("Europe/Berlin", (2026, 10, 25), "2026-10-25T08:00:00Z"),
        ("America/New_York", (2026, 3, 8), "2026-03-08T13:00:00Z"),
        ("America/New_York", (2026, 11, 1), "2026-11-01T14:00:00Z"),
        ("Australia/Sydney", (2026, 4, 5), "2026-04-04T23:00:00Z"),
        ("Australia/Sydney", (2026, 10, 4), "2026-10-03T22:00:00Z"),
    ])
    func nineOClockStaysNineOClockAcrossDaylightSavingChanges(zone: String, day: (Int, Int, Int), expected: String) throws {
        let scheduler = try scheduler(zone)
        #expect(scheduler.place(onDayOf: local(zone, day.0, day.1, day.2)) == utc(expected))
    }

    @Test(arguments: [
        // A time that does not exist that day moves to the next valid time.
        ("Europe/Berlin", (2026, 3, 29), "2026-03-29T01:00:00Z"), // 02:30 skipped: 03:00 CEST
        ("America/New_York", (2026, 3, 8), "2026-03-08T07:00:00Z"), // 02:30 skipped: 03:00 EDT
        ("Australia/Sydney", (2026, 10, 4), "2026-10-03T16:00:00Z"), // 02:30 skipped: 03:00 AEDT
    ])
    func aTimeThatDoesNotExistMovesToTheNextValidTime(zone: String, day: (Int, Int, Int), expected: String) throws {
        #expect(try scheduler(zone, minute: 150).place(onDayOf: local(zone, day.0, day.1, day.2)) == utc(expected))
    }

    @Test(arguments: [
        // A time that happens twice happens once: the first time.
        ("Europe/Berlin", (2026, 10, 25), "2026-10-25T00:30:00Z"), // 02:30 CEST, not CET
        ("America/New_York", (2026, 11, 1), "2026-11-01T05:30:00Z"), // 01:30 EDT, not EST
        ("Australia/Sydney", (2026, 4, 5), "2026-04-04T15:30:00Z"), // 02:30 AEDT, not AEST
    ])
    func aTimeThatHappensTwiceHappensOnce(zone: String, day: (Int, Int, Int), expected: String) throws {
        let minute = zone == "America/New_York" ? 90 : 150
        #expect(try scheduler(zone, minute: minute).place(onDayOf: local(zone, day.0, day.1, day.2)) == utc(expected))
    }

    @Test func anIntervalCountsFromTheLastRealCareAndKeepsTheLocalTime() throws {
        let scheduler = try scheduler("Europe/Berlin")
        // Watered on Wednesday before the spring change; due a week later at 09:00 CEST.
        let watered = local("Europe/Berlin", 2026, 3, 25, 18, 40)
        #expect(scheduler.nextDue(.water, profile: monstera, after: watered) == utc("2026-04-01T07:00:00Z"))
        // Watered two days late: the next one counts from then.
        #expect(scheduler.nextDue(.water, profile: monstera, after: local("Europe/Berlin", 2026, 4, 3, 20)) == utc("2026-04-10T07:00:00Z"))
    }

    @Test func rotationFallsOnTheFirstSaturdayOfEachMonth() throws {
        let scheduler = try scheduler("America/New_York")
        let due = try #require(scheduler.nextDue(.rotate, profile: monstera, after: local("America/New_York", 2026, 3, 10)))
        #expect(due == utc("2026-04-04T13:00:00Z")) // Saturday 4 April, 09:00 EDT
    }

    @Test func dormancyStretchesWateringAndStopsFeedingInTheRightHemisphere() throws {
        let north = try scheduler("Europe/Berlin")
        let south = try scheduler("Australia/Sydney") { $0.southernHemisphere = true }
        // December: resting in the north (water every 7 x 1.5 = 11 days), growing in the south.
        #expect(north.nextDue(.water, profile: monstera, after: local("Europe/Berlin", 2026, 12, 1)) == utc("2026-12-12T08:00:00Z"))
        #expect(south.nextDue(.water, profile: monstera, after: local("Australia/Sydney", 2026, 12, 1)) == utc("2026-12-07T22:00:00Z"))
        // Feeding due in the rest is moved to the first day after it.
        #expect(north.nextDue(.fertilize, profile: monstera, after: local("Europe/Berlin", 2026, 11, 20)) == utc("2027-02-01T08:00:00Z"))
        #expect(south.nextDue(.fertilize, profile: monstera, after: local("Australia/Sydney", 2026, 11, 20)) == utc("2026-12-03T22:00:00Z"))
        // June: the south rests (May to July), feeding waits for August.
        #expect(south.nextDue(.fertilize, profile: monstera, after: local("Australia/Sydney", 2026, 6, 1)) == utc("2026-07-31T23:00:00Z"))
    }

    @Test func pruningFallsOnTheFirstDayOfTheGrowingSeasonInEachHemisphere() throws {
        #expect(monstera.prune == true)
        let north = try scheduler("Europe/Berlin")
        let south = try scheduler("Australia/Sydney") { $0.southernHemisphere = true }
        // Monstera rests November to January: pruned on 1 February in the north, 1 August in the south.
        #expect(north.nextDue(.prune, profile: monstera, after: local("Europe/Berlin", 2026, 5, 1)) == utc("2027-02-01T08:00:00Z"))
        #expect(south.nextDue(.prune, profile: monstera, after: local("Australia/Sydney", 2026, 5, 1)) == utc("2026-07-31T23:00:00Z"))
        #expect(Scheduler.kinds(for: Catalog.shipped.lookup("Aloe vera")!.profile).contains(.prune) == false)
    }

    @Test func aCustomTaskRepeatsItsOwnInterval() throws {
        let scheduler = try scheduler("America/New_York")
        #expect(scheduler.nextDue(everyDays: 3, after: local("America/New_York", 2026, 3, 6, 20)) == utc("2026-03-09T13:00:00Z"))
    }

    @Test func aPauseWindowPushesTasksToItsEnd() throws {
        let start = local("Europe/Berlin", 2026, 7, 1, 0), end = local("Europe/Berlin", 2026, 7, 15, 0)
        let scheduler = try scheduler("Europe/Berlin") {
            $0.pauseStart = start
            $0.pauseEnd = end
        }
        #expect(scheduler.nextDue(.water, profile: monstera, after: local("Europe/Berlin", 2026, 6, 28)) == utc("2026-07-15T07:00:00Z"))
        #expect(
            scheduler.nextDue(.water, profile: monstera, after: local("Europe/Berlin", 2026, 6, 20)) == utc("2026-06-27T07:00:00Z"),
            "before the pause: unchanged")
    }

    @Test func quietHoursPushTasksToTheirEnd() throws {
        let late = try scheduler("Europe/Berlin", minute: 23 * 60) {
            $0.quietStartMinute = 22 * 60
            $0.quietEndMinute = 7 * 60
        }
        #expect(late.place(onDayOf: local("Europe/Berlin", 2026, 5, 10)) == utc("2026-05-11T05:00:00Z"))
        let early = try scheduler("Europe/Berlin", minute: 6 * 60) {
            $0.quietStartMinute = 22 * 60
            $0.quietEndMinute = 7 * 60
        }
        #expect(early.place(onDayOf: local("Europe/Berlin", 2026, 5, 10)) == utc("2026-05-10T05:00:00Z"))
    }

    @Test func theWateringFactorStretchesIntervals() throws {
        let drier = try scheduler("UTC") { $0.wateringFactor = 2 }
        #expect(drier.nextDue(.water, profile: monstera, after: utc("2026-05-01T10:00:00Z")) == utc("2026-05-15T09:00:00Z"))
    }

    @Test func invalidPreferencesAreRefused() {
        for preferences in [
            Care.Preferences(timeZone: "Mars/Olympus"), Care.Preferences(timeZone: "Berlin"), Care.Preferences(timeZone: "UTC", preferredMinute: 1440),
            Care.Preferences(timeZone: "UTC", wateringFactor: 0),
        ] {
            #expect(throws: CanopyError.self) { try preferences.validate() }
        }
        // A calendar cannot be made without a zone: the scheduler refuses one that is not IANA too.
        #expect(throws: CanopyError.self) { _ = try Scheduler(preferences: Care.Preferences(timeZone: "Mars/Olympus")) }
    }

    @Test func aPlanListsEveryTaskInDueOrder() throws {
        let plan = try scheduler("Europe/Berlin").plan(profile: monstera, from: local("Europe/Berlin", 2026, 5, 1), days: 30)
        #expect(plan.map(\.due) == plan.map(\.due).sorted())
        #expect(plan.filter { $0.kind == .water }.count == 4) // 8, 15, 22, 29 May
        #expect(plan.filter { $0.kind == .rotate }.count == 1) // 2 May
        #expect(plan.filter { $0.kind == .fertilize }.count == 2)
    }

    @Test(arguments: ["Europe/Berlin", "America/New_York", "Australia/Sydney", "Asia/Kolkata"])
    func thePlanFromTheDayTableMatchesTheCalendarRuleByRule(zone: String) async throws {
        let scheduler = try scheduler(zone, minute: 150) {
            $0.southernHemisphere = zone == "Australia/Sydney"
            $0.quietStartMinute = 60
            $0.quietEndMinute = 160
            $0.pauseStart = self.local(zone, 2026, 8, 3)
            $0.pauseEnd = self.local(zone, 2026, 8, 20)
        }
        let start = local(zone, 2026, 1, 7, 15)
        // A year for every species, twice: seconds of work, done off the cooperative pool.
        let mismatches = try await offThePool { () -> [String] in
            var mismatches: [String] = []
            for species in Catalog.shipped.species {
                var reference: [(Care.TaskKind, Date)] = []
                let end = scheduler.calendar.date(byAdding: .day, value: 365, to: start)!
                for kind in Scheduler.kinds(for: species.profile) {
                    var anchor = start
                    while let due = scheduler.nextDue(kind, profile: species.profile, after: anchor), due < end {
                        reference.append((kind, due))
                        anchor = due
                    }
                }
                let plan = scheduler.plan(profile: species.profile, from: start, days: 365)
                let expected = reference.sorted { $0.1 < $1.1 }
                let planned: [String] = plan.map { "\($0.kind.rawValue)@\($0.due.timeIntervalSince1970)" }.sorted()
                let wanted: [String] = expected.map { "\($0.0.rawValue)@\($0.1.timeIntervalSince1970)" }.sorted()
                if plan.map(\.due) != expected.map(\.1) || planned != wanted {
                    mismatches.append("\(species.scientificName): planned \(planned.count) tasks, the rules give \(wanted.count)")
                }
            }
            return mismatches
        }
        #expect(mismatches.isEmpty, "in \(zone): \(mismatches)")
    }

    @Test func theCatalogHasEnoughSpeciesWithSourcesAndSaneFigures() {
        let catalog = Catalog.shipped
        #expect(catalog.species.count >= 80)
        for species in catalog.species {
            #expect(!species.sources.isEmpty && species.sources.allSatisfy { catalog.sources[$0] != nil }, "\(species.scientificName)")
            let profile = species.profile
            #expect(profile.wateringIntervalDays >= 1 && profile.wateringIntervalDays <= 60)
            #expect(profile.temperatureMinimumC <= profile.temperatureOptimumC && profile.temperatureOptimumC <= profile.temperatureMaximumC)
            #expect(profile.dormancyMonths.allSatisfy { (1...12).contains($0) })
        }
        #expect(catalog.lookup("Monstera obliqua")?.scientificName.hasPrefix("Monstera") == true, "genus fallback")
        #expect(catalog.search("swiss cheese").map(\.scientificName).contains("Monstera deliciosa"))
    }
}
