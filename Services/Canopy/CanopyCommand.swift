import ArgumentParser
import CanopyServiceKit

@main
struct CanopyCommand: MainCommand {
    static let configuration = CommandConfiguration(
        commandName: "canopy",
        abstract: "Canopy's operator CLI: run the stack, call operations, look at the bus, capture and replay.",
        discussion: """
            Examples:
              canopy up
              canopy status
              canopy up --traces ./traces.jsonl && canopy trace
              canopy backup ./backups/monday
              canopy restore ./backups/monday --data-dir ./.canopy-monday
              canopy erasures list
              canopy migrate --from ./.canopy --to postgres://canopy@db:5432/canopy --originals-dir /mnt/photos
              canopy demo
              canopy services
              canopy stats --endpoint tcp://127.0.0.1:5555
              canopy send broker stats --json '{}'
              canopy send care plants.get --json '{"id":"p1"}' --principal user-42
              canopy keys generate broker --directory ./keys
              canopy capture inspect ./captures/monday
              canopy replay ./captures/monday --broker tcp://127.0.0.1:5555
            """,
        subcommands: [
            Up.self, Status.self, Logs.self, Down.self, Trace.self, Backup.self, Restore.self, Erasures.self, Migrate.self, Demo.self, Send.self, Services.self,
            Stats.self, Keys.self, Capture.self, Replay.self,
        ])
}
