import CanopyMessages
import Foundation
import GRDB
import Testing

@testable import CanopyCare

/// The collection in a real SQLite store: seed 003's search and filter table, sorting,
/// paging, statistics, tasks, the delete cascade, isolation.
struct CollectionTests {
    let directory: URL
    let library: CareLibrary
    let start = try! Date("2026-05-04T10:00:00Z", strategy: .iso8601)

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("canopy-care-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        library = CareLibrary(store: try SQLiteCareStore(path: directory.appendingPathComponent("care.sqlite").path))
    }

    /// Alice's collection, added a day apart, and one plant of Bob's.
    @discardableResult
    func seed() throws -> [Care.Plant] {
        let plants: [(String, String?, Bool, Care.Source)] = [
            ("Monstera deliciosa", "Big Monty", true, .plantnet),
            ("Epipremnum aureum", nil, false, .plantnet),
            ("Nephrolepis exaltata", nil, true, .manual),
            ("Zamioculcas zamiifolia", nil, false, .catalog),
            ("Crassula ovata", "Jade", false, .manual),
            ("Spathiphyllum wallisii", nil, true, .plantnet),
        ]
        var added: [Care.Plant] = []
        for (index, (name, custom, favourite, source)) in plants.enumerated() {
            let plant = Care.Plant(
                scientificName: name, customName: custom, favourite: favourite, identificationSource: source,
                identificationConfidence: 0.9, dateIdentified: start.addingTimeInterval(Double(index) * 86_400 - 3_600))
            added.append(try library.add(plant, owner: "alice", now: start.addingTimeInterval(Double(index) * 86_400)))
        }
        _ = try library.add(Care.Plant(scientificName: "Monstera adansonii"), owner: "bob", now: start)
        return added
    }

    func names(_ request: Care.ListPlants.Request, owner: String = "alice") throws -> [String] {
        try library.list(request, owner: owner).plants.map(\.scientificName)
    }

    @Test(arguments: [
        ("", 6), ("xyzabc123", 0), ("MONSTERA", 1), ("Mon", 2), ("Swiss cheese", 1), ("deliciosa", 1), ("Araceae", 4), ("del", 1), ("jade", 1), ("50%", 0),
    ])
    func searchIsCaseInsensitivePartialAndCoversCommonScientificAndFamilyNames(text: String, matches: Int) throws {
        try seed()
        let found = try library.list(.init(search: text), owner: "alice")
        #expect(found.total == matches, "\(text)")
        #expect(found.plants.count == matches)
    }

    @Test func partialCommonAndFamilyNamesFindTheRightPlants() throws {
        try seed()
        #expect(try names(.init(search: "swiss cheese")) == ["Monstera deliciosa"])
        #expect(Set(try names(.init(search: "mon"))) == ["Monstera deliciosa", "Crassula ovata"], "Monstera, and the jade's common name 'money plant'")
        let aroids: Set = ["Monstera deliciosa", "Epipremnum aureum", "Zamioculcas zamiifolia", "Spathiphyllum wallisii"]
        #expect(Set(try names(.init(search: "araceae"))) == aroids)
        #expect(Set(try names(.init(family: "ARACEAE"))) == aroids)
    }

    @Test func filtersCombineAndHappenInTheDatabase() throws {
        try seed()
        #expect(Set(try names(.init(favourite: true))) == ["Monstera deliciosa", "Nephrolepis exaltata", "Spathiphyllum wallisii"])
        #expect(Set(try names(.init(favourite: true, family: "araceae"))) == ["Monstera deliciosa", "Spathiphyllum wallisii"], "favourites AND aroids")
        #expect(try names(.init(light: .low, watering: .rarely)) == ["Zamioculcas zamiifolia"])
        #expect(Set(try names(.init(watering: .often))) == ["Nephrolepis exaltata"])
        #expect(Set(try names(.init(source: .manual))) == ["Nephrolepis exaltata", "Crassula ovata"])
        let window = try names(.init(addedFrom: start.addingTimeInterval(86_400), addedTo: start.addingTimeInterval(3 * 86_400)))
        #expect(Set(window) == ["Epipremnum aureum", "Nephrolepis exaltata"])
        #expect(try names(.init(search: "monstera", favourite: false)).isEmpty)
    }

