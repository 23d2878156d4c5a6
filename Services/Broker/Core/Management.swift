import CanopyMessages
import CanopyWire

extension BrokerState {
    /// The broker's own operations (`broker.*`), read from a request: who may call each, and
    /// what a call asks, before the router carries it out. Pure: the same request is read the
    /// same way whatever the broker holds.
    enum Management {
        /// What a call of the broker's own operations asks.
        enum Call: Equatable {
            case services
            case stats
            case captureStart(Broker.CaptureStart.Request)
            case captureStop
            case captureRelease(snapshot: String?)
            case captureStatus
            case hold(Duration)
        }

        /// Who may call each operation (their types declare it).
        static let access: [String: Access] = [
            Broker.Services.name: Broker.Services.access, Broker.Stats.name: Broker.Stats.access, Broker.CaptureStart.name: Broker.CaptureStart.access,
            Broker.CaptureStop.name: Broker.CaptureStop.access, Broker.CaptureStatusOperation.name: Broker.CaptureStatusOperation.access,
            Broker.CaptureRelease.name: Broker.CaptureRelease.access, Broker.Hold.name: Broker.Hold.access,
        ]

        /// The call `operation` with `body` makes, or what its caller is answered instead: the
        /// operation's refusal of this caller, or a `badRequest` naming what it takes.
        static func read(_ operation: String, body: [UInt8], header: RequestHeader, codec: MessageCodec) -> Result<Call, CanopyError> {
            if let refusal = access[operation]?.refusal(principal: header.principal, byService: header.flags & RequestHeader.Flag.derived != 0) {
                return .failure(refusal)
            }
            switch operation {
            case Broker.Services.name: return .success(.services)
            case Broker.Stats.name: return .success(.stats)
            case Broker.CaptureStop.name: return .success(.captureStop)
            case Broker.CaptureStatusOperation.name: return .success(.captureStatus)
            case Broker.CaptureStart.name:
                guard let request = try? codec.decode(Broker.CaptureStart.Request.self, from: body) else {
                    return .failure(CanopyError(.badRequest, "capture.start takes {\"name\", \"pseudonymize\", \"withoutAttachments\"}"))
                }
                return .success(.captureStart(request))
            case Broker.CaptureRelease.name:
                guard let request = try? codec.decode(Broker.CaptureRelease.Request.self, from: body) else {
                    return .failure(CanopyError(.badRequest, "capture.release takes {\"snapshot\"}"))
                }
                return .success(.captureRelease(snapshot: request.snapshot))
            case Broker.Hold.name:
                guard let request = try? codec.decode(Broker.Hold.Request.self, from: body),
                    (1...Int(BrokerState.maximumHold.wholeMilliseconds)).contains(request.holdMilliseconds)
                else {
                    return .failure(CanopyError(.badRequest, "hold takes {\"holdMilliseconds\"}, 1 to \(BrokerState.maximumHold.wholeMilliseconds)"))
                }
                return .success(.hold(.milliseconds(request.holdMilliseconds)))
            default:
                return .failure(
                    CanopyError(
                        .badRequest,
                        "the broker has no operation '\(operation)'; it has: services, stats, hold, capture.start, capture.release, capture.stop, capture.status"
                    ))
            }
        }
    }
}
