import Foundation

/// Dates as the wire writes them, `2026-03-29T09:00:00.000Z` (ISO 8601, UTC, milliseconds),
/// formatted and parsed by hand: a window of 64 occurrences has 64 dates, and Foundation's
/// format style took most of the time of decoding one (see docs/PERFORMANCE.md). Parsing gives
/// the same `Date` as `Date.ISO8601FormatStyle(includingFractionalSeconds: true)`, which stays
/// the fallback for what this does not cover (years before 1970 or after 9999, other offsets
/// than `Z`, other shapes). Formatting rounds to the nearest millisecond where that style
/// truncates: `.389` is stored as a double a hair below it, and truncated it came back as
/// `.388` — a due time handed from service to service lost a millisecond at each hop.
enum WireDate {
    /// Seconds from 1970 to 2001, Foundation's reference date.
    private static let referenceOffset: Int64 = 978_307_200
    /// 1970-01-01 and 10000-01-01 as seconds since 1970: the years this covers.
    private static let earliest: Int64 = 0
    private static let latest: Int64 = 253_402_300_800

    /// `date` as the wire writes it; `nil` outside the years 1970 to 9999.
    static func format(_ date: Date) -> String? {
        // The nearest millisecond, then its whole seconds (a double holds milliseconds exactly
        // to far past 9999: 2^53 of them is 285,000 years).
        let milliseconds = (date.timeIntervalSince1970 * 1_000).rounded()
        guard milliseconds.isFinite, milliseconds >= Double(earliest * 1_000), milliseconds < Double(latest * 1_000) else { return nil }
        let (seconds, remainder) = Int64(milliseconds).quotientAndRemainder(dividingBy: 1_000)
        let millisecond = Int(remainder)
        let (year, month, day) = civil(days: seconds / 86_400)
        let secondOfDay = Int(seconds % 86_400)
        var bytes = [UInt8](repeating: 0, count: 24)
        func put(_ value: Int, _ digits: Int, at offset: Int) {
            var value = value
            for index in stride(from: offset + digits - 1, through: offset, by: -1) {
                bytes[index] = UInt8(0x30 + value % 10)
                value /= 10
            }
        }
        put(year, 4, at: 0)
        bytes[4] = 0x2D
        put(month, 2, at: 5)
        bytes[7] = 0x2D
        put(day, 2, at: 8)
        bytes[10] = 0x54 // T
        put(secondOfDay / 3_600, 2, at: 11)
        bytes[13] = 0x3A
        put(secondOfDay / 60 % 60, 2, at: 14)
        bytes[16] = 0x3A
        put(secondOfDay % 60, 2, at: 17)
        bytes[19] = 0x2E
        put(millisecond, 3, at: 20)
        bytes[23] = 0x5A // Z
        return String(decoding: bytes, as: UTF8.self)
    }

    /// What ``parse(_:)`` made of a text.
    enum Parsed: Equatable {
        case date(Date)
        /// The wire's shape with a date that does not exist (February 30, 24:00, a 60th
        /// minute): refused, where Foundation's format style would roll it over.
        case invalid
        /// Another shape (an offset, no `T`, before 1970): Foundation's to parse.
        case other
    }

    /// `YYYY-MM-DDTHH:MM:SSZ`, or with 1 to 9 digits of fractions after the seconds, from 1970
    /// to 9999.
    static func parse(_ text: String) -> Parsed {
        var text = text
        return text.withUTF8 { bytes -> Parsed in
            guard bytes.count >= 20, bytes.count <= 30, bytes[4] == 0x2D, bytes[7] == 0x2D, bytes[10] == 0x54, bytes[13] == 0x3A,
                bytes[16] == 0x3A, bytes[bytes.count - 1] == 0x5A
            else { return .other }
            func number(_ offset: Int, _ digits: Int) -> Int? {
                var value = 0
                for index in offset..<(offset + digits) {
                    let digit = Int(bytes[index]) - 0x30
                    guard digit >= 0, digit <= 9 else { return nil }
                    value = value * 10 + digit
                }
                return value
            }
            guard let year = number(0, 4), let month = number(5, 2), let day = number(8, 2), let hour = number(11, 2),
                let minute = number(14, 2), let second = number(17, 2)
            else { return .other }
            var fraction = 0.0
            if bytes.count > 20 {
                let digits = bytes.count - 21
                guard bytes[19] == 0x2E, (1...9).contains(digits), let value = number(20, digits) else { return .other }
                fraction = Double(value) / pow(10, Double(digits))
            } else if bytes[19] != 0x5A {
                return .other
            }
            guard year >= 1970 else { return .other }
            guard (1...12).contains(month), day >= 1, day <= daysIn(month: month, year: year), hour < 24, minute < 60, second < 60 else {
                return .invalid
            }
            let seconds = days(year: year, month: month, day: day) * 86_400 + Int64(hour * 3_600 + minute * 60 + second)
            return .date(Date(timeIntervalSinceReferenceDate: Double(seconds - referenceOffset) + fraction))
        }
    }

    private static func daysIn(month: Int, year: Int) -> Int {
        switch month {
        case 2: (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: 30
        default: 31
        }
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
    private static func days(year: Int, month: Int, day: Int) -> Int64 {
        let y = Int64(month <= 2 ? year - 1 : year)
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400
        let dayOfYear = Int64((153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1)
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }

    /// The date of a day since 1970-01-01 (Howard Hinnant's `civil_from_days`).
    private static func civil(days: Int64) -> (year: Int, month: Int, day: Int) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1_460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthIndex = (5 * dayOfYear + 2) / 153
        let day = Int(dayOfYear - (153 * monthIndex + 2) / 5 + 1)
        let month = Int(monthIndex < 10 ? monthIndex + 3 : monthIndex - 9)
        return (Int(yearOfEra + era * 400) + (month <= 2 ? 1 : 0), month, day)
    }
}

/// Times in JSON text, for tools that read answers without their types (replay compares
/// times as times): the wire's `2026-03-29T09:00:00.000Z`, or another ISO 8601 date-time
/// with an offset.
public enum WireTime {
    /// Nanoseconds since 1970 of `text` when it is a date-time with its time of day (a date
    /// alone is not a time here), or nil.
    public static func nanoseconds(_ text: String) -> Int64? {
        let bytes = text.utf8
        guard bytes.count >= 20, bytes.count <= 35 else { return nil }
        switch WireDate.parse(text) {
        case .date(let date):
            return Int64((date.timeIntervalSince1970 * 1e9).rounded())
        case .invalid:
            return nil
        case .other:
            let start = Array(bytes.prefix(11))
            guard start[4] == UInt8(ascii: "-"), start[7] == UInt8(ascii: "-"), start[10] == UInt8(ascii: "T"),
                let date = try? Date(text, strategy: Date.ISO8601FormatStyle(includingFractionalSeconds: text.contains(".")))
            else { return nil }
            return Int64((date.timeIntervalSince1970 * 1e9).rounded())
        }
    }
}
