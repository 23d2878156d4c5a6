import CanopyMessages
import Foundation

// The API's types (generated from docs/openapi.yaml) and the bus's (CanopyMessages) carry the
// same fields under the same names; these are the conversions between them.

/// An enum of one side as the other's, by its raw value (both spell the cases alike; a test
/// checks every case of every pair).
func convert<From: RawRepresentable, To: RawRepresentable>(_ value: From) throws -> To where From.RawValue == String, To.RawValue == String {
    guard let converted = To(rawValue: value.rawValue) else {
        throw CanopyError(.internal, "'\(value.rawValue)' has no \(To.self); the API document and the messages differ")
    }
    return converted
}

extension Components.Schemas.Plant {
    init(_ plant: Care.Plant) throws {
        self.init(
            id: plant.id, scientificName: plant.scientificName, commonNames: plant.commonNames, family: plant.family, genus: plant.genus,
            customName: plant.customName, location: plant.location, notes: plant.notes, favourite: plant.favourite,
            imageIDs: plant.imageIDs, identificationSource: try convert(plant.identificationSource),
            identificationConfidence: plant.identificationConfidence, dateIdentified: plant.dateIdentified, dateAdded: plant.dateAdded,
            profile: try plant.profile.map(Components.Schemas.Profile.init), profileOverridden: plant.profileOverridden,
            version: plant.version)
    }
}

extension Care.Plant {
    /// The plant an app sent, under `id` (empty: canopy-care chooses one).
    init(_ input: Components.Schemas.PlantInput, id: String) throws {
        self.init(
            id: id, scientificName: input.scientificName, commonNames: input.commonNames ?? [], family: input.family ?? "",
            genus: input.genus ?? "", customName: input.customName, location: input.location, notes: input.notes,
            favourite: input.favourite ?? false, imageIDs: input.imageIDs ?? [],
            identificationSource: try input.identificationSource.map { try convert($0) } ?? .manual,
            identificationConfidence: input.identificationConfidence, dateIdentified: input.dateIdentified,
            profile: try input.profile.map(Care.Profile.init))
    }
}

extension Components.Schemas.Profile {
    init(_ profile: Care.Profile) throws {
        self.init(
            light: try convert(profile.light), wateringIntervalDays: profile.wateringIntervalDays, wateringAmount: profile.wateringAmount,
            temperatureMinimumC: profile.temperatureMinimumC, temperatureMaximumC: profile.temperatureMaximumC,
            temperatureOptimumC: profile.temperatureOptimumC,
            humidity: try convert(Humidity(rawValue: profile.humidity) ?? .medium),
            fertilizerIntervalDays: profile.fertilizerIntervalDays, fertilizerType: profile.fertilizerType,
            dormancyMonths: profile.dormancyMonths, toxicToPets: profile.toxicToPets, mistIntervalDays: profile.mistIntervalDays,
            repotIntervalMonths: profile.repotIntervalMonths, prune: profile.prune)
    }

    /// canopy-care keeps humidity as text, always one of these.
    private enum Humidity: String { case low, medium, high }
}

extension Care.Profile {
    init(_ profile: Components.Schemas.Profile) throws {
        self.init(
            light: try convert(profile.light), wateringIntervalDays: profile.wateringIntervalDays, wateringAmount: profile.wateringAmount,
            temperatureMinimumC: profile.temperatureMinimumC, temperatureMaximumC: profile.temperatureMaximumC,
            temperatureOptimumC: profile.temperatureOptimumC, humidity: profile.humidity.rawValue,
            fertilizerIntervalDays: profile.fertilizerIntervalDays, fertilizerType: profile.fertilizerType,
            dormancyMonths: profile.dormancyMonths, toxicToPets: profile.toxicToPets, mistIntervalDays: profile.mistIntervalDays,
            repotIntervalMonths: profile.repotIntervalMonths, prune: profile.prune)
    }
}

extension Components.Schemas.Task {
    init(_ task: Care.Task) throws {
        self.init(id: task.id, plantID: task.plantID, kind: try convert(task.kind), title: task.title, due: task.due, snoozedUntil: task.snoozedUntil)
    }
}

/// A plant's version as HTTP has it: the `ETag` every read and write answers, and the
/// `If-Match` a write is made against.
enum PlantVersion {
    /// `"3"`: strong, as a version names one state of the plant exactly.
    static func entityTag(_ plant: Care.Plant) -> String {
        "\"\(plant.version ?? 1)\""
    }

    /// The version `If-Match` names, or nil for `*` (any). A weak tag, a list or anything
    /// else matches no version of a plant: 412, as HTTP says (strong comparison).
    static func expected(_ ifMatch: String) throws -> Int? {
        let value = ifMatch.trimmingCharacters(in: .whitespaces)
        if value == "*" { return nil }
        guard value.count >= 3, value.first == "\"", value.last == "\"", let version = Int(value.dropFirst().dropLast()), version >= 1 else {
            throw CanopyError(.stale, "If-Match \(value.prefix(40)) names no version of this plant; give the ETag a read answered, such as \"3\"")
        }
        return version
    }
}
