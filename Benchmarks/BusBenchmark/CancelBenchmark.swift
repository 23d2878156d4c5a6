import ArgumentParser
import CanopyBroker
import CanopyMessages
import CanopyWire
import Foundation

/// The broker's routing state alone (no sockets): N requests queued behind a busy worker,
/// then every one cancelled, from the back (the case that searched the whole queue per
/// cancel) and from the front (the baseline, where the search was short), with the time per
/// cancel and their ratio. A flat ratio and flat per-cancel times as N grows show every
/// cancel is O(1).
struct CancelBenchmark: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cancels",
        abstract: "The broker's cancels: N queued requests cancelled from the back against from the front.",
        discussion: "Example: canopy-bench cancels --requests 200000")

    @Option(help: "Queued requests, comma-separated sizes.") var requests = "50000,200000"

    func run() throws {
        let sizes = requests.split(separator: ",").compactMap { Int($0) }
        var rows = [["queued", "cancel from the front ns (baseline)", "cancel from the back ns", "ratio"]]
        for size in sizes {
            let front = Self.nanosecondsPerCancel(size, reverse: false)
            let back = Self.nanosecondsPerCancel(size, reverse: true)
            rows.append(["\(size)", String(format: "%.0f", front), String(format: "%.0f", back), String(format: "%.2f", back / front)])
        }
        print("canopy-bench cancels: requests queued behind one busy worker, then each cancelled (BrokerState, no sockets)")
        printTable(rows)
    }

    static func nanosecondsPerCancel(_ count: Int, reverse: Bool) -> Double {
        var configuration = BrokerConfiguration()
        configuration.metrics = false
        configuration.maximumQueuedPerService = count + 10
        let start = ContinuousClock.now
        var state = BrokerState(configuration: configuration, now: start)
        var out: [BrokerState.Directive] = []
        let operations = [OperationDescriptor(name: "get", idempotent: true, coalescable: false)]
        state.receive(WireMessage.ready(service: "plants", operations: operations, credit: 1).encoded, from: Array("w".utf8), now: start, into: &out)
        let client = Array("c".utf8)
        for index in 0...count {
            let request = WireRequest(
                correlation: Wire.frame(UInt64(index)), service: "plants", operation: "get",
                header: RequestHeader(timeoutMilliseconds: 600_000), body: Array(#"{"id":"p\#(index)"}"#.utf8))
            out.removeAll(keepingCapacity: true)
            state.receive(WireMessage.request(request).encoded, from: client, now: start, into: &out)
        }
        let cancels = (1...count).map { WireMessage.cancel(correlation: Wire.frame(UInt64($0))).encoded }
        let order = reverse ? Array(cancels.reversed()) : cancels
        let began = ContinuousClock.now
        for frames in order {
            out.removeAll(keepingCapacity: true)
            state.receive(frames, from: client, now: start, into: &out)
        }
        let elapsed = ContinuousClock.now - began
        return Double(elapsed.nanoseconds) / Double(count)
    }
}
