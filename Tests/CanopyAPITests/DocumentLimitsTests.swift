import CanopyMessages
import Foundation
import Testing
import Yams

/// Every limit the API document states is the limit the code checks: each field's `maxLength`,
/// `maxItems` and range in docs/openapi.yaml against the constant its validation uses, so the
/// two cannot drift apart (they did: identification ids were 128 bytes in the code, 200 in
/// the document).
struct DocumentLimitsTests {
    /// The document, read as it is now.
    static func document() -> [String: Any] {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../Services/API/Core/openapi.yaml")
        guard let text = try? String(contentsOf: url, encoding: .utf8), let loaded = try? Yams.load(yaml: text) as? [String: Any] else { return [:] }
        return loaded
    }

    /// A value at a path of keys in the document.
    static func value(_ path: String) -> Any? {
        var node: Any? = document()
        for key in path.split(separator: ".") {
            node = (node as? [String: Any])?[String(key)]
        }
        return node
    }

    static let schemas = "components.schemas"

    @Test(arguments: [
        ("\(schemas).Identifier.maxLength", Care.Limits.idBytes),
        ("\(schemas).Identifier.maxLength", Identification.Limits.idBytes),
        ("\(schemas).Identifier.maxLength", Reminders.Limits.idBytes),
        ("\(schemas).PlantInput.properties.scientificName.maxLength", Care.Limits.scientificNameBytes),
        ("\(schemas).PlantInput.properties.commonNames.maxItems", Care.Limits.commonNames),
        ("\(schemas).PlantInput.properties.commonNames.items.maxLength", Care.Limits.nameBytes),
        ("\(schemas).PlantInput.properties.family.maxLength", Care.Limits.nameBytes),
        ("\(schemas).PlantInput.properties.genus.maxLength", Care.Limits.nameBytes),
        ("\(schemas).PlantInput.properties.customName.maxLength", Care.Limits.nameBytes),
        ("\(schemas).PlantInput.properties.location.maxLength", Care.Limits.locationBytes),
        ("\(schemas).PlantInput.properties.notes.maxLength", Care.Limits.notesBytes),
        ("\(schemas).PlantInput.properties.imageIDs.maxItems", Care.Limits.imageIDs),
        ("\(schemas).Preferences.properties.timeZone.maxLength", Care.Limits.timeZoneBytes),
        ("\(schemas).DeviceInput.properties.address.maxLength", Reminders.Limits.addressBytes),
        ("\(schemas).DeviceInput.properties.name.maxLength", Reminders.Limits.nameBytes),
        ("\(schemas).DeviceInput.properties.secret.maxLength", Reminders.Limits.secretBytes),
        ("\(schemas).DeviceInput.properties.accessToken.maxLength", Reminders.Limits.secretBytes),
    ])
    func theDocumentStatesTheLimitTheCodeChecks(path: String, limit: Int) {
        #expect(Self.value(path) as? Int == limit, "\(path) is \(String(describing: Self.value(path))) in docs/openapi.yaml; the code checks \(limit)")
    }

    @Test func anIdentificationIdAtTheDocumentsLimitIsTakenAndOneByteMoreIsRefusedNamingIt() throws {
        let limit = try #require(Self.value("\(Self.schemas).Identifier.maxLength") as? Int)
        try Identification.Get.Request(id: String(repeating: "a", count: limit)).validate()
        #expect { try Identification.Get.Request(id: String(repeating: "a", count: limit + 1)).validate() } throws: { error in
            (error as? CanopyError)?.field == "id"
        }
    }
}
