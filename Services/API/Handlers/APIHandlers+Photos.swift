import CanopyMessages
import Foundation
import OpenAPIRuntime

// MARK: - Photos (canopy-images)

extension APIHandlers {
    /// The largest photo taken over HTTP (canopy-images takes up to 25 MiB).
    static let maximumPhotoBytes = 25 * 1_048_576
    /// How long a client may keep a variant: photos are content-addressed, so forever.
    static let variantCacheControl = "private, max-age=31536000, immutable"

    func listPlantPhotos(_ input: Operations.ListPlantPhotos.Input) async throws -> Operations.ListPlantPhotos.Output {
        let photos = try await call(Images.List.self, .init(plantID: try RequestFieldError.identifier(input.path.plantID, "plantID")))
        return .ok(.init(body: .json(.init(photos: photos.map(Components.Schemas.Photo.init)))))
    }

    func uploadPhoto(_ input: Operations.UploadPhoto.Input) async throws -> Operations.UploadPhoto.Output {
        let body: HTTPBody =
            switch input.body {
            case .jpeg(let body), .png(let body), .imageWebp(let body), .imageHeic(let body): body
            }
        let bytes: Data
        do {
            bytes = try await Data(collecting: body, upTo: Self.maximumPhotoBytes)
        } catch {
            throw CanopyError(.tooLarge, "a photo is at most \(Self.maximumPhotoBytes) bytes")
        }
        let plantID = try RequestFieldError.identifier(input.path.plantID, "plantID")
        // Photos belong to one of the caller's plants: another's, or none, is 404 and stores nothing.
        _ = try await call(Care.GetPlant.self, .init(id: plantID))
        let photo = try await call(Images.Put.self, .init(plantID: plantID, data: bytes))
        return .created(.init(body: .json(.init(photo))))
    }

    func getPhotoVariant(_ input: Operations.GetPhotoVariant.Input) async throws -> Operations.GetPhotoVariant.Output {
        // WebP only for a client that names it (without an Accept header the list is every type).
        let accept = input.headers.accept
        let webp = accept != .defaultValues() && accept.contains { $0.contentType == .imageWebp && $0.quality.doubleValue > 0 }
        switch try await variant(photoID: input.path.photoID, variant: input.path.variant.rawValue, webp: webp, ifNoneMatch: input.headers.ifNoneMatch) {
        case .notModified(let eTag):
            return .notModified(.init(headers: .init(eTag: eTag, cacheControl: Self.variantCacheControl)))
        case .bytes(let eTag, let bytes, let webp):
            let headers = Operations.GetPhotoVariant.Output.Ok.Headers(eTag: eTag, cacheControl: Self.variantCacheControl, vary: "Accept")
            return .ok(.init(headers: headers, body: webp ? .imageWebp(HTTPBody(bytes)) : .jpeg(HTTPBody(bytes))))
        }
    }

    /// What `GET /v1/photos/{photoID}/variants/{variant}` answers.
    enum VariantAnswer: Sendable {
        case notModified(eTag: String)
        case bytes(eTag: String, Data, webp: Bool)
    }

    /// A variant for the caller, as `GET /v1/photos/{photoID}/variants/{variant}` answers it:
    /// the generated route and the edge's direct one (``VariantRoute``) both come here.
    func variant(photoID: String, variant name: String, webp: Bool, ifNoneMatch: String?) async throws -> VariantAnswer {
        guard let variant = Images.Variant(rawValue: name) else {
            throw RequestFieldError(
                field: "variant", "variant is one of \(Images.Variant.allCases.map(\.rawValue).joined(separator: ", ")); got '\(name.prefix(40))'")
        }
        let format: Images.Format = webp ? .webp : .jpeg
        // The owner is checked by canopy-images even when the client has the bytes already:
        // a 304 for another person's photo would say it exists.
        var piece = try await firstPiece(.init(principal: try caller(), sha256: photoID, variant: variant, format: format))
        let eTag = "\"\(photoID)-\(variant.rawValue)-\(format.rawValue)\""
        if let ifNoneMatch, Self.matches(ifNoneMatch, eTag) { return .notModified(eTag: eTag) }
        var bytes = piece.data
        while let next = piece.nextOffset { // a full-size variant larger than one reply comes in pieces
            piece = try await call(Images.GetVariant.self, .init(sha256: photoID, variant: variant, format: format, offset: next))
            bytes.append(piece.data)
        }
        return .bytes(eTag: eTag, bytes, webp: webp)
    }

    /// A variant whole, or its first piece when it is too large for one reply: small variants
    /// through implicit batching when it is on, each alone otherwise (and the full size always).
    private func firstPiece(_ key: Images.GetVariants.Key) async throws -> Images.GetVariant.Reply {
        let alone = Images.GetVariant.Request(sha256: key.sha256, variant: key.variant, format: key.format)
        guard let lookups, key.variant != .full else { return try await call(Images.GetVariant.self, alone) }
        do {
            return try await lookups.variants.load(key)
        } catch let error as CanopyError where error.code == .tooLarge {
            return try await call(Images.GetVariant.self, alone) // did not fit in the batch's reply: in pieces
        }
    }

    /// Whether an `If-None-Match` list names `eTag` (`*`, or the same tag, weak or not, as
    /// RFC 9110 compares them for this header).
    static func matches(_ header: String, _ eTag: String) -> Bool {
        header.split(separator: ",").contains { candidate in
            let tag = candidate.trimmingCharacters(in: .whitespaces)
            return tag == "*" || (tag.hasPrefix("W/") ? String(tag.dropFirst(2)) : tag) == eTag
        }
    }

    func getPhotoPalette(_ input: Operations.GetPhotoPalette.Input) async throws -> Operations.GetPhotoPalette.Output {
        let palette = try await call(Images.Palette.self, .init(sha256: input.path.photoID))
        return .ok(
            .init(
                body: .json(
                    .init(
                        photoID: palette.sha256,
                        swatches: palette.swatches.map {
                            Components.Schemas.Swatch(role: $0.role, hex: $0.hex, population: $0.population, oklab: $0.oklab)
                        }))))
    }
}

extension Components.Schemas.Photo {
    init(_ photo: Images.Photo) {
        self.init(
            photoID: photo.sha256, plantID: photo.plantID, width: photo.width, height: photo.height, format: photo.format, bytes: photo.bytes,
            addedAt: photo.addedAt)
    }
}
