import CanopyMessages
import CanopyServiceKit
import CanopyStore
import CanopyTesting
import Foundation
import Logging
import Testing

@testable import CanopyRemind

/// canopy-remind replicas on one PostgreSQL database, with a hand-driven clock and a local
/// webhook receiver: each reminder is sent by one replica, once; a send leased by a replica
/// that was killed goes at once, one leased by a replica that hangs once its lease ends, both
/// under the same webhook-id.
@Suite(.serialized)
struct ReminderReplicaTests {
    static let start = Date(timeIntervalSince1970: 1_800_000_000)

    struct Replicas {
        let stores: [PostgresReminderStore]
        let libraries: [ReminderLibrary]
        let dispatchers: [Dispatcher]
        let clock: ManualClock
        let receiver: RecordingServer
    }

    /// `count` replicas (store, library, dispatcher) on one fresh database, people `0..<people`
    /// each with a webhook device; the dispatchers run for `body`.
    func withReplicas(_ count: Int, people: Int, settings: DispatchSettings, _ body: (Replicas) async throws -> Void) async throws {
        var logger = Logger(label: "remind-replicas")
        logger.logLevel = .warning
        let url = try await PostgresServer.shared().database()
        var stores: [PostgresReminderStore] = []
        for _ in 0..<count { stores.append(try await PostgresReminderStore.open(url: url, poolSize: 4, logger: logger)) }
        defer { stores.forEach { $0.database.close() } }
        let libraries = stores.map { ReminderLibrary(store: $0, allowedHosts: ["127.0.0.1"]) }
        let receiver = RecordingServer()
        try await withRunning([receiver.application], logger: logger) {
            for person in 0..<people {
                _ = try libraries[0].register(
                    .init(
                        channel: .webhook, address: try await receiver.url("/hooks/person-\(person)"), name: "phone",
                        secret: "whsec_" + Data(repeating: 7, count: 32).base64EncodedString()), owner: "person-\(person)")
            }
            let clock = ManualClock(Self.start)
            let http = try notificationHTTP(allowedHosts: ["127.0.0.1"])
            let dispatchers = stores.map { store in
                Dispatcher(store: store, channels: [WebhookChannel(http: http, now: { clock.now() })], clock: clock, settings: settings, logger: logger)
            }
            try await withRunning(dispatchers, logger: logger) {
                try await body(Replicas(stores: stores, libraries: libraries, dispatchers: dispatchers, clock: clock, receiver: receiver))
            }
        }
    }

