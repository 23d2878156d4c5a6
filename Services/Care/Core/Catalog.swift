import CanopyMessages
import Foundation

/// The species care catalog shipped with canopy-care (`Resources/catalog.json`, with its
/// sources). Loaded once; read-only and thread-safe.
public struct Catalog: Sendable {
    /// The species, in file order.
    public let species: [Care.Species]
    /// Source keys to citations.
    public let sources: [String: String]
    private let byName: [String: Care.Species]
    private let byGenus: [String: Care.Species]

    private struct File: Decodable {
        var sources: [String: String]
        var species: [Care.Species]
    }

    /// The catalog shipped with the service.
    public static let shipped: Catalog = {
        guard let url = Bundle.module.url(forResource: "catalog", withExtension: "json"),
            let data = try? Data(contentsOf: url),
            let file = try? JSONDecoder().decode(File.self, from: data)
        else { preconditionFailure("canopy-care's catalog.json is missing or malformed; the build is broken") }
        return Catalog(species: file.species, sources: file.sources)
    }()

    /// A catalog file of the shipped one's shape (`Resources/catalog.json`: `sources` and
    /// `species`), used instead of it (`canopy-care serve --catalog FILE`: an operator's own
    /// species or intervals); a sentence when it cannot be read.
    public static func load(file: String) throws -> Catalog {
        guard let data = FileManager.default.contents(atPath: file) else {
            throw CanopyError(.badRequest, "cannot read the catalog \(file); give a readable JSON file shaped like canopy-care's Resources/catalog.json")
        }
        guard data.count <= 64 << 20 else { throw CanopyError(.tooLarge, "the catalog \(file) is over 64 MiB") }
        do {
            let file = try JSONDecoder().decode(File.self, from: data)
            guard !file.species.isEmpty else { throw CanopyError(.badRequest, "the catalog \(file) names no species") }
            return Catalog(species: file.species, sources: file.sources)
        } catch let error as CanopyError {
            throw error
        } catch {
            throw CanopyError(.badRequest, "the catalog \(file) is not a catalog (\(error)); it is shaped like canopy-care's Resources/catalog.json")
        }
    }

    init(species: [Care.Species], sources: [String: String]) {
        self.species = species
        self.sources = sources
        byName = Dictionary(species.map { ($0.scientificName.lowercased(), $0) }, uniquingKeysWith: { first, _ in first })
        byGenus = Dictionary(species.map { ($0.genus.lowercased(), $0) }, uniquingKeysWith: { first, _ in first })
    }

    /// The species by scientific name, or else the first of its genus.
    public func lookup(_ scientificName: String) -> Care.Species? {
        let name = scientificName.lowercased().trimmingCharacters(in: .whitespaces)
        if let exact = byName[name] { return exact }
        return name.split(separator: " ").first.flatMap { byGenus[String($0)] }
    }

    /// Species whose common names, scientific name or family contain `text`, ignoring case.
    public func search(_ text: String, limit: Int = 20) -> [Care.Species] {
        let needle = text.lowercased().trimmingCharacters(in: .whitespaces)
        guard !needle.isEmpty else { return Array(species.prefix(limit)) }
        return Array(
            species.filter { species in
                species.scientificName.lowercased().contains(needle) || species.family.lowercased().contains(needle)
                    || species.commonNames.contains { $0.lowercased().contains(needle) }
            }.prefix(limit))
    }
}
