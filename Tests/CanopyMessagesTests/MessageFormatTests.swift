import CanopyBus
import CanopyMessages
import Foundation
import Testing

/// Golden fixtures pin the wire format: a change to a message's JSON or a frame's bytes
/// shows up here before it reaches a peer written against the old format.
struct MessageFormatTests {
    let codec = MessageCodec()

    func fixture(_ name: String) throws -> [UInt8] {
        let url = try #require(Bundle.module.url(forResource: "Fixtures", withExtension: nil)).appendingPathComponent(name)
        var bytes = [UInt8](try Data(contentsOf: url))
        while bytes.last == 0x0A { bytes.removeLast() }
        return bytes
    }

    @Test func errorsEncodeAsCodeAndMessage() throws {
        let error = CanopyError(.busy, "'care' has 1000 requests waiting already; retry later or start more workers")
        #expect(try codec.encode(error) == fixture("error-busy.json"))
        #expect(try codec.decode(CanopyError.self, from: fixture("error-busy.json")) == error)
    }

    @Test func everyErrorCodeKeepsItsWireName() {
        #expect(
            CanopyError.Code.allCases.map(\.rawValue) == [
                "badRequest", "notFound", "conflict", "stale", "unauthorized", "tooLarge", "busy", "noWorkers", "timeout", "workerLost", "brokerLost",
                "shuttingDown", "internal",
            ])
    }

    @Test func brokerServicesReplyIsPinned() throws {
        let reply = [
            ServiceDescription(
                name: "care", workers: 2,
                operations: [
                    OperationDescriptor(name: "plants.add", idempotent: false, coalescable: false),
                    OperationDescriptor(name: "plants.get", idempotent: true, coalescable: true),
                ]),
            ServiceDescription(name: "legacy", workers: 1, operations: [OperationDescriptor(name: "*", idempotent: true, coalescable: true)], majordomo: true),
        ]
        #expect(try codec.encode(reply) == fixture("broker-services-reply.json"))
        #expect(try codec.decode(Broker.Services.Reply.self, from: fixture("broker-services-reply.json")) == reply)
    }

    @Test func brokerStatsReplyIsPinned() throws {
        let reply = BrokerStatistics(
            uptimeSeconds: 12.5, rejected: 3, malformed: 2, heldBytes: 2048, openFlights: 1,
            services: [
                ServiceStatistics(name: "care", workers: 2, queued: 0, queuedBytes: 0, inFlight: 2, served: 41, errors: 1, p50Micros: 180, p99Micros: 950)
            ],
            operations: [
                OperationStatistics(
                    service: "care", operation: "plants.get", requests: 41, coalesced: 37, workerCalls: 5, workerCallsSaved: 37,
                    detachedWaiters: 2, redispatchedFlights: 1, flights: 4, waitersPerFlightP50: 3, waitersPerFlightP99: 30, waitersPerFlightMax: 30,
                    outcomes: ["ok": 38, "timeout": 1])
            ])
        #expect(try codec.encode(reply) == fixture("broker-stats-reply.json"))
        #expect(try codec.decode(Broker.Stats.Reply.self, from: fixture("broker-stats-reply.json")) == reply)
    }

    @Test func readyOperationsFrameIsPinned() throws {
        let operations = [
            OperationDescriptor(name: "echo", idempotent: true, coalescable: false),
            OperationDescriptor(name: "append", idempotent: false, coalescable: false),
        ]
        #expect(try codec.encode(operations) == fixture("ready-operations.json"))
    }

    @Test func requestFramesArePinned() throws {
        struct Golden: Decodable { let frames: [String] }
        let golden = try JSONDecoder().decode(Golden.self, from: Data(fixture("request-frames.json")))
        let header = RequestHeader(timeoutMilliseconds: 2_500, flags: RequestHeader.Flag.idempotent, principal: "user-42")
        let frames = [
            Wire.version, Wire.Command.request.frame, Wire.frame(UInt64(7)), Array("care".utf8), Array("plants.get".utf8), header.frame,
            Array(#"{"id":"p1"}"#.utf8),
        ]
        #expect(frames.map(\.hexString) == golden.frames)
        #expect(RequestHeader(frame: frames[5]) == header)
    }

    @Test func equalValuesEncodeToEqualBytesWhateverTheKeyOrder() throws {
        struct Plant: Codable {
            var zeta: Int
            var alpha: String
            var middle: [String: Int]
        }
        let one = try codec.encode(Plant(zeta: 1, alpha: "a", middle: ["b": 2, "a": 1, "c": 3]))
        let two = try codec.encode(Plant(zeta: 1, alpha: "a", middle: ["c": 3, "a": 1, "b": 2]))
        #expect(one == two)
        #expect(String(decoding: one, as: UTF8.self) == #"{"alpha":"a","middle":{"a":1,"b":2,"c":3},"zeta":1}"#)
    }

    @Test func datesAreISO8601WithMilliseconds() throws {
        struct Stamp: Codable, Equatable { var at: Date }
        let stamp = Stamp(at: Date(timeIntervalSince1970: 1_774_774_800.5))
        let bytes = try codec.encode(stamp)
        #expect(String(decoding: bytes, as: UTF8.self) == #"{"at":"2026-03-29T09:00:00.500Z"}"#)
        #expect(try codec.decode(Stamp.self, from: bytes) == stamp)
        #expect(try codec.decode(Stamp.self, from: Array(#"{"at":"2026-03-29T09:00:00Z"}"#.utf8)).at == Date(timeIntervalSince1970: 1_774_774_800))
    }

    @Test func aPlantNeedsOnlyItsScientificName() throws {
        let plant = try codec.decode(Care.Plant.self, from: Array(#"{"scientificName":"Monstera deliciosa","favourite":true}"#.utf8))
        #expect(plant.scientificName == "Monstera deliciosa" && plant.favourite && plant.commonNames.isEmpty && plant.identificationSource == .manual)
        let error = #expect(throws: CanopyError.self) { _ = try codec.decode(Care.Plant.self, from: Array(#"{"favourite":true}"#.utf8)) }
        #expect(error?.message.contains("scientificName") == true)
        let preferences = try codec.decode(Care.Preferences.self, from: Array(#"{"timeZone":"Europe/Berlin"}"#.utf8))
        #expect(preferences == Care.Preferences(timeZone: "Europe/Berlin"))
        #expect(try codec.decode(Care.ListPlants.Request.self, from: Array("{}".utf8)) == Care.ListPlants.Request())
        #expect(try codec.decode(Care.UpcomingTasks.Request.self, from: Array("{}".utf8)).days == 7)
        #expect(try codec.decode(Images.GetVariant.Request.self, from: Array(#"{"sha256":"ab","variant":"gallery"}"#.utf8)).format == .jpeg)
    }

    @Test func invalidJSONIsABadRequestThatSaysWhatIsWrong() {
        #expect(throws: CanopyError(.badRequest, "invalid JSON for CanopyError: missing key 'message'")) {
            _ = try codec.decode(CanopyError.self, from: Array(#"{"code":"busy"}"#.utf8))
        }
        let error = #expect(throws: CanopyError.self) { _ = try codec.decode(CanopyError.self, from: Array("{not json".utf8)) }
        #expect(error?.code == .badRequest)
    }

    @Test func aKeyTwiceInOneObjectIsRefusedWhateverItsEscaping() {
        for body in [#"{"code":"busy","message":"a","code":"timeout"}"#, #"{"code":"busy","message":"a","\u0063ode":"timeout"}"#] {
            let error = #expect(throws: CanopyError.self) { _ = try codec.decode(CanopyError.self, from: Array(body.utf8)) }
            #expect(error?.message.contains("'code' appears twice") == true, "\(error?.message ?? "")")
        }
        // The same key in different objects, or inside a string, is fine.
        struct Pair: Codable {
            var a: CanopyError
            var b: CanopyError
        }
        #expect(throws: Never.self) {
            _ = try codec.decode(Pair.self, from: Array(#"{"a":{"code":"busy","message":"\"code\":"},"b":{"code":"busy","message":"x"}}"#.utf8))
        }
    }

    @Test func deepNestingIsRefusedBeforeDecoding() {
        let deep = String(repeating: "[", count: 10_000) + String(repeating: "]", count: 10_000)
        let error = #expect(throws: CanopyError.self) { _ = try codec.decode([String].self, from: Array(deep.utf8)) }
        #expect(error?.message.contains("nests deeper") == true)
    }

    @Test func aNumberThatDoesNotFitItsFieldIsNamed() {
        struct Page: Codable {
            var limit: Int
            var ratio: Double
        }
        for body in [#"{"limit":1.5,"ratio":0.5}"#, #"{"limit":18446744073709551616,"ratio":0.25}"#] {
            let error = #expect(throws: CanopyError.self) { _ = try codec.decode(Page.self, from: Array(body.utf8)) }
            #expect(error?.message.contains("'limit'") == true, "\(error?.message ?? "")")
            #expect(error?.message.contains("not valid JSON") == false)
        }
    }

    @Test func aWholeVariantRequestKeepsItsWireBytes() throws {
        // Requests without an offset encode as they always did (and coalesce with each other).
        let request = Images.GetVariant.Request(sha256: "ab", variant: .thumbnail)
        #expect(String(decoding: try codec.encode(request), as: UTF8.self) == #"{"format":"jpeg","sha256":"ab","variant":"thumbnail"}"#)
        let piece = Images.GetVariant.Request(sha256: "ab", variant: .full, offset: 4096)
        #expect(try codec.decode(Images.GetVariant.Request.self, from: try codec.encode(piece)) == piece)
    }
}

extension [UInt8] {
    var hexString: String { map { String(format: "%02x", $0) }.joined() }
}
