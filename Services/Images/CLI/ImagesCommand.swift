import ArgumentParser
import CanopyImages
import CanopyServiceKit

@main
struct ImagesCommand: MainCommand {
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
        subcommands: [ServeImages.self, Thumbnail.self, PaletteCommand.self, StatsCommand.self, HealthCommand<CanopyImages>.self])
}

/// What the shared subcommands (`health`, `serve`'s options) know of canopy-images.
enum CanopyImages: ServiceExecutable {
    static let name = "canopy-images"
    static let directoryName = "images"
    static let defaultListener = OperatingOptions.Defaults.images
}
