import CanopyTesting
import Foundation
import Testing

@testable import CanopyMessages

/// The hand-written wire dates agree with Foundation's ISO 8601 format style, to the bit,
/// for every date they cover, and leave the rest to it.
struct WireDateTests {
    static let style = Date.ISO8601FormatStyle(includingFractionalSeconds: true)

    @Test func formattingMatchesFoundationForTenThousandDatesFrom1970To9999() {
        var random = SeededRandom(seed: 13)
        for round in 0..<10_000 {
            // Whole seconds, milliseconds, and fractions finer than a millisecond, early and late.
            let seconds = Double(random.next() % 253_402_300_800)
            let fraction = [0, Double(random.next() % 1_000) / 1_000, Double(random.next() % 1_000_000_000) / 1e9][round % 3]
            let date = Date(timeIntervalSince1970: seconds + fraction)
            #expect(WireDate.format(date) == date.formatted(Self.style), "\(date.timeIntervalSince1970)")
        }
        for edge in [0.0, 0.0005, 951_782_400, 4_107_542_399.999, 253_402_300_799.999] { // 1970, 2000-02-29, 2100-02-28, 9999
            let date = Date(timeIntervalSince1970: edge)
            #expect(WireDate.format(date) == date.formatted(Self.style), "\(edge)")
        }
        #expect(WireDate.format(Date(timeIntervalSince1970: -1)) == nil, "before 1970 is left to Foundation")
        #expect(WireDate.format(Date(timeIntervalSince1970: 253_402_300_800)) == nil, "after 9999 too")
    }

    @Test func parsingMatchesFoundationToTheBit() throws {
        var random = SeededRandom(seed: 29)
        for round in 0..<10_000 {
            let date = Date(timeIntervalSince1970: Double(random.next() % 253_402_300_800) + Double(random.next() % 1_000) / 1_000)
            var text = date.formatted(Self.style)
            if round % 4 == 1 { text = String(text.dropLast(5)) + "Z" } // no fraction
            if round % 4 == 2 { text = String(text.dropLast(1)) + "123456Z" } // 9 digits
            let expected = try Self.style.parse(text)
            guard case .date(let parsed) = WireDate.parse(text) else {
                Issue.record("\(text) was not parsed")
                continue
            }
            #expect(parsed.timeIntervalSinceReferenceDate.bitPattern == expected.timeIntervalSinceReferenceDate.bitPattern, "\(text)")
        }
    }

    @Test func whatItDoesNotCoverIsLeftToFoundationAndNonsenseIsRefused() throws {
        for text in ["2026-02-29T09:00:00.000Z", "2026-04-31T09:00:00Z", "2026-03-29T24:00:00Z", "2026-03-29T09:60:00Z", "2026-13-01T09:00:00Z"] {
            #expect(WireDate.parse(text) == .invalid, "\(text)")
        }
        for text in [
            "1969-12-31T23:59:59Z", "2026-03-29T09:00:00+02:00", "2026-03-29 09:00:00Z", "2026-03-29T09:00:00.Z",
            "2026-3-29T09:00:00.000Z", "2026-03-29T09:00:00.1234567890Z", "２０２６-03-29T09:00:00Z",
        ] {
            #expect(WireDate.parse(text) == .other, "\(text)")
        }
        // Through the codec, an offset still decodes (Foundation's way) and a date that does not
        // exist is refused instead of rolled over to March.
        let codec = MessageCodec()
        struct Stamp: Codable { var at: Date }
        let shifted = try codec.decode(Stamp.self, from: Array(#"{"at":"2026-03-29T11:00:00+02:00"}"#.utf8))
        #expect(shifted.at == Date(timeIntervalSince1970: 1_774_774_800))
        #expect(throws: CanopyError.self) { try codec.decode(Stamp.self, from: Array(#"{"at":"2026-02-30T09:00:00.000Z"}"#.utf8)) }
    }
}
