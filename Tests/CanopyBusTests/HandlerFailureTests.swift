import CanopyBus
import CanopyMessages
import CanopyTesting
import Testing

/// What a caller is told when a handler fails with something other than a ``CanopyError``:
/// a failure that says which error it is (a store whose database is away: `busy`, try again)
/// is answered as that; anything else is `internal`, with the details in the service's log.
struct HandlerFailureTests {
    struct Unavailable: Error, CanopyErrorConvertible {
        var canopyError: CanopyError { CanopyError(.busy, "the database cannot do this now; try again in a moment") }
    }

    struct Broken: Error {}

    enum Fail: BusOperation {
        typealias Request = Empty
        typealias Reply = Empty
        static let service = "failing"
        static let name = "fail"
        static let access = Access.public
    }

    final class Failing: BusService {
        let name = "failing"
        let error: any Error
        init(_ error: any Error) { self.error = error }
        func register(_ handlers: inout OperationHandlers) {
            handlers.on(Fail.self) { [error] _, _ in throw error }
        }
    }

    @Test func aFailureThatNamesItsCanopyErrorIsAnsweredAsThatAndAnyOtherAsInternal() async throws {
        for (error, code) in [(Unavailable() as any Error, CanopyError.Code.busy), (Broken(), .internal)] {
            let bus = InProcessBus(erasureWindow: .seconds(600))
            bus.register(Failing(error))
            let answered = await #expect(throws: CanopyError.self) { try await bus.call(Fail.self, Empty()) }
            #expect(answered?.code == code)
        }
    }
}
