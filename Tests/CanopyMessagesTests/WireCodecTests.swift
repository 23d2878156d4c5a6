import CanopyBus
import CanopyMessages
import CanopyTesting
import Foundation
import Testing

/// The typed frame codec: every canopy/4 and Majordomo command round-trips, golden frames pin
/// the bytes, and random or half-valid frames are refused with a typed error, never a crash.
struct WireCodecTests {
    /// One sample of every canopy/4 command, named as in the golden file.
    static let samples: [(String, WireMessage)] = {
        let header = RequestHeader(timeoutMilliseconds: 2_500, flags: RequestHeader.Flag.idempotent, principal: "user-42")
        let body = Array(#"{"id":"p1"}"#.utf8)
        // The W3C specification's example trace context.
        var traced = header
        traced.trace = TraceContext(traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        return [
            ("request", .request(WireRequest(correlation: Wire.frame(UInt64(7)), service: "care", operation: "plants.get", header: header, body: body))),
            ("cancel", .cancel(correlation: Wire.frame(UInt64(7)))),
            ("reply", .reply(correlation: Wire.frame(UInt64(7)), shared: true, body: body)),
            ("error", .error(correlation: Wire.frame(UInt64(7)), error: Array(#"{"code":"busy","message":"retry"}"#.utf8))),
            ("ready", .ready(service: "care", operations: [OperationDescriptor(name: "plants.get", idempotent: true, coalescable: true)], credit: 8)),
            ("workerReply", .workerReply(requestID: 42, failed: false, body: body, attachments: [[0xFF, 0xD8, 0xFF]])),
            ("workerHeartbeat", .workerHeartbeat),
            ("workerDisconnect", .workerDisconnect),
            ("drain", .drain),
            ("credit", .credit(3)),
            (
                "workerReplyBatch",
                .workerReplyBatch([
                    .init(requestID: 42, failed: false, body: body),
                    .init(requestID: 43, failed: true, body: Array(#"{"code":"busy","message":"retry"}"#.utf8)),
                ])
            ),
            ("dispatch", .dispatch(requestID: 42, operation: "plants.get", header: traced, body: body)),
            ("cancelDispatch", .cancelDispatch(requestID: 42)),
            ("brokerHeartbeat", .brokerHeartbeat(maximumFrameBytes: 16_777_216)),
            ("brokerDisconnect", .brokerDisconnect(reason: "broker shutting down")),
            (
                "dispatchBatch",
                .dispatchBatch([
                    .init(requestID: 42, operation: "plants.get", header: header, body: body),
                    .init(requestID: 43, operation: "plants.list", header: header, body: Array("{}".utf8)),
                ])
            ),
        ]
    }()

    func golden() throws -> [String: [String]] {
        let url = try #require(Bundle.module.url(forResource: "Fixtures/wire-messages", withExtension: "json"))
        return try JSONDecoder().decode([String: [String]].self, from: Data(contentsOf: url))
    }

    @Test func everyCommandHasPinnedFramesAndDecodesBackToItself() throws {
        let golden = try golden()
        #expect(Set(golden.keys) == Set(Self.samples.map(\.0)), "one golden entry per command")
        for (name, message) in Self.samples {
            #expect(message.encoded.map(\.hex) == golden[name], "\(name)")
            #expect(try WireMessage(frames: message.encoded) == message, "\(name)")
        }
        #expect(Set(Self.samples.map(\.1.command.rawValue)).count == 16, "every command byte has a sample")
    }

    /// Records what a writer is given: each frame's bytes and whether more follow.
    struct RecordingWriter: FrameWriter {
        var frames: [(bytes: [UInt8], more: Bool)] = []
        mutating func write(_ frame: [UInt8], more: Bool) { frames.append((frame, more)) }
        mutating func write(bytes: UnsafeRawBufferPointer, more: Bool) { frames.append((Array(bytes), more)) }
    }

    @Test func writingFrameByFrameGivesTheGoldenFramesAndEndsOnTheLast() throws {
        let golden = try golden()
        var samples = Self.samples
        samples.append(("with attachments", .reply(correlation: [1], shared: false, body: [2], attachments: [[3], [], [4, 5]])))
        samples.append(
            (
                "without principal",
                .request(WireRequest(correlation: [1], service: "a", operation: "b", header: RequestHeader(timeoutMilliseconds: 0), body: []))
            ))
        for (name, message) in samples {
            var writer = RecordingWriter()
            message.write(into: &writer)
            #expect(writer.frames.map(\.bytes) == message.encoded, "\(name)")
            if let expected = golden[name] { #expect(writer.frames.map(\.bytes.hex) == expected, "\(name)") }
            #expect(
                writer.frames.map(\.more) == Array(repeating: true, count: writer.frames.count - 1) + [false], "\(name): only the last frame ends the message")
        }
    }

    @Test func majordomoMessagesRoundTrip() throws {
        let messages: [MajordomoMessage] = [
            .client(service: Array("echo".utf8), body: [Array("hello".utf8), []]),
            .ready(service: Array("echo".utf8)),
            .request(client: Wire.frame(UInt64(9)), body: [Array("hello".utf8)]),
            .reply(client: Wire.frame(UInt64(9)), body: [Array("hello".utf8), Array("world".utf8)]),
            .heartbeat,
            .disconnect,
        ]
        for message in messages {
            #expect(try MajordomoMessage(frames: message.encoded) == message)
        }
        #expect(MajordomoMessage.ready(service: Array("echo".utf8)).encoded == [[], Array("MDPW01".utf8), [0x01], Array("echo".utf8)])
    }

    @Test func malformedFramesAreRefusedNamingWhatIsWrong() throws {
        func reason(_ frames: [[UInt8]]) -> WireDecodingError.Reason? {
            do {
                _ = try WireMessage(frames: frames)
                return nil
            } catch {
                return error.reason
            }
        }
        let request = Self.samples[0].1.encoded
        #expect(reason([Array("canopy/1".utf8), [0x01]]) == .wrongVersion)
        #expect(reason([Wire.version, [0x7F]]) == .unknownCommand)
        #expect(reason(Array(request.prefix(6))) == .wrongFrameCount)
        #expect(reason(request + Array(repeating: [0x01], count: Wire.maximumAttachments)) == nil, "up to 64 attachments")
        #expect(reason(request + Array(repeating: [0x01], count: Wire.maximumAttachments + 1)) == .wrongFrameCount)
        #expect(reason(Self.samples[1].1.encoded + [[0x01]]) == .wrongFrameCount, "a cancel takes no attachments")
        // Batches: whole groups, 1 to 31 of them, each field checked as in its single message.
        let replies = try #require(Self.samples.first { $0.0 == "workerReplyBatch" }?.1.encoded)
        let dispatches = try #require(Self.samples.first { $0.0 == "dispatchBatch" }?.1.encoded)
        #expect(reason(Array(replies.prefix(2))) == .wrongFrameCount, "a batch holds at least one")
        for empty in [WireMessage.workerReplyBatch([]), .dispatchBatch([])] {
            var writer = RecordingWriter()
            empty.write(into: &writer)
            #expect(writer.frames.last?.more == false, "an empty batch ends at its command, never left open")
            #expect(reason(empty.encoded) == .wrongFrameCount)
        }
        #expect(reason(replies + [[0x01]]) == .wrongFrameCount, "no attachments, no part of a reply")
        #expect(reason(Array(dispatches.prefix(5))) == .wrongFrameCount)
        let most = Array(replies.prefix(2)) + Array(repeating: Array(replies[2...4]), count: Wire.maximumBatch).flatMap { $0 }
        #expect(reason(most) == nil, "31 replies in one message")
        #expect(reason(most + Array(replies[2...4])) == .wrongFrameCount, "32 are too many")
        var badStatus = replies
        badStatus[6] = [2]
        #expect(reason(badStatus) == .malformedInteger)
        var badID = dispatches
        badID[6] = [1, 2]
        #expect(reason(badID) == .malformedInteger)
        var badOperation = dispatches
        badOperation[7] = Array("Plants".utf8)
        #expect(reason(badOperation) == .invalidName)
        var badBatchHeader = dispatches
        badBatchHeader[8] = [0, 0]
        #expect(reason(badBatchHeader) == .malformedHeader)
        var badCorrelation = request
        badCorrelation[2] = []
        #expect(reason(badCorrelation) == .malformedCorrelation)
        var badName = request
        badName[3] = Array("Care".utf8)
        #expect(reason(badName) == .invalidName)
        var badHeader = request
        badHeader[5] = [0, 0, 0, 1, 0] + Array("jos\u{00E9}".utf8)
        #expect(reason(badHeader) == .malformedHeader)
        // A trace context its flags announce: cut short, with an all-zero id, or absent.
        let trace: [UInt8] = (1...16).map { UInt8($0) } + (1...8).map { UInt8($0) } + [1]
        let zeros8 = [UInt8](repeating: 0, count: 8), zeros16 = [UInt8](repeating: 0, count: 16)
        let contexts: [[UInt8]] = [Array(trace.prefix(10)), zeros16 + Array(trace.suffix(9)), Array(trace.prefix(16)) + zeros8 + [1], []]
        let user: [UInt8] = Array("user-1".utf8)
        for context in contexts {
            badHeader[5] = [0, 0, 0, 1, RequestHeader.Flag.traced] + context + user
            #expect(reason(badHeader) == .malformedHeader, "\(context.count) trace bytes")
        }
        badHeader[5] = [0, 0, 0, 1, RequestHeader.Flag.traced] + trace + user
        #expect(reason(badHeader) == nil, "a whole one is taken")
        #expect(RequestHeader(frame: badHeader[5])?.principal == "user-1" && RequestHeader(frame: badHeader[5])?.trace?.isSampled == true)
        #expect(TraceContext(traceparent: "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01") == nil, "upper case is not W3C's")
        #expect(TraceContext(traceparent: "00-00000000000000000000000000000000-b7ad6b7169203331-01") == nil)
        #expect(TraceContext(traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331") == nil)
        #expect(
            TraceContext(traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")?.traceparent
                == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        #expect(reason([Wire.version, Wire.Command.workerReply.frame, [1, 2], [0], []]) == .malformedInteger)
        #expect(reason([Wire.version, Wire.Command.workerReply.frame, Wire.frame(UInt64(1)), [7], []]) == .malformedInteger, "status is 0 or 1")
        #expect(reason([Wire.version, Wire.Command.ready.frame, Array("care".utf8), Array("[]".utf8), Wire.frame(UInt32(1))]) == .malformedOperations)

        // A refused request keeps its correlation, so the refusal answers the right call.
        do {
            _ = try WireMessage(frames: badName)
            Issue.record("a bad name was accepted")
        } catch {
            #expect(error.correlation == request[2])
            #expect(error.command == .request)
        }
    }

    @Test func randomAndHalfValidFramesNeverCrashAndWhatDecodesReencodesToTheSameMessage() throws {
        var random = SeededRandom(seed: 0xCA_40_B7)
        let pieces: [[UInt8]] = [
            Wire.version, Array("MDPC01".utf8), Array("MDPW01".utf8), [], [0], [1], Array("care".utf8), Array("plants.get".utf8),
            Wire.frame(UInt64(7)), Wire.frame(UInt32(8)), RequestHeader(timeoutMilliseconds: 10, principal: "p").frame,
            Array(#"[{"coalescable":false,"idempotent":true,"name":"echo"}]"#.utf8), Array("{}".utf8),
        ]
        var decoded = 0, refused = 0
        for _ in 0..<20_000 {
            var frames: [[UInt8]] = []
            let count = Int(random.next() % 9)
            for index in 0..<count {
                switch random.next() % 4 {
                case 0: frames.append((0..<Int(random.next() % 12)).map { _ in UInt8(truncatingIfNeeded: random.next()) })
                case 1 where index == 1: frames.append([UInt8(truncatingIfNeeded: random.next() % 0x30)]) // a command byte, often a real one
                default: frames.append(pieces[Int(random.next() % UInt64(pieces.count))])
                }
            }
            if random.next() % 3 == 0, !frames.isEmpty { frames[0] = Wire.version }
            if random.next() % 2 == 0 {
                // Half-valid: a real message with up to two mutations (none a fifth of the time).
                frames = Self.samples[Int(random.next() % UInt64(Self.samples.count))].1.encoded
                for _ in 0..<Int(random.next() % 3) where !frames.isEmpty {
                    let index = Int(random.next() % UInt64(frames.count))
                    switch random.next() % 4 {
                    case 0: frames.remove(at: index)
                    case 1: frames.append(pieces[Int(random.next() % UInt64(pieces.count))])
                    case 2: frames[index] = (0..<Int(random.next() % 10)).map { _ in UInt8(truncatingIfNeeded: random.next()) }
                    default: if !frames[index].isEmpty { frames[index][Int(random.next() % UInt64(frames[index].count))] ^= 0x20 }
                    }
                }
            }
            if MajordomoMessage.claims(frames) {
                if let message = try? MajordomoMessage(frames: frames) {
                    decoded += 1
                    #expect(try MajordomoMessage(frames: message.encoded) == message)
                } else {
                    refused += 1
                }
                continue
            }
            do {
                let message = try WireMessage(frames: frames)
                decoded += 1
                #expect(try WireMessage(frames: message.encoded) == message, "\(frames.map(\.hex))")
            } catch {
                refused += 1
                #expect(!error.description.isEmpty)
            }
        }
        #expect(decoded > 100 && refused > 100, "the generator reaches both sides: \(decoded) decoded, \(refused) refused")
    }

    @Test func randomValidMessagesRoundTrip() throws {
        var random = SeededRandom(seed: 42)
        func bytes(_ range: ClosedRange<Int>) -> [UInt8] {
            (0..<Int.random(in: range, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
        }
        func name() -> String {
            let alphabet = Array("abcdefghijklmnopqrstuvwxyz0123456789.-_")
            return String((0..<Int.random(in: 1...40, using: &random)).map { _ in alphabet.randomElement(using: &random)! })
        }
        func header() -> RequestHeader {
            let principal =
                Bool.random(using: &random)
                ? ""
                : String(
                    (0..<Int.random(in: 1...256, using: &random)).map { _ in
                        Character(Unicode.Scalar(UInt8.random(in: 0x21...0x7E, using: &random)))
                    })
            let trace =
                Bool.random(using: &random)
                ? nil
                : TraceContext(
                    traceHigh: random.next(), traceLow: random.next() | 1, spanID: random.next() | 1,
                    flags: UInt8.random(in: 0...255, using: &random))
            return RequestHeader(
                timeoutMilliseconds: UInt32.random(in: 0...UInt32.max, using: &random), flags: UInt8.random(in: 0...255, using: &random),
                principal: principal, trace: trace)
        }
        for _ in 0..<2_000 {
            let messages: [WireMessage] = [
                .request(
                    WireRequest(
                        correlation: bytes(1...64), service: name(), operation: name(), header: header(), body: bytes(0...200),
                        attachments: (0..<Int.random(in: 0...3, using: &random)).map { _ in bytes(0...100) })),
                .cancel(correlation: bytes(1...64)),
                .reply(
                    correlation: bytes(1...64), shared: Bool.random(using: &random), body: bytes(0...200),
                    attachments: (0..<Int.random(in: 0...3, using: &random)).map { _ in bytes(0...100) }),
                .error(correlation: bytes(0...64), error: bytes(0...100)),
                .ready(
                    service: name(),
                    operations: (0..<Int.random(in: 1...5, using: &random)).map { _ in
                        OperationDescriptor(name: name(), idempotent: Bool.random(using: &random), coalescable: Bool.random(using: &random))
                    }, credit: UInt32.random(in: 0...UInt32.max, using: &random)),
                .workerReply(
                    requestID: random.next(), failed: Bool.random(using: &random), body: bytes(0...200),
                    attachments: (0..<Int.random(in: 0...3, using: &random)).map { _ in bytes(0...100) }),
                .dispatch(
                    requestID: random.next(), operation: name(), header: header(), body: bytes(0...200),
                    attachments: (0..<Int.random(in: 0...3, using: &random)).map { _ in bytes(0...100) }),
                .cancelDispatch(requestID: random.next()),
                .brokerHeartbeat(maximumFrameBytes: random.next()),
                .brokerDisconnect(reason: name()),
            ]
            for message in messages {
                #expect(try WireMessage(frames: message.encoded) == message)
            }
        }
    }
}

extension [UInt8] {
    var hex: String { map { String(format: "%02x", $0) }.joined() }
}

/// Photo bytes travel as attachments beside the JSON body, and come back whole.
struct AttachmentPayloadTests {
    let codec = MessageCodec()

    @Test func aPhotoTravelsAsTheAttachmentNotInTheJSON() throws {
        let photo = Data([0xFF, 0xD8, 0xFF, 0xE0] + Array(repeating: 0x42, count: 10_000))
        let payload = try codec.encodePayload(Images.Put.Request(plantID: "p1", data: photo))
        #expect(String(decoding: payload.body, as: UTF8.self) == #"{"plantID":"p1"}"#)
        #expect(payload.attachments == [[UInt8](photo)])
        let decoded = try codec.decodePayload(Images.Put.Request.self, from: payload)
        #expect(decoded.plantID == "p1" && decoded.data == photo)
    }

    @Test func theNumberOfAttachmentsIsChecked() throws {
        let body = Array(#"{"plantID":"p1"}"#.utf8)
        #expect(throws: CanopyError.self) { try codec.decodePayload(Images.Put.Request.self, from: Payload(body: body)) }
        #expect(throws: CanopyError.self) { try codec.decodePayload(Images.Put.Request.self, from: Payload(body: body, attachments: [[1], [2]])) }
        // A message that takes none refuses them, rather than dropping bytes silently.
        let error = #expect(throws: CanopyError.self) {
            try codec.decodePayload(Images.Palette.Request.self, from: Payload(body: Array(#"{"sha256":"ab"}"#.utf8), attachments: [[1]]))
        }
        #expect(error?.message.contains("no attachments") == true)
    }
}
