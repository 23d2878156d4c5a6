import Foundation
import Glibc

/// One line of progress on standard error, redrawn in place at most ten times a second, and
/// only when standard error is a terminal (scripts and CI logs get nothing).
public struct ProgressLine {
    private let enabled = isatty(STDERR_FILENO) == 1
    private var lastDrawn = ContinuousClock.now - .seconds(1)
    private var drawn = false

    public init() {}

    /// Redraws the line when a tenth of a second has passed since the last time.
    public mutating func update(_ text: @autoclosure () -> String) {
        guard enabled, ContinuousClock.now - lastDrawn >= .milliseconds(100) else { return }
        lastDrawn = .now
        drawn = true
        FileHandle.standardError.write(Data("\r\u{1B}[K\(text())".utf8))
    }

    /// Clears the line.
    public mutating func finish() {
        guard drawn else { return }
        drawn = false
        FileHandle.standardError.write(Data("\r\u{1B}[K".utf8))
    }

    /// `done` of `total` as a bar of `width` characters and a percentage.
    public static func bar(_ done: Int, of total: Int, width: Int = 30) -> String {
        let fraction = total > 0 ? min(1, Double(done) / Double(total)) : 0
        let filled = Int(fraction * Double(width))
        return "[" + String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled) + "] " + String(format: "%3.0f%%", fraction * 100)
    }
}
