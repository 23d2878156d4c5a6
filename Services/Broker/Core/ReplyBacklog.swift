import CanopyIO

/// Replies handed to libzmq for clients that have not read them yet, bounded in bytes per
/// client and in all. libzmq queues messages per peer up to a count (the high-water mark),
/// whatever their size, so a client that reads slowly would otherwise make the broker hold
/// every reply sent its way: 600 replies of 1 MiB were 600 MiB of the broker's memory. Here
/// each reply carries a ``SendTicket`` (from a ``TicketPool``: a ticket is used again, not
/// allocated anew a reply, once the pool holds enough) until libzmq lets it go (written to the
/// connection, or dropped with it), and a reply that would pass a bound is dropped and counted,
/// as NATS does with a slow consumer's messages; the client gets a short `busy` error in its
/// place.
///
/// The dictionary belongs to the broker's loop thread; the counts fall on libzmq's I/O thread.
final class ReplyBacklog {
    /// Bytes that may wait for one client; a client with nothing waiting is always sent its
    /// reply, however large (a client that reads is never refused).
    let perClient: Int
    /// Bytes that may wait for all clients together.
    let total: Int
    /// Bytes beyond the bounds that the short errors telling a client its reply was dropped
    /// may take (about 5,000 of them), so a client learns what happened when it reads again.
    static let errorSlack = 1024 * 1024

    private let all = ByteCount()
    /// The tickets, used again reply after reply.
    let tickets = TicketPool()
    /// Keyed by routing identity, hashed in bulk (`[UInt8]`'s own hashing goes byte by byte).
    private var clients: [BrokerState.PeerKey: ByteCount] = [:]
    /// Sweep clients with nothing waiting once the table has this many entries.
    private var sweepAt = 1024
    /// Replies dropped because a bound was reached, since the broker started.
    private(set) var dropped: UInt64 = 0

    init(perClient: Int, total: Int) {
        self.perClient = perClient
        self.total = total
    }

    /// Bytes waiting for all clients now.
    var bytes: Int { all.bytes }

    /// A ticket for `bytes` more waiting for `client`, or `nil` when that would pass a bound
    /// (by more than `slack`).
    func admit(_ bytes: Int, to client: [UInt8], slack: Int = 0) -> SendTicket? {
        let count: ByteCount
        let key = BrokerState.PeerKey(client)
        if let known = clients[key] {
            count = known
        } else {
            count = ByteCount()
            clients[key] = count
        }
        let waiting = count.bytes
        guard waiting == 0 || waiting + bytes <= perClient + slack, all.bytes + bytes <= total + slack else { return nil }
        return tickets.ticket(bytes: bytes, peer: count, all: all)
    }

    /// Counts a reply dropped at a bound.
    func countDrop() {
        dropped += 1
    }

    /// Forgets clients with nothing waiting, once the table has grown (amortised O(1) a reply).
    func sweep() {
        guard clients.count >= sweepAt else { return }
        clients = clients.filter { $0.value.bytes > 0 }
        sweepAt = max(1024, clients.count * 2)
    }
}