    @Test func sortsEveryWayAndPages() throws {
        try seed()
        #expect(try names(.init(sort: .dateAdded, descending: true)).first == "Spathiphyllum wallisii", "newest first")
        #expect(try names(.init(sort: .dateAdded, descending: false)).first == "Monstera deliciosa")
        let byName = try library.list(.init(sort: .name, descending: false), owner: "alice").plants.map { $0.customName ?? $0.commonNames.first! }
        #expect(byName == byName.sorted { $0.lowercased() < $1.lowercased() })
        #expect(try names(.init(sort: .family, descending: false)).first.map { Catalog.shipped.lookup($0)!.family } == "Araceae")
        #expect(try names(.init(sort: .dateIdentified, descending: true)).first == "Spathiphyllum wallisii")
        let page1 = try names(.init(sort: .dateAdded, descending: false, limit: 4, offset: 0))
        let page2 = try library.list(.init(sort: .dateAdded, descending: false, limit: 4, offset: 4), owner: "alice")
        #expect(page1.count == 4 && page2.plants.count == 2 && page2.total == 6)
        #expect(Set(page1).isDisjoint(with: page2.plants.map(\.scientificName)))
    }

    @Test func nobodySeesOrChangesAnotherPersonsPlantsOrTasks() throws {
        let alices = try seed()
        #expect(try names(.init(search: "monstera"), owner: "bob") == ["Monstera adansonii"])
        #expect(throws: CanopyError.self) { _ = try library.get(alices[0].id, owner: "bob") }
        var stolen = alices[0]
        stolen.notes = "mine now"
        #expect(throws: CanopyError.self) { _ = try library.update(stolen, owner: "bob") }
        try library.delete(alices[0].id, owner: "bob")
        #expect(try library.get(alices[0].id, owner: "alice").notes == nil, "bob's delete changed nothing")
        let task = try #require(try library.upcoming(.init(days: 30), owner: "alice", now: start).upcoming.first)
        #expect(throws: CanopyError.self) { _ = try library.complete(task.id, at: nil, owner: "bob") }
        #expect(throws: CanopyError.self) { _ = try library.log(plantID: alices[0].id, owner: "bob") }
        #expect(try library.upcoming(.init(days: 30), owner: "bob", now: start).upcoming.allSatisfy { $0.plantID != alices[0].id })
    }

    @Test func statisticsCountTheCollection() throws {
        try seed()
        let stats = try library.statistics(owner: "alice", now: start.addingTimeInterval(10 * 86_400))
        #expect(stats.total == 6 && stats.favourites == 3)
        #expect(stats.families["Araceae"] == 4)
        #expect(stats.sources == ["plantnet": 3, "manual": 2, "catalog": 1])
        #expect(stats.addedThisMonth == 6)
        #expect(stats.overdueTasks > 0)
    }

    @Test func completeReanchorsSnoozeKeepsTheRuleAndSkipLogsNothing() throws {
        let plant = try library.add(Care.Plant(scientificName: "Monstera deliciosa"), owner: "alice", now: start)
        let water = try #require(try library.upcoming(.init(days: 10), owner: "alice", now: start).upcoming.first { $0.kind == .water })
        #expect(water.due == (try Date("2026-05-11T09:00:00Z", strategy: .iso8601)))

        let done = try library.complete(water.id, at: start.addingTimeInterval(9 * 86_400), owner: "alice") // watered two days late
        #expect(done.due == (try Date("2026-05-20T09:00:00Z", strategy: .iso8601)), "counted from the real watering")
        #expect(try library.log(plantID: plant.id, owner: "alice").map(\.kind) == [.water])

        let snoozed = try library.snooze(water.id, until: done.due.addingTimeInterval(3_600 * 5), owner: "alice")
        #expect(snoozed.due == done.due && snoozed.snoozedUntil == done.due.addingTimeInterval(3_600 * 5))

        let skipped = try library.skip(water.id, owner: "alice")
        #expect(skipped.due == (try Date("2026-05-27T09:00:00Z", strategy: .iso8601)))
        #expect(skipped.snoozedUntil == nil)
        #expect(try library.log(plantID: plant.id, owner: "alice").count == 1, "a skip logs no care")
    }

    @Test func customTasksRepeatTheirOwnIntervalAndSurviveRenamesAndRescheduling() throws {
        let plant = try library.add(Care.Plant(scientificName: "Ficus lyrata"), owner: "alice", now: start)
        let wipe = try library.addCustomTask(.init(plantID: plant.id, title: "Wipe the leaves", everyDays: 10), owner: "alice", now: start)
        #expect(wipe.kind == .custom)
        #expect(wipe.due == (try Date("2026-05-14T09:00:00Z", strategy: .iso8601)))
        let done = try library.complete(wipe.id, at: start.addingTimeInterval(12 * 86_400), owner: "alice")
        #expect(done.due == (try Date("2026-05-26T09:00:00Z", strategy: .iso8601)))
        var renamed = try library.get(plant.id, owner: "alice")
        renamed.customName = "Fiddle"
        _ = try library.update(renamed, owner: "alice", now: start)
        #expect(try library.log(plantID: plant.id, owner: "alice").map(\.kind) == [.custom], "an update keeps the care log")
        _ = try library.setPreferences(Care.Preferences(timeZone: "Europe/Berlin"), owner: "alice", now: start)
        let tasks = try library.upcoming(.init(days: 366), owner: "alice", now: start).upcoming
        #expect(tasks.filter { $0.kind == .custom }.count == 1)
        #expect(tasks.filter { $0.kind == .water }.count == 1, "one task per rule, renames included")
        #expect(tasks.first { $0.kind == .custom }?.due == (try Date("2026-05-26T07:00:00Z", strategy: .iso8601)), "09:00 Berlin now")
        #expect(tasks.contains { $0.kind == .prune })
        #expect(throws: CanopyError.self) { _ = try library.addCustomTask(.init(plantID: plant.id, title: "Steal", everyDays: 3), owner: "bob") }
    }

