import CanopyMessages
import Foundation

/// What canopy-images keeps, as the operations its rules need: the originals (bytes,
/// content-addressed by their SHA-256) and the index of who holds which for which plant, with
/// computed palettes. No SQL and no file handling outside the type that implements this
/// (``SQLiteImageStore``: files on disk and SQLite), so a second store is one more file. Every
/// operation is a transaction of its own; every one on a person's photos names the owner.
protocol ImageStoring: Sendable {
    /// Clears what an erasure (a person's account deleted) left beyond its deleted rows: the
    /// write-ahead log's copies of them (SQLite, at once), the dead rows (PostgreSQL, a
    /// `VACUUM` soon after).
    func eraseResidue()

    /// Whether each call waits for a network round trip (PostgreSQL): callers on Swift's
    /// cooperative pool then make it from a Dispatch thread (``ImageLibrary/stored(_:)``);
    /// SQLite answers in microseconds and is called in place.
    var isRemote: Bool { get }

    // MARK: Originals

    /// Whether the original is stored (for anyone).
    func hasOriginal(_ sha256: String) throws -> Bool
    /// The format the original is stored in and its size, or nil when it is not stored.
    func originalSize(_ sha256: String) throws -> (format: Images.Format, width: Int, height: Int)?
    /// The stored (normalized) original's bytes.
    func original(_ sha256: String) throws -> [UInt8]
    /// Originals stored, and their bytes.
    func originalTotals() throws -> (count: Int, bytes: Int)
    /// Throws with a sentence unless new originals can be written (for `/health`).
    func checkOriginalsWritable() throws

    // MARK: Photos, each a person's

    /// Records `sha256` as `owner`'s photo of `plantID`, writing the original first when it
    /// is new (`normalized` makes its bytes and size, and runs only then). Returns the photo
    /// as its owner sees it.
    func add(
        sha256: String, owner: String, plantID: String, format: String,
        normalized: () throws -> (bytes: [UInt8], width: Int, height: Int), now: Date
    ) throws -> Images.Photo
    /// Whether `owner` holds the photo (for any plant): the check before anything is served.
    func owns(_ owner: String, _ sha256: String) throws -> Bool
    /// How many photos a person keeps, and the bytes of their originals.
    func usage(owner: String) throws -> (photos: Int, bytes: Int)
    /// Every plant id `owner` keeps photos under.
    func plantIDs(owner: String) throws -> [String]
    /// `owner`'s photos of `plantID`, newest first.
    func photos(owner: String, plantID: String) throws -> [Images.Photo]
    /// Forgets `owner`'s photos of `plantID` (only `sha256` when given); originals nobody
    /// else holds go too. Returns how many photos were forgotten and which originals are gone.
    func purge(owner: String, plantID: String, sha256: String?) throws -> (photos: Int, deleted: [String])

    // MARK: Palettes

    /// A cached palette younger than `maximumAge`.
    func palette(_ sha256: String, maximumAge: TimeInterval, now: Date) throws -> [Images.Swatch]?
    func savePalette(_ swatches: [Images.Swatch], for sha256: String, now: Date) throws
    func paletteCount() throws -> Int
}
