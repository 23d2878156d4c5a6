// swift-tools-version: 6.0
//
// Canopy: the server side of a plant-care app, as message-bus microservices.
// See README.md for the picture and docs/ for the protocol, operations and performance.

import PackageDescription

let swiftSettings: [SwiftSetting] = [
    .swiftLanguageMode(.v6),
]

#if arch(arm64)
let multiarch = "aarch64-linux-gnu"
#else
let multiarch = "x86_64-linux-gnu"
#endif

let package = Package(
    name: "Canopy",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "canopy-broker", targets: ["canopy-broker"]),
        .executable(name: "canopy", targets: ["canopy"]),
        .executable(name: "canopy-images", targets: ["canopy-images"]),
        .executable(name: "canopy-care", targets: ["canopy-care"]),
        .executable(name: "canopy-identify", targets: ["canopy-identify"]),
        .executable(name: "canopy-remind", targets: ["canopy-remind"]),
        .executable(name: "canopy-batch", targets: ["canopy-batch"]),
        .library(name: "CanopyMessages", targets: ["CanopyMessages"]),
        .library(name: "CanopyBus", targets: ["CanopyBus"]),
        .library(name: "CanopyBroker", targets: ["CanopyBroker"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-collections", from: "1.6.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift", from: "0.2.0"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        // jwt-kit (APNs tokens in canopy-remind, API tokens later) needs swift-crypto 4.
        .package(url: "https://github.com/apple/swift-crypto", "4.1.0"..<"5.0.0"),
        .package(url: "https://github.com/vapor/jwt-kit", from: "5.7.1"),
        // Tests make the certificates of their local TLS servers with it.
        .package(url: "https://github.com/apple/swift-certificates", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/vapor/multipart-kit", from: "4.7.1"),
        // canopy-batch's server is generated from docs/openapi.yaml.
        .package(url: "https://github.com/apple/swift-openapi-generator", from: "1.14.3"),
        .package(url: "https://github.com/apple/swift-openapi-runtime", from: "1.13.4"),
        .package(url: "https://github.com/hummingbird-project/swift-openapi-hummingbird", from: "2.1.0"),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.8.0"),
        // The deployment tests read docker-compose.yml.
        .package(url: "https://github.com/jpsim/Yams", from: "6.2.2"),
    ],
    targets: [
        // MARK: - Shared modules

        // libzmq from Debian's libzmq3-dev (scripts/setup checks it with `pkg-config --exists
        // libzmq` and installs it). The target does not name `pkgConfig: "libzmq"`: Debian's
        // libzmq.pc pulls krb5's `-isystem` flags in through Requires.private, which SwiftPM
        // refuses with a warning on every build; zmq.h is in /usr/include either way.
        .systemLibrary(
            name: "CZeroMQ",
            path: "Shared/CZeroMQ",
            providers: [.apt(["libzmq3-dev"])]
        ),
        // libvips from Debian's libvips-dev, behind a small C shim: Swift cannot call C
        // variadic functions, and the shim keeps glib's headers out of Swift.
        .target(
            name: "CVips",
            path: "Shared/CVips",
            cSettings: [.unsafeFlags(["-I/usr/include/glib-2.0", "-I/usr/lib/\(multiarch)/glib-2.0/include"])],
            linkerSettings: [.linkedLibrary("vips"), .linkedLibrary("gobject-2.0"), .linkedLibrary("glib-2.0")]
        ),
        .target(
            name: "CanopyMessages",
            path: "Shared/CanopyMessages",
            swiftSettings: swiftSettings
        ),
        // Pixels: libvips started once, decoded images, OKLab, and the photo features
        // canopy-identify matches by (canopy-images and canopy-identify share it).
        .target(
            name: "CanopyImaging",
            dependencies: ["CVips", "CanopyMessages", .product(name: "Crypto", package: "swift-crypto")],
            path: "Shared/CanopyImaging",
            swiftSettings: swiftSettings
        ),
        // The IO layer: the libzmq binding (sockets, poller, mailbox, loop threads, CurveZMQ
        // keys) and the loop helpers every bus executable shares.
        .target(
            name: "CanopyIO",
            dependencies: [
                "CZeroMQ", "CanopyMessages",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            path: "Shared/CanopyIO",
            swiftSettings: swiftSettings
        ),
        // The wire codec: every canopy/1 and Majordomo message as a typed value.
        .target(
            name: "CanopyWire",
            dependencies: ["CanopyMessages"],
            path: "Shared/CanopyWire",
            swiftSettings: swiftSettings
        ),
        // Capture files: what crossed the broker, written, read and pseudonymized.
        .target(
            name: "CanopyCapture",
            dependencies: [
                "CanopyWire", "CanopyMessages",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
            ],
            path: "Shared/CanopyCapture",
            swiftSettings: swiftSettings
        ),
        // Replay: a capture's requests sent again, their answers compared.
        .target(
            name: "CanopyReplay",
            dependencies: [
                "CanopyCapture", "CanopyBus", "CanopyWire", "CanopyMessages", "CZeroMQ",
                .product(name: "Histogram", package: "hdrhistogram-swift"),
                .product(name: "Collections", package: "swift-collections"),
            ],
            path: "Shared/CanopyReplay",
            swiftSettings: swiftSettings
        ),
        // What services and clients use: the typed client and the plug-in runtime.
        .target(
            name: "CanopyBus",
            dependencies: [
                "CanopyIO", "CanopyWire", "CanopyMessages",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Collections", package: "swift-collections"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Shared/CanopyBus",
            swiftSettings: swiftSettings
        ),
        // The broker: routing state, its IO shell, and CurveZMQ's broker side.
        .target(
            name: "CanopyBroker",
            dependencies: [
                "CZeroMQ", "CanopyIO", "CanopyWire", "CanopyMessages", "CanopyCapture",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Collections", package: "swift-collections"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Shared/CanopyBroker",
            swiftSettings: swiftSettings
        ),
        .target(
            name: "CanopyServiceKit",
            dependencies: [
                "CanopyBus",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            path: "Shared/CanopyServiceKit",
            swiftSettings: swiftSettings
        ),
        .target(
            name: "CanopyOutbound",
            dependencies: [
                "CanopyMessages",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            path: "Shared/CanopyOutbound",
            swiftSettings: swiftSettings
        ),
        .target(
            name: "CanopyTesting",
            dependencies: [
                "CanopyBus", "CanopyBroker", "CanopyMessages", "CanopyServiceKit", "CanopyImaging", "CZeroMQ",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Hummingbird", package: "hummingbird"),
            ],
            path: "Shared/CanopyTesting",
            swiftSettings: swiftSettings
        ),

        // Made-up plant photos and multipart forms, as phones send them: for `canopy demo`,
        // the tests and the benchmark, never for anything from users.
        .target(
            name: "CanopySamples",
            dependencies: ["CVips", "CanopyImaging", "CanopyMessages"],
            path: "Shared/CanopySamples",
            swiftSettings: swiftSettings
        ),
        // The services a whole stack runs (`canopy up`, docker-compose.yml, the deployment tests).
        .target(
            name: "CanopyDeployment",
            path: "Shared/CanopyDeployment",
            swiftSettings: swiftSettings
        ),

        // The one way every store opens its SQLite file (pragmas, migrations).
        .target(
            name: "CanopyStore",
            dependencies: [.product(name: "GRDB", package: "GRDB.swift")],
            path: "Shared/CanopyStore",
            swiftSettings: swiftSettings
        ),

        // MARK: - Executables

        .target(
            name: "MessageBroker",
            dependencies: [
                "CanopyBroker", "CanopyServiceKit",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Services/Broker/Core",
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "canopy-broker",
            dependencies: ["MessageBroker", "CanopyBroker", "CanopyServiceKit", "CanopyMessages"],
            path: "Services/Broker/CLI",
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ImageCache",
            dependencies: [
                "CVips", "CanopyImaging", "CanopyBus", "CanopyMessages", "CanopyServiceKit", "CanopyStore", "CanopyOutbound",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Services/ImageCache/Core",
            swiftSettings: swiftSettings
        ),
        .target(
            name: "Identification",
            dependencies: [
                "CanopyImaging", "CanopyBus", "CanopyMessages", "CanopyServiceKit", "CanopyStore",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "MultipartKit", package: "multipart-kit"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Services/Identification/Core",
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "canopy-identify",
            dependencies: ["Identification", "CanopyImaging", "CanopyServiceKit", "CanopyBus", "CanopyMessages"],
            path: "Services/Identification/CLI",
            swiftSettings: swiftSettings
        ),
        .target(
            name: "Reminders",
            dependencies: [
                "CanopyBus", "CanopyMessages", "CanopyServiceKit", "CanopyStore", "CanopyOutbound",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Collections", package: "swift-collections"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Services/Reminders/Core",
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "canopy-remind",
            dependencies: ["Reminders", "CanopyServiceKit", "CanopyBus", "CanopyMessages"],
            path: "Services/Reminders/CLI",
            swiftSettings: swiftSettings
        ),
        // canopy-batch: the HTTP API apps call, generated from its OpenAPI document
        // (Core/openapi.yaml, which docs/openapi.yaml links to) by the generator's build plugin.
        .target(
            name: "RequestBatching",
            dependencies: [
                "CanopyBus", "CanopyMessages", "CanopyServiceKit",
                .product(name: "OpenAPIRuntime", package: "swift-openapi-runtime"),
                .product(name: "OpenAPIHummingbird", package: "swift-openapi-hummingbird"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Services/RequestBatching/Core",
            swiftSettings: swiftSettings,
            plugins: [.plugin(name: "OpenAPIGenerator", package: "swift-openapi-generator")]
        ),
        .executableTarget(
            name: "canopy-batch",
            dependencies: ["RequestBatching", "CanopyServiceKit", "CanopyBus", "CanopyMessages"],
            path: "Services/RequestBatching/CLI",
            swiftSettings: swiftSettings
        ),
        .target(
            name: "CareScheduling",
            dependencies: [
                "CanopyBus", "CanopyMessages", "CanopyServiceKit", "CanopyStore",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Collections", package: "swift-collections"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Services/CareScheduling/Core",
            resources: [.copy("Resources/catalog.json")],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "canopy-care",
            dependencies: ["CareScheduling", "CanopyServiceKit", "CanopyBus", "CanopyMessages"],
            path: "Services/CareScheduling/CLI",
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "canopy-images",
            dependencies: ["ImageCache", "CanopyServiceKit", "CanopyBus", "CanopyMessages"],
            path: "Services/ImageCache/CLI",
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "canopy",
            dependencies: [
                "CanopySamples", "CanopyDeployment",
                "CanopyServiceKit", "CanopyBus", "CanopyMessages", "CanopyCapture", "CanopyReplay", "CanopyImaging",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            path: "Services/Canopy",
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "canopy-bench",
            dependencies: [
                "CanopySamples", "CanopyDeployment",
                "CanopyOutbound",
                "CanopyBus", "CanopyBroker", "CZeroMQ", "CanopyMessages", "ImageCache", "CareScheduling", "Identification", "Reminders", "CanopyImaging", "CVips",
                "CanopyServiceKit", "CanopyWire", "RequestBatching", "CanopyCapture", "CanopyReplay",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Collections", package: "swift-collections"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
            ],
            path: "Benchmarks/BusBenchmark",
            swiftSettings: swiftSettings
        ),
        // A worker process the live tests start and kill with SIGKILL.
        .executableTarget(
            name: "canopy-test-worker",
            dependencies: ["CanopyTesting", "CanopyServiceKit"],
            path: "Tests/TestWorker",
            swiftSettings: swiftSettings
        ),

        // MARK: - Tests

        .testTarget(
            name: "CanopyMessagesTests",
            dependencies: ["CanopyMessages", "CanopyWire", "CanopyBus", "CanopyTesting"],
            path: "Tests/CanopyMessagesTests",
            resources: [.copy("Fixtures")],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ImageCacheTests",
            dependencies: [
                "CanopyOutbound",
                "ImageCache", "CanopyImaging", "CVips", "CanopyBus", "CanopyBroker", "CanopyTesting", "CanopyServiceKit", "canopy-images",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            path: "Tests/ImageCacheTests",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "IdentificationTests",
            dependencies: [
                "CanopySamples",
                "Identification", "CanopyImaging", "CVips", "ImageCache", "CareScheduling", "CanopyBus", "CanopyBroker", "CanopyTesting",
                "CanopyServiceKit", "canopy-identify",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "MultipartKit", package: "multipart-kit"),
            ],
            path: "Tests/IdentificationTests",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ReminderTests",
            dependencies: [
                "CanopyOutbound",
                "Reminders", "CareScheduling", "CanopyBus", "CanopyBroker", "CanopyTesting", "CanopyServiceKit", "canopy-remind",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdHTTP2", package: "hummingbird"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            path: "Tests/ReminderTests",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "RequestBatchingTests",
            dependencies: [
                "CanopySamples",
                "RequestBatching", "CareScheduling", "Reminders", "ImageCache", "Identification", "CanopyImaging", "CanopyBus", "CanopyBroker", "CanopyTesting",
                "CanopyServiceKit", "CanopyCapture", "CanopyReplay", "CanopyMessages", "canopy-batch",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Yams", package: "Yams"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            path: "Tests/RequestBatchingTests",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "CareSchedulingTests",
            dependencies: ["CareScheduling", "ImageCache", "CVips", "CanopyBus", "CanopyBroker", "CanopyTesting", "CanopyServiceKit", "canopy-care"],
            path: "Tests/CareSchedulingTests",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "EndToEndTests",
            dependencies: [
                "CanopySamples",
                "CanopyServiceKit", "CanopyTesting", "CanopyCapture", "CanopyReplay", "CanopyImaging",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                // The stack's processes.
                "canopy", "canopy-broker", "canopy-images", "canopy-care", "canopy-identify", "canopy-remind", "canopy-batch",
            ],
            path: "Tests/EndToEndTests",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "DeploymentTests",
            dependencies: [
                "CanopySamples", "CanopyDeployment",
                "CanopyServiceKit", "CanopyTesting", "CanopyImaging",
                .product(name: "Yams", package: "Yams"),
                .product(name: "GRDB", package: "GRDB.swift"),
                // Built for the tests that ask them for --help.
                "canopy", "canopy-broker", "canopy-images", "canopy-care", "canopy-identify", "canopy-remind", "canopy-batch",
            ],
            path: "Tests/DeploymentTests",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "CanopyCaptureTests",
            dependencies: [
                "CanopyCapture", "CanopyReplay", "CanopyBroker", "CanopyBus", "CanopyWire", "CanopyMessages", "CanopyTesting", "CanopyServiceKit",
                // Built for the tests that run them as processes.
                "canopy", "canopy-broker",
            ],
            path: "Tests/CanopyCaptureTests",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "CanopyBusTests",
            dependencies: [
                "CanopyBus", "CanopyBroker", "CanopyTesting", "CanopyServiceKit", "CZeroMQ", "MessageBroker",
                // Built for the tests that run them as processes.
                "canopy-test-worker", "canopy", "canopy-broker",
            ],
            path: "Tests/CanopyBusTests",
            swiftSettings: swiftSettings
        ),
    ]
)
