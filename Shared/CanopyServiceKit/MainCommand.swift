import ArgumentParser
@preconcurrency import Glibc

/// The root command of every Canopy executable (`@main struct CareCommand: MainCommand`):
/// runs as any `AsyncParsableCommand` does, with standard error written a whole line at a
/// time.
///
/// Standard error is unbuffered in C, and swift-argument-parser writes its error messages a
/// byte at a time (`putc`), so a fatal sentence reached a container engine's log one byte
/// per write, interleaved with other lines (podman showed it scrambled). Line-buffered, each
/// line of up to 4 KiB leaves in one `write(2)`; swift-log flushes after every line it writes, so log
/// lines are never held back.
public protocol MainCommand: AsyncParsableCommand {}

extension MainCommand {
    /// Parses the command line and runs the command, standard error line-buffered.
    public static func main() async {
        StandardError.writeWholeLines()
        await main(nil)
    }
}

/// The process's standard error.
public enum StandardError {
    /// Makes standard error line-buffered (before anything is written to it).
    public static func writeWholeLines() {
        // Once, first thing in main, before any other thread writes.
        setvbuf(stderr, nil, _IOLBF, 4_096)
    }
}
