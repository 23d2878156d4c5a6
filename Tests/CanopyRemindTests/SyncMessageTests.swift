import CanopyMessages
import Foundation
import Testing

/// `reminders.sync` carries each task once with its due times: the same occurrences come out
/// as went in, and the limits hold on what it unpacks to.
struct SyncMessageTests {
    static let day = Date(timeIntervalSince1970: 1_800_000_000)

    /// A window as canopy-care makes it: 8 tasks, each due every 4 days, soonest first.
    static func window(snoozed: Bool = false) -> [Care.Task] {
        (0..<64).map { index in
            let plant = index % 8
            return Care.Task(
                id: "p\(plant):water", plantID: "p\(plant)", kind: .water, title: "Water plant \(plant)",
                due: day.addingTimeInterval(Double(index / 8) * 4 * 86_400 + Double(plant) * 3_600),
                snoozedUntil: snoozed && index == 3 ? day.addingTimeInterval(10 * 3_600) : nil)
        }.sorted { ($0.due, $0.id) < ($1.due, $1.id) }
    }

    @Test func aWindowTravelsAsEachTaskOnceAndUnpacksToTheSameOccurrences() throws {
        let window = Self.window(snoozed: true)
        let request = Reminders.Sync.Request(window: window)
        #expect(request.tasks.count == 8)
        #expect(request.tasks.allSatisfy { $0.due.count == 8 })
        #expect(request.occurrences == window, "the snooze stays on the first occurrence of its task only")
        let codec = MessageCodec()
        let decoded = try codec.decode(Reminders.Sync.Request.self, from: try codec.encode(request))
        #expect(decoded.occurrences == window)
        // Against one keyed object per occurrence, as before.
        #expect(try codec.encode(request).count * 2 < (try codec.encode(window)).count)
        try request.validate()
    }

    @Test func theLimitsCountOccurrencesNotTasks() throws {
        var many = Reminders.Sync.Request(window: Self.window())
        many.tasks[0].due += (0..<121).map { Self.day.addingTimeInterval(Double($0) * 60) }
        #expect { try many.validate() } throws: { ($0 as? CanopyError)?.code == .tooLarge }
        var none = Reminders.Sync.Request(window: Self.window())
        none.tasks[2].due = []
        #expect { try none.validate() } throws: { ($0 as? CanopyError)?.message.contains("tasks[2].due") == true }
        var ancient = Reminders.Sync.Request(window: Self.window())
        ancient.tasks[1].due[4] = Date(timeIntervalSince1970: -86_400)
        #expect { try ancient.validate() } throws: { ($0 as? CanopyError)?.message.contains("tasks[1].due[4]") == true }
    }
}