    @Test func eachReminderIsSentByOneReplicaOnce() async throws {
        var settings = DispatchSettings()
        settings.digestWindow = .zero
        try await withReplicas(3, people: 12, settings: settings) { replicas in
            // Every replica holds every reminder (as each loads all at start): all three wake
            // for each, and each goes once.
            for person in 0..<12 {
                let tasks = (0..<3).map { Care.Task.water("p\($0)", due: Self.start + Double(60 + 120 * $0 + person)) }
                let scheduled = try await replicas.libraries[person % 3].sync(tasks, owner: "person-\(person)", now: Self.start)
                for dispatcher in replicas.dispatchers { dispatcher.schedule(scheduled) }
            }
            // Time goes on (a person another replica was busy with comes round a second later).
            #expect(
                try await eventually(within: .seconds(60), every: .milliseconds(20)) { // generous: a loaded machine took over 20 s
                    replicas.clock.advance(by: 5)
                    return replicas.receiver.received.count >= 36
                }, "\(replicas.receiver.received.count) of 36 arrived")
            #expect(try await !eventually(within: .milliseconds(300)) { replicas.receiver.received.count > 36 }, "no second copy arrives")
            let ids = replicas.receiver.received.compactMap { $0.headers["webhook-id"] }
            #expect(ids.count == 36 && Set(ids).count == 36, "36 reminders, each sent once: \(ids.count) requests, \(Set(ids).count) ids")
            #expect(
                try await eventually {
                    try replicas.stores[0].read { data in try (0..<12).allSatisfy { try data.pendingSummary(owner: "person-\($0)").count == 0 } }
                })
        }
    }

    @Test func aSendLeasedByAReplicaThatHangsGoesWhenTheLeaseEndsUnderTheSameID() async throws {
        var settings = DispatchSettings()
        settings.digestWindow = .zero
        settings.lease = .seconds(30)
        settings.sweepInterval = .seconds(1)
        settings.orphanGrace = .seconds(2)
        try await withReplicas(1, people: 1, settings: settings) { replicas in
            let store = replicas.stores[0]
            // A replica turns the reminder into a send, leases it for its attempt, and hangs
            // (still connected to the database) without recording anything.
            // Due a second after the clock: the running replica's sweeps cannot take it first.
            let scheduled = try await replicas.libraries[0].sync([.water("p1", due: Self.start + 1)], owner: "person-0", now: Self.start)
            // (A dispatcher that does not run: its sends go nowhere, as a hung replica's.)
            let dead = Dispatcher(store: store, channels: [], clock: replicas.clock, settings: settings, logger: Logger(label: "hung-replica"))
            let (sends, _) = try dead.prepare(scheduled.map(\.id), now: Self.start + 1)
            let send = try #require(sends.first)
            #expect(try store.claimSend(id: send, now: Self.start + 1, until: Self.start + 30))
            #expect(try !store.claimSend(id: send, now: Self.start + 2, until: Self.start + 31), "leased: nobody else takes it")
            let key = try #require(try await store.read { data in try data.pendingSend(id: send) }).send.notification.id
            // The survivor's sweeps find it only once the lease ends.
            for _ in 0..<25 { replicas.clock.advance(by: 1) }
            #expect(try await !eventually(within: .milliseconds(500)) { replicas.receiver.arrived > 0 }, "not while the lease holds")
            // Time goes on as it would: a step that failed on a loaded machine (a store call, a
            // request timing out) comes round again a second later on this clock too.
            #expect(
                try await eventually(within: .seconds(60), every: .milliseconds(100)) {
                    replicas.clock.advance(by: 1)
                    return replicas.receiver.received.count >= 1
                }, "sent once the lease ended")
            // Under the key the dead replica would have used: a receiver that saw its attempt
            // knows this one for the same notification.
            #expect(Set(replicas.receiver.received.map { $0.headers["webhook-id"] }) == [key])
            #expect(try await eventually { try await store.read { data in try data.pendingSend(id: send) } == nil }, "recorded as delivered")
            #expect(try await store.read { data in try data.upcoming(owner: "person-0", limit: 10) }.isEmpty)
        }
    }

    @Test func aSendLeasedByAReplicaThatIsKilledGoesAtOnceUnderTheSameID() async throws {
        var settings = DispatchSettings()
        settings.digestWindow = .zero
        settings.sweepInterval = .seconds(1)
        settings.orphanGrace = .seconds(2)
        try await withReplicas(1, people: 1, settings: settings) { replicas in
            let survivor = replicas.stores[0]
            // A second replica turns the reminder into a send, leases it for its attempt (two
            // minutes), and is killed before it records anything: its connections end.
            let killed = try await PostgresReminderStore.open(url: survivor.database.url, poolSize: 2, logger: Logger(label: "killed-replica"))
            let scheduled = try await replicas.libraries[0].sync([.water("p1", due: Self.start)], owner: "person-0", now: Self.start)
            let dead = Dispatcher(store: killed, channels: [], clock: replicas.clock, settings: settings, logger: Logger(label: "killed-replica"))
            let send = try #require(try dead.prepare(scheduled.map(\.id), now: Self.start).sends.first)
            #expect(try killed.claimSend(id: send, now: Self.start, until: Self.start + settings.lease.seconds))
            #expect(try !survivor.claimSend(id: send, now: Self.start + 1, until: Self.start + 121), "leased to a replica that is there")
            let key = try #require(try await survivor.read { data in try data.pendingSend(id: send) }).send.notification.id
            killed.database.close()
            // The survivor's sweep takes it seconds later, long before the lease would end.
            #expect(
                try await eventually(within: .seconds(60), every: .milliseconds(200)) {
                    // Time goes on, for 20 of the lease's 120 seconds (a step that failed on a
                    // loaded machine comes round again a second later).
                    if replicas.clock.now() < Self.start + 20 { replicas.clock.advance(by: 1) }
                    return replicas.receiver.received.count >= 1
                }, "sent by the survivor before the lease ends")
            #expect(replicas.clock.now() < Self.start + settings.lease.seconds)
            #expect(Set(replicas.receiver.received.map { $0.headers["webhook-id"] }) == [key])
        }
    }
}
