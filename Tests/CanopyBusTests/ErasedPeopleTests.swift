import CanopyBus
import CanopyMessages
import CanopyTesting
import Synchronization
import Testing

/// A service refuses a person it erased for its window: a request an edge let through before
/// it saw the sign-out adds nothing after the erasure.
struct ErasedPeopleTests {
    struct Note: Codable, Sendable, Equatable { var text: String }

    /// `notes.add`: one person's own data.
    enum Add: BusOperation {
        typealias Request = Note
        typealias Reply = Note
        static let service = "notes"
        static let name = "add"
    }

    /// `notes.forget`: the person erased (another service's follow-up).
    enum Forget: BusOperation {
        typealias Request = Empty
        typealias Reply = Empty
        static let service = "notes"
        static let name = "forget"
        static let access = Access.service
        static let idempotent = true
        static let erases = true
    }

    final class Notes: BusService {
        let name = "notes"
        let kept = Mutex<[String: [String]]>([:])

        func register(_ handlers: inout OperationHandlers) {
            handlers.on(Add.self) { [self] note, owner, _ in
                self.kept.withLock { $0[owner, default: []].append(note.text) }
                return note
            }
            handlers.on(Forget.self) { [self] _, owner, _ in
                _ = self.kept.withLock { $0.removeValue(forKey: owner) }
                return Empty()
            }
        }
    }

    @Test func aPersonErasedIsRefusedForTheWindowAndNobodyElseIs() async throws {
        let service = Notes()
        let bus = InProcessBus(erasureWindow: .seconds(600)) // past any pause of a loaded machine; expiry: the test below
        bus.register(service)
        let asService = bus.timingOut(after: .seconds(10), asService: true)
        _ = try await bus.call(Add.self, Note(text: "a"), principal: "erased")
        _ = try await bus.call(Add.self, Note(text: "b"), principal: "kept")
        _ = try await asService.call(Forget.self, Empty(), principal: "erased")

        // The late request: refused, and nothing added.
        let refused = await #expect(throws: CanopyError.self) { try await bus.call(Add.self, Note(text: "late"), principal: "erased") }
        #expect(refused?.code == .unauthorized && refused?.message.contains("deleted") == true)
        #expect(service.kept.withLock { $0["erased"] } == nil)
        // The erasure itself may run again (a retried follow-up), and another person is served.
        _ = try await asService.call(Forget.self, Empty(), principal: "erased")
        #expect(try await bus.call(Add.self, Note(text: "c"), principal: "kept") == Note(text: "c"))
    }

    @Test func theOldestAreForgottenFirstWhenFullAndExpiredOnesGo() {
        let start = ContinuousClock.now
        let erased = ErasedPeople(window: .seconds(60), capacity: 3)
        for (index, person) in ["a", "b", "c", "d"].enumerated() { erased.note(person, now: start + .seconds(index)) }
        #expect(erased.count == 3)
        #expect(!erased.contains("a", now: start + .seconds(5)), "the oldest went to make room")
        #expect(erased.contains("b", now: start + .seconds(5)) && erased.contains("d", now: start + .seconds(5)))
        #expect(!erased.contains("b", now: start + .seconds(61)), "past its window")
        #expect(erased.contains("d", now: start + .seconds(61)))
        // Past its window, the id is anyone's again (a new account under the same id).
        #expect(!erased.contains("c", now: start + .seconds(62)))
        // Noted again: its window starts again, and the older entry does not take it out.
        erased.note("b", now: start + .seconds(62))
        erased.note("e", now: start + .seconds(63))
        #expect(erased.contains("b", now: start + .seconds(100)))
        #expect(erased.count <= 3)
    }
}
