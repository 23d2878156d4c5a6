import CanopyCapture
import CanopyMessages
import CanopyWire

// What the broker hands the capture (``BrokerState/Directive/capture(_:)``): requests,
// answers and the mark of a snapshot's cut, as records without their time (the shell stamps
// it) or pseudonyms (the writer adds them).

extension BrokerState {
    /// A request as the capture records it (time and pseudonyms are added later).
    func capturedRequest(_ intake: Intake) -> CaptureEvent {
        CaptureEvent(
            record: CaptureRecord(
                kind: .request, flags: intake.dialect == .majordomo ? .majordomo : [], time: 0, client: "", service: intake.serviceName,
                operation: intake.operation, correlation: intake.correlation, header: intake.header, body: intake.payload.first,
                attachments: intake.payload.rest), clientIdentity: intake.client)
    }

    /// An answer as the capture records it: the worker's reply, or the error the client got.
    func capturedAnswer(
        _ outcome: Outcome, client: [UInt8], correlation: [UInt8], dialect: Dialect, service: String, operation: String,
        header: RequestHeader?, worker: [UInt8], shared: Bool, latency: Duration
    ) -> CaptureEvent {
        var flags: CaptureRecord.Flags = dialect == .majordomo ? .majordomo : []
        if shared { flags.insert(.shared) }
        let body: [UInt8], attachments: [[UInt8]]
        switch outcome {
        case .reply(let payload, _):
            (body, attachments) = (payload.first, payload.rest)
        case .failure(let error):
            flags.insert(.failed)
            (body, attachments) = ((try? codec.encode(error)) ?? [], [])
        }
        return CaptureEvent(
            record: CaptureRecord(
                kind: .reply, flags: flags, time: 0, latencyNanoseconds: UInt64(max(0, latency.nanoseconds)), client: "", service: service,
                operation: operation, correlation: correlation, header: header ?? RequestHeader(timeoutMilliseconds: 0), body: body,
                attachments: attachments), clientIdentity: client, workerIdentity: worker)
    }

    /// The mark record: the snapshot is consistent with the capture up to here (every request
    /// recorded after it came after the cut).
    func capturedMark(snapshot: String?, held: Int) -> CaptureEvent {
        let body = (try? codec.encode(CaptureMark(snapshot: snapshot, held: held))) ?? []
        return CaptureEvent(
            record: CaptureRecord(
                kind: .mark, time: 0, client: "", service: Broker.service, operation: "mark", correlation: [],
                header: RequestHeader(timeoutMilliseconds: 0), body: body), clientIdentity: [])
    }
}
