import Foundation

/// What a CLI's `--help` lacks, as sentences: subcommands without an example, and (for
/// `serve`) options that do not name their `CANOPY_*` variable. Empty when all is well.
public func helpProblems(_ executable: String, subcommands: [[String]]) async throws -> [String] {
    var problems: [String] = []
    for subcommand in subcommands {
        let help = try await runExecutable(executable, subcommand + ["--help"])
        let name = ([executable] + subcommand).joined(separator: " ")
        if help.status != 0 { problems.append("\(name) --help failed") }
        if !help.output.contains("Example") { problems.append("\(name) shows no example") }
        guard subcommand.first == "serve", let options = help.output.components(separatedBy: "OPTIONS:").last else { continue }
        for block in options.components(separatedBy: "\n  -").dropFirst() where !block.contains("Env:") {
            let option = block.split(separator: " ").first.map(String.init) ?? block
            if option != "-help" && option != "h," { problems.append("\(name): -\(option) names no variable") }
        }
    }
    return problems
}
