import ArgumentParser
import Foundation
import Synchronization

/// Reads `CANOPY_*` environment variables, the second source of every option (flags win).
public enum Environment {
    /// The variable's value, or `nil` when it is unset or empty.
    public static func string(_ name: String) -> String? {
        guard let value = ProcessInfo.processInfo.environment[name], !value.isEmpty else { return nil }
        return value
    }

    /// The variable as an integer, or `fallback` when it is unset. A value that is not an
    /// integer gives `fallback` too and is remembered: ``validate()`` (which every options
    /// group calls) then refuses it with a sentence naming the variable.
    public static func int(_ name: String, default fallback: Int) -> Int {
        guard let text = string(name) else { return fallback }
        guard let value = Int(text) else {
            _ = problems.withLock { $0.insert("\(name)=\(text.prefix(40)) is not a whole number; unset it or give a number") }
            return fallback
        }
        return value
    }

    /// The variable as whole milliseconds, or `fallback`'s milliseconds when it is unset.
    public static func milliseconds(_ name: String, default fallback: Duration) -> Int {
        int(name, default: Int(fallback.wholeMilliseconds))
    }

    /// The variable as a switch: on for 1, true, yes or on; off for 0, false, no or off, and
    /// when unset. Anything else is off and remembered for ``validate()``.
    public static func flag(_ name: String) -> Bool {
        guard let text = string(name)?.lowercased() else { return false }
        if ["1", "true", "yes", "on"].contains(text) { return true }
        if !["0", "false", "no", "off"].contains(text) {
            _ = problems.withLock { $0.insert("\(name)=\(text.prefix(40)) is not a switch; give 1 or 0") }
        }
        return false
    }

    /// Variables that could not be read, as sentences.
    private static let problems = Mutex<Set<String>>([])

    /// Throws a `ValidationError` naming every `CANOPY_*` variable that could not be read.
    public static func validate() throws {
        let found = problems.withLock { $0 }
        guard found.isEmpty else { throw ValidationError(found.sorted().joined(separator: "; ")) }
    }
}

/// A command that failed at run time: printed as `Error: <sentence>` with exit status 1,
/// without the usage text that a `ValidationError` (a mistake in the arguments) prints.
public struct CommandFailure: Error, CustomStringConvertible {
    /// What went wrong and what to do next.
    public let description: String

    /// - Parameter description: what went wrong and what to do next.
    public init(_ description: String) {
        self.description = description
    }
}
