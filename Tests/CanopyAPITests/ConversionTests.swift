import CanopyMessages
import Testing

@testable import CanopyAPI

/// The API document's enums and the bus messages' spell the same cases, so converting between
/// them never fails.
struct ConversionTests {
    func same<A: CaseIterable & RawRepresentable, B: CaseIterable & RawRepresentable>(_ a: A.Type, _ b: B.Type) -> Bool
    where A.RawValue == String, B.RawValue == String {
        Set(A.allCases.map(\.rawValue)) == Set(B.allCases.map(\.rawValue))
    }

    @Test func everyEnumOfTheDocumentHasTheMessagesCases() {
        #expect(same(Components.Schemas.Light.self, Care.Light.self))
        #expect(same(Components.Schemas.WateringFrequency.self, Care.WateringFrequency.self))
        #expect(same(Components.Schemas.Source.self, Care.Source.self))
        #expect(same(Components.Schemas.SortKey.self, Care.SortKey.self))
        #expect(same(Components.Schemas.TaskKind.self, Care.TaskKind.self))
        #expect(same(Components.Schemas.Channel.self, Reminders.Channel.self))
        #expect(same(Components.Schemas.ReminderState.self, Reminders.State.self))
        #expect(same(Components.Schemas.Variant.self, Images.Variant.self))
        #expect(same(Components.Schemas.Organ.self, Identification.Organ.self))
        #expect(same(Components.Schemas.Provider.self, Identification.Provider.self))
    }
}
