import CanopyMessages
import CanopyWire

extension BrokerState {
    /// Majordomo (7/MDP v0.1) peers in Canopy's terms, both ways: a Majordomo client's request
    /// as an ``Intake`` any worker can serve, a Majordomo worker's READY as a registration, a
    /// flight as a Majordomo REQUEST, an answer as a Majordomo client's reply frames. Pure: no
    /// state of its own; the router routes what it makes.
    enum MajordomoBridge {
        /// What a Majordomo client's request becomes.
        enum ClientRequest {
            /// A request the router admits as any other.
            case intake(Intake)
            /// Answered at once with these body frames: `mmi.*`, or (`refused`) a request a
            /// Canopy service cannot read.
            case answer([[UInt8]], refused: Bool)
        }

        /// Reads a Majordomo client's request for `service` (`dialect`: the protocol of the
        /// service's workers, `hasWorkers`: whether it has any, by name).
        static func clientRequest(
            service serviceFrame: [UInt8], body: [[UInt8]], from client: [UInt8], dialect: (String) -> Dialect?,
            hasWorkers: (String) -> Bool, codec: MessageCodec
        ) -> ClientRequest {
            let name = String(decoding: serviceFrame, as: UTF8.self)
            if name.hasPrefix(Majordomo.managementPrefix) {
                guard name == Majordomo.serviceQuery else { return .answer([Array("501".utf8)], refused: false) }
                let asked = body.first.map { String(decoding: $0, as: UTF8.self) } ?? ""
                return .answer([Array((hasWorkers(asked) ? "200" : "404").utf8)], refused: false)
            }
            if dialect(name) == .majordomo {
                // Majordomo to Majordomo: the body passes untouched.
                return .intake(
                    Intake(
                        client: client, correlation: [], dialect: .majordomo, serviceName: name, operation: "",
                        header: RequestHeader(timeoutMilliseconds: 0), payload: Payload(frames: body)))
            }
            guard body.count >= 2, body.count - 2 <= Wire.maximumAttachments, Wire.isValidName(body[0]) else {
                let error = CanopyError(
                    .badRequest,
                    "a Majordomo request to a Canopy service has the operation and the JSON body as its body frames, then up to \(Wire.maximumAttachments) attachments"
                )
                return .answer(errorBody(error, codec: codec), refused: true)
            }
            return .intake(
                Intake(
                    client: client, correlation: [], dialect: .majordomo, serviceName: name,
                    operation: String(decoding: body[0], as: UTF8.self), header: RequestHeader(timeoutMilliseconds: 0),
                    payload: Payload(frames: Array(body[1...]))))
        }

        /// The body frames a Majordomo client is answered with: a Majordomo worker's reply as it
        /// came, a Canopy worker's behind an `ok` status frame, an error behind `error`.
        static func answerBody(_ outcome: Outcome, codec: MessageCodec) -> [[UInt8]] {
            switch outcome {
            case .reply(let payload, let fromMajordomo): fromMajordomo ? payload.frames : [Majordomo.ok] + payload.frames
            case .failure(let error): errorBody(error, codec: codec)
            }
        }

        static func errorBody(_ error: CanopyError, codec: MessageCodec) -> [[UInt8]] {
            [Majordomo.error, (try? codec.encode(error)) ?? []]
        }

        /// What a Majordomo worker's operations count as (it declares none and takes any):
        /// coalesced only for services the operator named (`--majordomo-coalesce`).
        static func workerDescriptor(coalesced: Bool) -> OperationDescriptor {
            OperationDescriptor(name: "*", idempotent: coalesced, coalescable: coalesced)
        }

        /// A flight for a Majordomo worker: the flight id stands in the client address, and the
        /// worker sends it back with its reply.
        static func request(for flight: borrowing Flight, id: SlabHandle) -> MajordomoMessage {
            let body = flight.operation.isEmpty ? flight.payload.frames : [Array(flight.operation.utf8)] + flight.payload.frames
            return .request(client: Wire.frame(id.raw), body: body)
        }
    }
}
