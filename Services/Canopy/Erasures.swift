import ArgumentParser
import CanopyAPI
import CanopyBus
import CanopyDeployment
import CanopyMessages
import CanopyServiceKit
import CanopyStore
import Foundation
import Logging

/// `canopy erasures`: the accounts deleted, and their deletion applied again to stores
/// restored from a backup taken before it.
struct Erasures: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the accounts deleted, and delete them again from stores restored from an older backup.",
        discussion: """
            canopy-api records every account deletion as the person's sign-out digest (a keyed
            hash of their id under the token key) and its time, never the id. A backup taken
            before a deletion still holds the person: after restoring one, run
            canopy erasures apply on the running stack, which finds the people whose digests
            are listed and deletes their accounts again (every service forgets them).
            Examples:
              canopy erasures list --data-dir ./.canopy
              canopy erasures list --since 2026-11-25 --digests > erased.txt
              canopy erasures apply --data-dir ./.canopy
              canopy erasures apply --data-dir ./.canopy --digests-file erased.txt
            """,
        subcommands: [List.self, Apply.self])

    /// Where the erasures are kept: canopy-api's store in the data directory, or PostgreSQL.
    struct Source: ParsableArguments {
        @OptionGroup var stack: StackOptions
        @OptionGroup var database: DatabaseOptions
        @Option(help: ArgumentHelp("Only erasures from this moment on (2026-11-25 or 2026-11-25T09:00:00Z, UTC): the backup's time.", valueName: "date"))
        var since: String?

        func validate() throws {
            if let since, Self.date(since) == nil {
                throw ValidationError("--since \(since.prefix(40)) is not a date; write 2026-11-25 or 2026-11-25T09:00:00Z")
            }
        }

        static func date(_ text: String) -> Date? {
            if let date = MessageCodec.date(from: text) { return date } // a backup's cutAt, as backup.json has it
            let formatter = ISO8601DateFormatter()
            if let date = formatter.date(from: text) { return date }
            formatter.formatOptions = [.withFullDate]
            return formatter.date(from: text)
        }

        /// canopy-api's store, which must exist already (nothing is made here).
        func store() async throws -> any APIStoring {
            let postgres = try database.postgres()
            let directory = stack.layout.dataDirectory.appendingPathComponent(CanopyAPIStore.directoryName)
            if postgres == nil {
                let path = directory.appendingPathComponent(CanopyAPIStore.fileName).path
                if Migrate.storeFile(CanopyAPIStore.directoryName, in: stack.layout.dataDirectory).path != path {
                    throw CommandFailure(
                        "canopy-api's store in \(stack.layout.dataDirectory.path) is still batch/batch.sqlite (from before canopy-batch was named canopy-api); start the stack once (canopy up) so canopy-api moves it, then run this again"
                    )
                }
                guard FileManager.default.fileExists(atPath: path) else {
                    throw CommandFailure(
                        "no canopy-api store in \(directory.path); name the stack's data directory with --data-dir (canopy status shows it), or --database-url")
                }
                try Backup.checkStores(in: stack.layout.dataDirectory) // another program's file is named, never opened for writing
            }
            var logger = Logger(label: "canopy-erasures")
            logger.logLevel = .error
            do {
                return try await openAPIStore(directory: directory, postgres: postgres, logger: logger)
            } catch let failure as PostgresStore.Failure {
                throw CommandFailure(failure.description)
            }
        }

        func erasures(_ store: any APIStoring) throws -> [Erasure] {
            let from = since.flatMap(Self.date) ?? .distantPast
            return try store.erasures().filter { $0.at >= from }
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List the accounts deleted: when, and the person's digest.",
            discussion: "Example: canopy erasures list --data-dir ./.canopy --since 2026-11-25")

        @OptionGroup var source: Source
        @Flag(help: "Print only the digests, one a line (the file canopy erasures apply --digests-file reads).") var digests = false

        func run() async throws {
            let erasures = try source.erasures(try await source.store())
            if digests {
                for erasure in erasures { print(erasure.digest) }
                return
            }
            guard !erasures.isEmpty else {
                print(source.since.map { "no account was deleted since \($0)" } ?? "no account was deleted")
                return
            }
            var table = Table("DELETED AT (UTC)", "DIGEST")
            for erasure in erasures { table.append([MessageCodec.string(from: erasure.at), erasure.digest]) }
            print(table.render())
            print(
                "\(erasures.count) account\(erasures.count == 1 ? "" : "s") deleted; after restoring a backup older than one of them, run canopy erasures apply"
            )
        }
    }

    struct Apply: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete again, on the running stack, every listed account that its stores (restored from a backup) still hold.",
            discussion: """
                Reads the erasures (canopy-api's store, or --digests-file), finds everyone the
                stack's stores hold data of whose digest under the token key is listed, and for
                each deletes the account again through canopy-care (care.account.delete, which has
                every other service forget them) and canopy-api's idempotency records, and
                records the sign-out again. Run it with the stack up (canopy up --data-dir DIR).
                Example: canopy erasures apply --data-dir ./.canopy
                """)

        @OptionGroup var source: Source
        @OptionGroup var common: CommonOptions
        @Option(
            help: ArgumentHelp("The digests to apply, one a line (canopy erasures list --digests), instead of canopy-api's store's list.", valueName: "file"))
        var digestsFile: String?
        @Option(help: ArgumentHelp("canopy-api's token signing key (default: <data-dir>/token.key); repeat for keys rotated out.", valueName: "file"))
        var tokenKeyFile: [String] = []

        func run() async throws {
            let store = try await source.store()
            let listed: [String]
            if let digestsFile {
                guard let text = try? String(contentsOfFile: digestsFile, encoding: .utf8) else {
                    throw CommandFailure("cannot read --digests-file \(digestsFile); write it with canopy erasures list --digests > FILE")
                }
                listed = text.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
                if let bad = listed.first(where: { $0.count != 64 || !$0.allSatisfy(\.isHexDigit) }) {
                    throw CommandFailure(
                        "--digests-file has '\(bad.prefix(70))', which is not a digest (64 hex digits); write it with canopy erasures list --digests")
                }
            } else {
                listed = try source.erasures(store).map(\.digest)
            }
            guard !listed.isEmpty else {
                print("no erasures to apply")
                return
            }
            let keyFiles = tokenKeyFile.isEmpty ? [source.stack.layout.tokenKey.path] : tokenKeyFile
            let keys: [[UInt8]]
            do {
                keys = try keyFiles.map { file throws(CanopyError) in try TokenAuthority.key(file: file, value: nil) }
            } catch {
                throw CommandFailure("\(error.message); name canopy-api's token key with --token-key-file")
            }
            let digests = SignOutDigest(tokenKeys: keys)
            let wanted = Set(listed)

            // Everyone the stores hold data of, and which of them were erased.
            var people: Set<String> = []
            if let shared = try peopleInSharedDatabase(store) {
                people = shared
            } else {
                for service in CanopyStack.services {
                    guard let file = service.store else { continue }
                    let path = source.stack.layout.dataDirectory.appendingPathComponent(file).path
                    if FileManager.default.fileExists(atPath: path) { people.formUnion(try StoreOwners.people(inStoreAt: path)) }
                }
            }
            let erased = people.compactMap { person in digests.candidates(person).first(where: wanted.contains).map { (person, $0) } }
                .sorted { $0.1 < $1.1 }
            guard !erased.isEmpty else {
                print(
                    "none of the \(wanted.count) erased account\(wanted.count == 1 ? " is" : "s are") in these stores (\(people.count) people); nothing to do"
                        + " (digests are keyed by the token key: under another key than the one in force when they were recorded, none can match; name it with --token-key-file)"
                )
                return
            }

            var table = Table("DIGEST", "PLANTS", "RESULT")
            var progress = ProgressLine()
            var failed = 0
            try await withBus(common, stack: source.stack) { bus in
                for (index, (person, digest)) in erased.enumerated() {
                    progress.update("erasing \(ProgressLine.bar(index, of: erased.count)) \(index)/\(erased.count)")
                    do {
                        try store.signOut(digest: digest, before: Date().addingTimeInterval(1), erasure: true)
                        let reply = try await bus.call(Care.DeleteAccount.self, .init(), principal: person, timeout: .seconds(30))
                        try await store.forgetKeys(of: person)
                        table.append([String(digest.prefix(16)), "\(reply.plants)", "deleted again; the other services told"])
                    } catch {
                        failed += 1
                        table.append([String(digest.prefix(16)), "", "failed: \((error as? CanopyError)?.message ?? "\(error)")"])
                    }
                }
            }
            store.eraseResidue()
            progress.finish()
            print(table.render())
            guard failed == 0 else {
                throw CommandFailure(
                    "\(failed) of \(erased.count) accounts were not deleted again; check that the stack runs (canopy status) and run this again")
            }
            print(
                "\(erased.count) account\(erased.count == 1 ? "" : "s") deleted again (of \(wanted.count) erasures listed); each service's follow-up is delivered by canopy-care's outbox"
            )
        }
    }
}
