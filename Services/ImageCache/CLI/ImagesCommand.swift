import ArgumentParser
import CanopyServiceKit
import ImageCache

@main
struct ImagesCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "canopy-images",
        abstract: "Canopy's image service: photo store, variants, two-tier cache and colour palettes on libvips.",
        discussion: """
            Examples:
              canopy-images serve --endpoint tcp://127.0.0.1:5555 --data-dir ./.canopy
              canopy-images thumbnail photo.jpg -o thumb.jpg --size 150
              canopy-images palette photo.jpg
              canopy-images stats --endpoint tcp://127.0.0.1:5555
              canopy-images health --metrics-bind 127.0.0.1:9401
            """,
        subcommands: [ServeImages.self, Thumbnail.self, PaletteCommand.self, StatsCommand.self, HealthImages.self])
}

/// `canopy-images health`: asks the running service's `/health`; exit 0 or 1.
struct HealthImages: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "health",
        abstract: "Exit 0 when the running canopy-images is healthy (registered with its broker), 1 when not (for container health checks).",
        discussion: "Example: canopy-images health --metrics-bind 127.0.0.1:9401")

    @OptionGroup var operating: OperatingOptions

    func run() async throws {
        try await HealthProbe.run(operating, default: OperatingOptions.Defaults.images)
    }
}
