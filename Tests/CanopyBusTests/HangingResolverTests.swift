import CanopyBus
import CanopyMessages
import CanopyTesting
import Foundation
import Glibc
import Testing

/// A broker whose name hangs in the resolver holds up only its own connection. libzmq resolves
/// a `tcp://NAME:PORT` endpoint synchronously in the I/O thread of the connecting socket; on a
/// container engine whose DNS took 20 s to fail for a killed broker's name, one I/O thread per
/// process stalled every connection, the other broker's too (calls failed with 503, workers
/// stopped heartbeating). Each broker's sockets now have an I/O thread of their own.
///
/// The processes under test run with a resolver that never answers for one name: a small
/// `getaddrinfo` preloaded (`LD_PRELOAD`) in front of the C library's, built here with the C
/// compiler, passing every other name through.
@Suite(.serialized)
struct HangingResolverTests {
    /// The name the preloaded resolver never answers for.
    static let hangingName = "canopy-hanging-broker.test"

    static let resolverSource = """
        #define _GNU_SOURCE
        #include <dlfcn.h>
        #include <netdb.h>
        #include <string.h>
        #include <unistd.h>

        typedef int (*lookup)(const char *, const char *, const struct addrinfo *, struct addrinfo **);

        int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints, struct addrinfo **res) {
            if (node != NULL && strcmp(node, "\(hangingName)") == 0) {
                for (;;) pause(); /* never answers: a resolver whose server does not */
            }
            lookup real = (lookup)dlsym(RTLD_NEXT, "getaddrinfo");
            return real(node, service, hints, res);
        }
        """

    /// Builds the preloadable resolver into a temporary directory.
    static func hangingResolver(in directory: URL) async throws -> URL {
        let source = directory.appendingPathComponent("hanging-resolver.c")
        let library = directory.appendingPathComponent("hanging-resolver.so")
        try Data(resolverSource.utf8).write(to: source)
        let compiler = try #require(
            ["/usr/bin/cc", "/usr/bin/gcc", "/usr/bin/clang"].first { FileManager.default.isExecutableFile(atPath: $0) },
            "a C compiler (Debian's gcc) builds the hanging resolver")
        let built = try await runProgram(at: compiler, ["-shared", "-fPIC", "-O1", "-o", library.path, source.path, "-ldl"], limit: 60)
        try #require(built.status == 0, "\(built.errors)")
        return library
    }

    @Test func aBrokerWhoseNameHangsInTheResolverHoldsUpNoCallsThroughTheOther() async throws {
        let directory = try TemporaryDirectory("canopy-hanging-resolver")
        let resolver = try await Self.hangingResolver(in: directory.url)
        let environment = ProcessInfo.processInfo.environment.merging(["LD_PRELOAD": resolver.path]) { $1 }
        try await withLiveBus { bus in
            // Both brokers named, the hanging one first (its sockets on I/O thread 0).
            let endpoints = "tcp://\(Self.hangingName):5555,\(bus.endpoint)"

            // A worker of both registers with the broker that answers and serves through it.
            let worker = Process()
            worker.executableURL = try LiveBus.executable("canopy-test-worker")
            worker.arguments = [
                "--endpoint", endpoints, "--name", "beside-a-hanging-name", "--log-level", "critical",
                "--heartbeat-ms", "\(bus.configuration.heartbeatInterval.wholeMilliseconds)",
                "--liveness", "\(bus.configuration.liveness)",
            ] // the test broker's beat and patience
            worker.environment = environment
            try worker.run()
            defer { if worker.isRunning { kill(worker.processIdentifier, SIGKILL) } }
            try await bus.waitForWorkers(1, within: .seconds(60))
            let client = try bus.client(timeout: .seconds(30))
            let echoed = try await client.call(TestService.Echo.self, .init(text: "through the other broker"))
            #expect(echoed.text == "through the other broker" && echoed.pid == worker.processIdentifier)

            // A client process of both brokers gets its answer through the one that answers.
            let sent = try await runExecutable(
                "canopy",
                [
                    "send", TestService.name, TestService.Echo.name, "--json", #"{"sleepMilliseconds":0,"text":"from a client"}"#,
                    "--endpoint", endpoints, "--timeout-ms", "30000",
                ],
                environment: ["LD_PRELOAD": resolver.path], limit: 60)
            #expect(sent.status == 0 && sent.output.contains("from a client"), "\(sent.errors)")

            // SIGTERM still ends the worker, and as a stop asked for, though one of its I/O
            // threads never comes back from the resolver.
            kill(worker.processIdentifier, SIGTERM)
            #expect(try await eventually(within: .seconds(30)) { !worker.isRunning }, "the worker ends on SIGTERM")
            if !worker.isRunning { #expect(worker.terminationStatus == 0 && worker.terminationReason == .exit) }
        }
    }
}
