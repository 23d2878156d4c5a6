import CanopyTesting
import Foundation
import Testing

@testable import CanopyMessages

/// The hand-written wire dates parse as Foundation's ISO 8601 format style does, to the bit,
/// and format the same text it would for the nearest millisecond (it truncates), so a date
/// read from the wire goes out again unchanged; what they do not cover is left to it.
struct WireDateTests {
    static let style = Date.ISO8601FormatStyle(includingFractionalSeconds: true)

    /// Foundation's text for the whole second, with the milliseconds written in.
    static func expected(milliseconds: Int64) -> String {
        let (seconds, millisecond) = milliseconds.quotientAndRemainder(dividingBy: 1_000)
        let whole = Date(timeIntervalSince1970: Double(seconds)).formatted(style)
        return String(whole.dropLast(4)) + String(format: "%03dZ", Int(millisecond))
    }

    @Test func formattingGivesTheNearestMillisecondForTenThousandDatesFrom1970To9999() {
        var random = SeededRandom(seed: 13)
        for round in 0..<10_000 {
            // Whole seconds, milliseconds, and fractions finer than a millisecond, early and late.
            let seconds = Double(random.next() % 253_402_300_700)
            let fraction = [0, Double(random.next() % 1_000) / 1_000, Double(random.next() % 1_000_000_000) / 1e9][round % 3]
            // Not within 0.05 ms of a tie: a double this far from 2001 (where Date counts
            // from) is only that exact, so either side of a tie is right.
            let thousandths = fraction * 1_000
            if abs(thousandths - thousandths.rounded(.down) - 0.5) < 0.05 { continue }
            let date = Date(timeIntervalSince1970: seconds + fraction)
            let nearest = Int64(seconds) * 1_000 + Int64(thousandths.rounded())
            #expect(WireDate.format(date) == Self.expected(milliseconds: nearest), "\(date.timeIntervalSince1970)")
        }
        for (edge, milliseconds) in [
            (0.0, 0), (0.0006, 1), (0.0004, 0), (951_782_400, 951_782_400_000), (4_107_542_399.999, 4_107_542_399_999),
            (59.9996, 60_000), (253_402_300_799.999, 253_402_300_799_999),
        ] as [(Double, Int64)] { // 1970, either side of half a millisecond, 2000-02-29, 2100-02-28, a minute carried, 9999
            #expect(WireDate.format(Date(timeIntervalSince1970: edge)) == Self.expected(milliseconds: milliseconds), "\(edge)")
        }
        #expect(WireDate.format(Date(timeIntervalSince1970: -1)) == nil, "before 1970 is left to Foundation")
        #expect(WireDate.format(Date(timeIntervalSince1970: 253_402_300_800)) == nil, "after 9999 too")
    }

    @Test func aDateReadFromTheWireGoesOutAgainUnchangedAtEveryMillisecond() throws {
        // Foundation's truncation turned `.389` into `.388` (the double a hair below it).
        var random = SeededRandom(seed: 31)
        for _ in 0..<10_000 {
            let text = Self.expected(milliseconds: Int64(random.next() % 253_402_300_799_999))
            guard case .date(let parsed) = WireDate.parse(text) else {
                Issue.record("\(text) was not parsed")
                continue
            }
            #expect(WireDate.format(parsed) == text)
        }
        let codec = MessageCodec()
        struct Stamp: Codable, Equatable { var at: Date }
        let sent = #"{"at":"2026-03-29T09:00:00.389Z"}"#
        #expect(String(decoding: try codec.encode(try codec.decode(Stamp.self, from: Array(sent.utf8))), as: UTF8.self) == sent)
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
