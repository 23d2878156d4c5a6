import Foundation

/// Reads `CANOPY_*` environment variables, the second source of every option (flags win).
public enum Environment {
    /// The variable's value, or `nil` when it is unset or empty.
    public static func string(_ name: String) -> String? {
        guard let value = ProcessInfo.processInfo.environment[name], !value.isEmpty else { return nil }
        return value
    }

    /// The variable as an integer, or `fallback` when it is unset. A value that is not an
    /// integer stops the program with a message naming the variable.
    public static func int(_ name: String, default fallback: Int) -> Int {
        guard let text = string(name) else { return fallback }
        guard let value = Int(text) else {
            FileHandle.standardError.write(Data("error: \(name)=\(text) is not a whole number; unset it or give a number\n".utf8))
            exit(64)
        }
        return value
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
