import CanopyMessages
import Foundation
import OpenAPIRuntime

// MARK: - Identifications (canopy-identify)

extension APIHandlers {
    func submitIdentification(_ input: Operations.SubmitIdentification.Input) async throws -> Operations.SubmitIdentification.Output {
        guard case .multipartForm(let form) = input.body else { throw CanopyError(.badRequest, "the body is multipart/form-data") }
        var photos: [Data] = []
        var organs: [Identification.Organ] = []
        var latitude: Double?, longitude: Double?
        var exactLocation = false
        /// A text part's value (they are small: an organ, a number).
        func text(_ body: HTTPBody, _ field: String) async throws -> String {
            do {
                return try await String(collecting: body, upTo: 64)
            } catch {
                throw RequestFieldError(field: field, "\(field) is at most 64 bytes")
            }
        }
        func number(_ body: HTTPBody, _ field: String, _ range: ClosedRange<Double>) async throws -> Double {
            guard let value = Double(try await text(body, field).trimmingCharacters(in: .whitespaces)), range.contains(value) else {
                throw RequestFieldError(field: field, "\(field) is a number from \(range.lowerBound) to \(range.upperBound)")
            }
            return value
        }
        do {
            for try await part in form { try await take(part) }
        } catch let error as RequestFieldError {
            throw error
        } catch let error as CanopyError {
            throw error
        } catch {
            // The form itself is not as the document says (a required part missing, a part
            // of a type it does not take): the runtime's words say which.
            throw CanopyError(.badRequest, "the form does not match the API document: \(String(describing: error).prefix(300))")
        }
        func take(_ part: Operations.SubmitIdentification.Input.Body.MultipartFormPayload) async throws {
            switch part {
            case .photo(let photo):
                guard photos.count < Identification.Limits.photos else {
                    throw RequestFieldError(field: "photo", "an identification takes 1 to \(Identification.Limits.photos) photos")
                }
                do {
                    photos.append(try await Data(collecting: photo.payload.body, upTo: Identification.Limits.photoBytes))
                } catch {
                    throw RequestFieldError(field: "photo", "a photo is at most \(Identification.Limits.photoBytes) bytes")
                }
            case .organ(let organ):
                let value = try await text(organ.payload.body, "organ")
                guard let parsed = Identification.Organ(rawValue: value), organs.count < Identification.Limits.photos else {
                    throw RequestFieldError(field: "organ", "an organ is leaf, flower, fruit, bark or auto, one per photo")
                }
                organs.append(parsed)
            case .latitude(let part): latitude = try await number(part.payload.body, "latitude", -90...90)
            case .longitude(let part): longitude = try await number(part.payload.body, "longitude", -180...180)
            case .exactLocation(let part): exactLocation = try await text(part.payload.body, "exactLocation") == "true"
            }
        }
        guard !photos.isEmpty else { throw RequestFieldError(field: "photo", "an identification takes 1 to \(Identification.Limits.photos) photos") }
        guard organs.count <= photos.count else { throw RequestFieldError(field: "organ", "one organ per photo at most") }
        guard (latitude == nil) == (longitude == nil) else {
            throw RequestFieldError(field: latitude == nil ? "latitude" : "longitude", "a location is a latitude and a longitude")
        }
        let inputs = photos.indices.map { Identification.PhotoInput(organ: $0 < organs.count ? organs[$0] : .auto) }
        let location = latitude.flatMap { latitude in longitude.map { Identification.Location(latitude: latitude, longitude: $0) } }
        let record = try await call(Identification.Submit.self, .init(photos: inputs, data: photos, location: location, exactLocation: exactLocation))
        return .ok(.init(body: .json(try .init(record))))
    }

    func listIdentifications(_ input: Operations.ListIdentifications.Input) async throws -> Operations.ListIdentifications.Output {
        let page = try await call(Identification.History.self, .init(plantID: input.query.plantID, limit: input.query.limit ?? 20, after: input.query.after))
        return .ok(.init(body: .json(.init(identifications: try page.items.map(Components.Schemas.Identification.init), next: page.next))))
    }

    func getIdentification(_ input: Operations.GetIdentification.Input) async throws -> Operations.GetIdentification.Output {
        .ok(
            .init(
                body: .json(
                    try .init(
                        try await call(Identification.Get.self, .init(id: try RequestFieldError.identifier(input.path.identificationID, "identificationID"))))))
        )
    }

    func acceptIdentification(_ input: Operations.AcceptIdentification.Input) async throws -> Operations.AcceptIdentification.Output {
        guard case .json(let body) = input.body else { throw CanopyError(.badRequest, "the body is JSON") }
        let reply = try await call(
            Identification.Accept.self,
            .init(
                id: try RequestFieldError.identifier(input.path.identificationID, "identificationID"), rank: body.rank, scientificName: body.scientificName,
                customName: body.customName))
        return .ok(.init(body: .json(.init(identification: try .init(reply.identification), plant: try .init(reply.plant)))))
    }
}

extension Components.Schemas.Identification {
    init(_ record: Identification.Record) throws {
        self.init(
            id: record.id, createdAt: record.createdAt, provider: try convert(record.provider), organs: try record.organs.map { try convert($0) },
            photoIDs: record.photoIDs, latitude: record.location?.latitude, longitude: record.location?.longitude,
            exactLocation: record.exactLocation, results: try record.results.map(Components.Schemas.Candidate.init), plantID: record.plantID,
            acceptedAt: record.acceptedAt, acceptedName: record.acceptedName)
    }
}

extension Components.Schemas.Candidate {
    init(_ candidate: Identification.Candidate) throws {
        self.init(
            rank: candidate.rank, score: candidate.score, scientificName: candidate.scientificName,
            scientificNameWithoutAuthor: candidate.scientificNameWithoutAuthor, authorship: candidate.authorship,
            commonNames: candidate.commonNames, genus: candidate.genus, family: candidate.family, gbifID: candidate.gbifID,
            plantID: candidate.plantID, provider: try convert(candidate.provider))
    }
}
