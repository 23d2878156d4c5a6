import Foundation

/// How hard memory is pressed, and what the memory tier sheds at each level (seed 001):
/// warning shrinks it by 30%, urgent drops the variants, critical drops everything.
enum MemoryPressure: String, Sendable, Comparable, CaseIterable {
    case normal, warning, urgent, critical

    static func < (lhs: Self, rhs: Self) -> Bool {
        allCases.firstIndex(of: lhs)! < allCases.firstIndex(of: rhs)!
    }

    /// What the kernel and the process say, at one moment.
    struct Reading: Sendable, Equatable {
        /// Share of the last 10 s in which some task stalled on memory (`some avg10`), 0–100.
        var stalledSome: Double?
        /// Share of the last 10 s in which all tasks stalled on memory (`full avg10`), 0–100.
        var stalledFull: Double?
        /// The process's resident size in bytes.
        var residentBytes: Int
    }

    /// The level for a reading against a resident-size budget. Resident share of the budget:
    /// under 50% normal, 50–70% warning, 70–85% urgent, 85% and over critical (seed 001).
    /// Kernel stalls raise the level: `some` over 10% at least warning, over 30% at least
    /// urgent; `full` over 10% critical.
    static func level(_ reading: Reading, budget: Int) -> MemoryPressure {
        let share = budget > 0 ? Double(reading.residentBytes) / Double(budget) : 0
        var level: MemoryPressure =
            switch share {
            case ..<0.5: .normal
            case ..<0.7: .warning
            case ..<0.85: .urgent
            default: .critical
            }
        if let some = reading.stalledSome {
            if some > 30 { level = max(level, .urgent) } else if some > 10 { level = max(level, .warning) }
        }
        if let full = reading.stalledFull, full > 10 { level = .critical }
        return level
    }

    /// Parses the kernel's pressure file (`/proc/pressure/memory` or a cgroup's
    /// `memory.pressure`): lines like `some avg10=0.00 avg60=0.00 avg300=0.00 total=0`.
    static func parse(pressure text: String) -> (some: Double?, full: Double?) {
        var some: Double?, full: Double?
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard let kind = fields.first,
                let avg10 = fields.first(where: { $0.hasPrefix("avg10=") }).flatMap({ Double($0.dropFirst(6)) })
            else { continue }
            if kind == "some" { some = avg10 } else if kind == "full" { full = avg10 }
        }
        return (some, full)
    }

    /// Reads the pressure of this process's cgroup (or the whole system) and its resident size.
    static func read() -> Reading {
        let pressure = ["/sys/fs/cgroup/memory.pressure", "/proc/pressure/memory"].lazy
            .compactMap { try? String(contentsOfFile: $0, encoding: .utf8) }.first
        let (some, full) = pressure.map(parse(pressure:)) ?? (nil, nil)
        return Reading(stalledSome: some, stalledFull: full, residentBytes: residentBytes())
    }

    /// This process's resident size, from `/proc/self/statm`.
    static func residentBytes() -> Int {
        guard let statm = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
        let fields = statm.split(separator: " ")
        guard fields.count > 1, let pages = Int(fields[1]) else { return 0 }
        return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
    }
}
