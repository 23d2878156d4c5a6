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

    /// Issue 48's burst in small: 2,000 people's reminders due at the same instant, two
    /// replicas each holding all of them (as each loads every pending one at start): every
    /// one arrives, once. The replicas claim people in batches (a statement or two for many),
    /// and a person another replica holds at that moment is left to it.
    @Test func twoThousandRemindersDueAtOnceAreEachDeliveredOnceByTwoReplicas() async throws {
        var settings = DispatchSettings()
        settings.digestWindow = .zero
        try await withReplicas(2, people: 0, settings: settings) { replicas in
            let people = (0..<2_000).map { "burst-\($0)" }
            let hook = try await replicas.receiver.url("/hooks/burst")
            let due = (Self.start + 60).timeIntervalSince1970
            let secret = "whsec_" + Data(repeating: 7, count: 32).base64EncodedString()
            let scheduled = try replicas.stores[0].database.write { session in
                try session.execute(
                    """
                    INSERT INTO devices (id, owner, channel, address, secret, active, registeredAt)
                    SELECT 'd-' || person, person, 'webhook', \(hook), \(secret), true, 0 FROM unnest(\(people)) AS person
                    """)
                return try session.rows(
                    """
                    INSERT INTO reminders (owner, taskID, due, plantID, kind, title, fireAt, state, updatedAt)
                    SELECT person, 'p-' || person || ':water', \(due), 'p-' || person, 'water', 'Water it', \(due), 'pending', 0
                    FROM unnest(\(people)) AS person RETURNING id
                    """
                ).map { (id: try $0.column("id").decode(Int64.self), fireAt: due) }
            }
            for dispatcher in replicas.dispatchers { dispatcher.schedule(scheduled) }
            replicas.clock.advance(by: 60)
            #expect(
                try await eventually(within: .seconds(120), every: .milliseconds(100)) {
                    replicas.clock.advance(by: 0.1) // a step that failed comes round again
                    return replicas.receiver.received.count >= 2_000
                }, "\(replicas.receiver.received.count) of 2,000 arrived")
            #expect(try await !eventually(within: .milliseconds(500)) { replicas.receiver.received.count > 2_000 }, "no second copy arrives")
            let ids = replicas.receiver.received.compactMap { $0.headers["webhook-id"] }
            #expect(ids.count == 2_000 && Set(ids).count == 2_000, "\(ids.count) requests, \(Set(ids).count) ids")
            #expect(
                try await eventually {
                    try replicas.stores[1].database.read { session in
                        try session.value(Int.self, "SELECT COUNT(*) FROM reminders WHERE state = 'delivered'") == 2_000
                    }
                }, "each recorded delivered")
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
            // (A dispatcher that does not run: its sends go nowhere, as a hung replica's. Its
            // store stays connected.)
            let hung = try await PostgresReminderStore.open(url: store.database.url, poolSize: 2, logger: Logger(label: "hung-replica"))
            defer { hung.database.close() }
            let dead = Dispatcher(store: hung, channels: [], clock: replicas.clock, settings: settings, logger: Logger(label: "hung-replica"))
            let (sends, _) = try await dead.prepare(scheduled.map(\.id), now: Self.start + 1)
            let send = try #require(sends.first)
            #expect(try hung.claimSend(id: send, now: Self.start + 1, until: Self.start + 30))
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
            let send = try #require(try await dead.prepare(scheduled.map(\.id), now: Self.start).sends.first)
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

    /// A replica behind on its own reminders (the morning burst) still takes over at once what
    /// a killed replica was sending: before, it looked for others' work only once it had
    /// caught up (23–25 s later in issue 48's burst).
    @Test func aKilledReplicasSendIsTakenOverAtOnceEvenByAReplicaThatIsBehind() async throws {
        var settings = DispatchSettings()
        settings.digestWindow = .zero
        try await withReplicas(1, people: 2, settings: settings) { replicas in
            let survivor = replicas.stores[0]
            let killed = try await PostgresReminderStore.open(url: survivor.database.url, poolSize: 2, logger: Logger(label: "killed-replica"))
            // The killed replica's send, leased to it.
            let theirs = try await replicas.libraries[0].sync([.water("p1", due: Self.start)], owner: "person-0", now: Self.start)
            let dead = Dispatcher(store: killed, channels: [], clock: replicas.clock, settings: settings, logger: Logger(label: "killed-replica"))
            let send = try #require(try await dead.prepare(theirs.map(\.id), now: Self.start).sends.first)
            let key = try #require(try await survivor.read { data in try data.pendingSend(id: send) }).send.notification.id
            killed.database.close()
            // The survivor's own reminder, due 5 s after the start: once the clock has moved
            // 10 s on, the survivor is more than the orphan grace (2 s) behind when it looks.
            let own = try await replicas.libraries[0].sync([.water("p2", due: Self.start + 5)], owner: "person-1", now: Self.start)
            replicas.dispatchers[0].schedule(own)
            replicas.clock.advance(by: 10) // and it stays there
            #expect(
                try await eventually(within: .seconds(30)) {
                    replicas.receiver.received.contains { $0.headers["webhook-id"] == key }
                }, "the killed replica's send, taken over in the first look")
            #expect(replicas.receiver.received.filter { $0.headers["webhook-id"] == key }.count == 1)
        }
    }
}