    @Test func preferencesRescheduleEveryTaskAtTheNewLocalTime() throws {
        _ = try library.add(Care.Plant(scientificName: "Monstera deliciosa"), owner: "alice", now: start)
        _ = try library.setPreferences(Care.Preferences(timeZone: "America/New_York", preferredMinute: 7 * 60 + 30), owner: "alice", now: start)
        let tasks = try library.upcoming(.init(days: 40), owner: "alice", now: start).upcoming
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "America/New_York")!
        #expect(tasks.allSatisfy { calendar.component(.hour, from: $0.due) == 7 && calendar.component(.minute, from: $0.due) == 30 })
        #expect(throws: CanopyError.self) { _ = try library.setPreferences(Care.Preferences(timeZone: "Not/AZone"), owner: "alice") }
    }

    @Test func deletingAPlantRemovesItsTasksAndLogAndTheFollowUpsSurviveARestart() throws {
        let plant = try library.add(Care.Plant(scientificName: "Ficus lyrata"), owner: "alice", now: start)
        let task = try #require(try library.upcoming(.init(days: 30), owner: "alice", now: start).upcoming.first)
        _ = try library.complete(task.id, at: nil, owner: "alice")
        try library.delete(plant.id, owner: "alice", now: start)
        #expect(throws: CanopyError.self) { _ = try library.get(plant.id, owner: "alice") }

        // Reopen the store as after a restart.
        let reopened = try SQLiteCareStore(path: directory.appendingPathComponent("care.sqlite").path)
        try reopened.database.read { db in
            #expect(try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM tasks WHERE plantID = ?", arguments: [plant.id]) == 0)
            #expect(try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM careLog WHERE plantID = ?", arguments: [plant.id]) == 0)
            let followUps = try String.fetchAll(db, sql: "SELECT operation FROM outbox WHERE owner = 'alice' ORDER BY id")
            #expect(Set(followUps) == [Reminders.Sync.name, Reminders.CancelPlant.name, Images.Purge.name, Identification.ForgetPlant.name])
        }
    }

    @Test func onlyTheNextSixtyFourTasksAreHandedToReminders() throws {
        for index in 0..<30 { _ = try library.add(Care.Plant(scientificName: Catalog.shipped.species[index].scientificName), owner: "alice", now: start) }
        let window = try library.reminderWindow(owner: "alice")
        #expect(window.count == 64)
        #expect(window.map { $0.snoozedUntil ?? $0.due } == window.map { $0.snoozedUntil ?? $0.due }.sorted())
        let all = try library.upcoming(.init(days: 366), owner: "alice", now: start)
        #expect(all.overdue.count + all.upcoming.count > 64)
        #expect(try library.reminderWindow(owner: "bob").isEmpty)
    }

    @Test func aPersonWhoIgnoresEveryTaskStillHasAWindowReachingAhead() throws {
        let plant = try library.add(Care.Plant(scientificName: "Monstera deliciosa"), owner: "alice", now: start)
        // Nothing is ever done: the task rows keep their first due times.
        let window = try library.reminderWindow(owner: "alice")
        #expect(window.count == 64)
        let waterings = window.filter { $0.kind == .water }.map(\.due)
        #expect(waterings.count > 3, "one task, several occurrences")
        #expect(waterings == waterings.sorted() && Set(waterings).count == waterings.count)
        #expect(window.allSatisfy { $0.plantID == plant.id })
        #expect(Set(window.map { "\($0.id) \($0.due)" }).count == 64, "each occurrence once")
        #expect(try library.reminderWindow(owner: "alice", count: 5) == Array(window.prefix(5)))
        // Two months later, still ignored: the missed occurrence is there once, and the rest
        // lie ahead of that day.
        let later = Date().addingTimeInterval(60 * 86_400)
        let afterwards = try library.reminderWindow(owner: "alice", now: later)
        let missed = afterwards.filter { $0.due < later }
        #expect(missed.count <= 7, "each task's own (missed) occurrence, no more")
        #expect(afterwards.filter { $0.due >= later }.count >= 57)
    }
}
