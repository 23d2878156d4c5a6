// swift-tools-version: 6.1
//
// Canopy: the server side of a plant-care app, as message-bus microservices.
// See README.md for the picture and docs/ for the protocol, operations and performance.

import PackageDescription

let swiftSettings: [SwiftSetting] = [
    .swiftLanguageMode(.v6)
]

#if arch(arm64)
    let multiarch = "aarch64-linux-gnu"
#else
    let multiarch = "x86_64-linux-gnu"
#endif

/// A module of Shared/: one place each for what several executables share. `optimized`: its
/// pixel loops are compiled with -O in debug builds too (a photo's features take 4 ms instead of
/// 165 ms, so the tests' services answer within their deadlines under a parallel test run).
func shared(_ name: String, _ dependencies: [Target.Dependency] = [], optimized: Bool = false) -> Target {
    .target(
        name: name, dependencies: dependencies, path: "Shared/\(name)",
        swiftSettings: swiftSettings + (optimized ? [.unsafeFlags(["-O"], .when(configuration: .debug))] : []))
}

/// A service's module (Services/<directory>, but its CLI: Core/ with its handlers and rules,
/// Store/ with its store protocol and the SQLite and PostgreSQL twins, and the edge's folders
/// by concern) and its executable (Services/<directory>/CLI: `serve`, `health` and the
/// operator's commands), which links the module and what every executable links.
func service(
    _ directory: String, core: String, executable: String, dependencies: [Target.Dependency],
    executableDependencies: [Target.Dependency] = [], exclude: [String] = [], resources: [Resource]? = nil,
    plugins: [Target.PluginUsage]? = nil
) -> [Target] {
    [
        .target(
            name: core, dependencies: dependencies, path: "Services/\(directory)", exclude: ["CLI"] + exclude, resources: resources,
            swiftSettings: swiftSettings, plugins: plugins),
        .executableTarget(
            name: executable,
            dependencies: [.byName(name: core), "CanopyServiceKit", "CanopyBus", "CanopyMessages"] + executableDependencies,
            path: "Services/\(directory)/CLI", swiftSettings: swiftSettings),
    ]
}

/// A test suite in Tests/<name>.
func tests(_ name: String, _ dependencies: [Target.Dependency], resources: [Resource]? = nil) -> Target {
    .testTarget(name: name, dependencies: dependencies, path: "Tests/\(name)", resources: resources, swiftSettings: swiftSettings)
}

/// The products of other packages the targets use, by name.
enum P {
    static let argumentParser: Target.Dependency = .product(name: "ArgumentParser", package: "swift-argument-parser")
    static let asyncHTTPClient: Target.Dependency = .product(name: "AsyncHTTPClient", package: "async-http-client")
    static let collections: Target.Dependency = .product(name: "Collections", package: "swift-collections")
    static let crypto: Target.Dependency = .product(name: "Crypto", package: "swift-crypto")
    static let grdb: Target.Dependency = .product(name: "GRDB", package: "GRDB.swift")
    static let histogram: Target.Dependency = .product(name: "Histogram", package: "hdrhistogram-swift")
    static let httpTypes: Target.Dependency = .product(name: "HTTPTypes", package: "swift-http-types")
    static let hummingbird: Target.Dependency = .product(name: "Hummingbird", package: "hummingbird")
    static let hummingbirdHTTP2: Target.Dependency = .product(name: "HummingbirdHTTP2", package: "hummingbird")
    static let jwtKit: Target.Dependency = .product(name: "JWTKit", package: "jwt-kit")
    static let logging: Target.Dependency = .product(name: "Logging", package: "swift-log")
    /// Counts heap allocations (canopy-bench's per-request figure); linked into the benchmark only.
    static let mallocInterposer: Target.Dependency = .product(name: "MallocInterposerSwift", package: "malloc-interposer")
    static let metrics: Target.Dependency = .product(name: "Metrics", package: "swift-metrics")
    static let multipartKit: Target.Dependency = .product(name: "MultipartKit", package: "multipart-kit")
    static let nioCore: Target.Dependency = .product(name: "NIOCore", package: "swift-nio")
    static let nioHTTP1: Target.Dependency = .product(name: "NIOHTTP1", package: "swift-nio")
    static let nioPosix: Target.Dependency = .product(name: "NIOPosix", package: "swift-nio")
    static let nioSSL: Target.Dependency = .product(name: "NIOSSL", package: "swift-nio-ssl")
    static let openAPIHummingbird: Target.Dependency = .product(name: "OpenAPIHummingbird", package: "swift-openapi-hummingbird")
    static let openAPIRuntime: Target.Dependency = .product(name: "OpenAPIRuntime", package: "swift-openapi-runtime")
    static let postgresNIO: Target.Dependency = .product(name: "PostgresNIO", package: "postgres-nio")
    static let prometheus: Target.Dependency = .product(name: "Prometheus", package: "swift-prometheus")
    static let otel: Target.Dependency = .product(name: "OTel", package: "swift-otel")
    static let serviceLifecycle: Target.Dependency = .product(name: "ServiceLifecycle", package: "swift-service-lifecycle")
    static let tracing: Target.Dependency = .product(name: "Tracing", package: "swift-distributed-tracing")
    static let inMemoryTracing: Target.Dependency = .product(name: "InMemoryTracing", package: "swift-distributed-tracing")
    static let unixSignals: Target.Dependency = .product(name: "UnixSignals", package: "swift-service-lifecycle")
    static let x509: Target.Dependency = .product(name: "X509", package: "swift-certificates")
    static let yams: Target.Dependency = .product(name: "Yams", package: "Yams")
}

var targets: [Target] = [
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
    shared("CanopyMessages"),
    // Pixels: libvips started once, decoded images, OKLab, and the photo features
    // canopy-identify matches by (canopy-images and canopy-identify share it).
    shared("CanopyImaging", ["CVips", "CanopyMessages", P.crypto], optimized: true),
    // The IO layer: the libzmq binding (sockets, poller, mailbox, loop threads, CurveZMQ
    // keys) and the loop helpers every bus executable shares.
    shared("CanopyIO", ["CZeroMQ", "CanopyMessages", "CanopyWire", P.logging, P.metrics, P.serviceLifecycle]),
    // The wire codec: every canopy/3 and Majordomo message as a typed value.
    shared("CanopyWire", ["CanopyMessages", P.tracing]),
    // Capture files: what crossed the broker, written, read and pseudonymized.
    shared("CanopyCapture", ["CanopyWire", "CanopyMessages", P.crypto, P.histogram]),
    // Replay: a capture's requests sent again, their answers compared.
    shared("CanopyReplay", ["CanopyCapture", "CanopyBus", "CanopyWire", "CanopyMessages", "CZeroMQ", P.collections, P.histogram]),
    // What services and clients use: the typed client and the plug-in runtime.
    shared("CanopyBus", ["CanopyIO", "CanopyWire", "CanopyMessages", P.collections, P.logging, P.metrics, P.serviceLifecycle, P.tracing]),
    shared(
        "CanopyServiceKit",
        [
            "CanopyBus", P.argumentParser, P.hummingbird, P.logging, P.metrics, P.nioCore, P.otel, P.prometheus, P.serviceLifecycle,
            P.tracing, P.unixSignals,
        ]),
    shared("CanopyOutbound", ["CanopyMessages", P.nioCore, P.nioHTTP1, P.nioPosix, P.nioSSL]),
    shared(
        "CanopyTesting",
        [
            "CanopyBus", "CanopyBroker", "CanopyMessages", "CanopyServiceKit", "CanopyImaging", "CanopyStore", "CZeroMQ", P.crypto, P.hummingbird,
            P.jwtKit, P.logging, P.postgresNIO, P.serviceLifecycle,
        ]),

    // Made-up plant photos and multipart forms, as phones send them: for `canopy demo`,
    // the tests and the benchmark, never for anything from users.
    shared("CanopySamples", ["CVips", "CanopyImaging", "CanopyMessages"], optimized: true),
    // The services a whole stack runs (`canopy up`, docker-compose.yml, the deployment tests).
    shared("CanopyDeployment"),

    // Where a store keeps its data (SQLite, the embedded default, or PostgreSQL), and the one
    // way every store opens its SQLite file (pragmas, migrations).
    shared("CanopyStore", ["CanopyMessages", P.argumentParser, P.crypto, P.grdb, P.logging, P.postgresNIO, P.tracing]),
]

// MARK: - Services: each a module (Services/<Name>: Core/, Store/, …) and its executable (CLI/)

// The broker: routing state, its IO shell, CurveZMQ's broker side, and `build…`.
targets += service(
    "Broker", core: "CanopyBroker", executable: "canopy-broker",
    dependencies: [
        "CZeroMQ", "CanopyIO", "CanopyWire", "CanopyMessages", "CanopyCapture", "CanopyServiceKit", P.collections, P.histogram, P.logging,
        P.metrics, P.serviceLifecycle, P.tracing,
    ])
targets += service(
    "Images", core: "CanopyImages", executable: "canopy-images",
    dependencies: [
        "CVips", "CanopyImaging", "CanopyBus", "CanopyMessages", "CanopyServiceKit", "CanopyStore", "CanopyOutbound",
        P.crypto, P.grdb, P.logging, P.metrics, P.nioCore, P.nioHTTP1, P.nioPosix, P.nioSSL, P.postgresNIO, P.serviceLifecycle,
    ],
    executableDependencies: ["CanopyStore"])
targets += service(
    "Identify", core: "CanopyIdentify", executable: "canopy-identify",
    dependencies: [
        "CanopyImaging", "CanopyBus", "CanopyMessages", "CanopyServiceKit", "CanopyStore", P.asyncHTTPClient,
        P.crypto, P.grdb, P.logging, P.metrics, P.multipartKit, P.postgresNIO, P.serviceLifecycle,
    ],
    executableDependencies: ["CanopyImaging", "CanopyStore", P.logging])
targets += service(
    "Remind", core: "CanopyRemind", executable: "canopy-remind",
    dependencies: [
        "CanopyBus", "CanopyMessages", "CanopyServiceKit", "CanopyStore", "CanopyOutbound", P.asyncHTTPClient,
        P.collections, P.crypto, P.grdb, P.jwtKit, P.logging, P.metrics, P.nioSSL, P.postgresNIO, P.serviceLifecycle,
    ],
    executableDependencies: ["CanopyStore"])
// canopy-api: the HTTP API apps call, generated from its OpenAPI document
// (Core/openapi.yaml, which docs/openapi.yaml links to) by the generator's build plugin.
targets += service(
    "API", core: "CanopyAPI", executable: "canopy-api",
    dependencies: [
        "CanopyBus", "CanopyMessages", "CanopyServiceKit", "CanopyWire", "CanopyStore", "CanopyOutbound", P.crypto, P.grdb, P.httpTypes, P.hummingbird,
        P.jwtKit, P.logging, P.metrics, P.nioCore, P.nioHTTP1, P.openAPIHummingbird, P.openAPIRuntime, P.postgresNIO, P.serviceLifecycle,
    ],
    executableDependencies: ["CanopyStore"],
    plugins: [.plugin(name: "OpenAPIGenerator", package: "swift-openapi-generator")])
targets += service(
    "Care", core: "CanopyCare", executable: "canopy-care",
    dependencies: [
        "CanopyBus", "CanopyMessages", "CanopyServiceKit", "CanopyStore", P.collections, P.grdb, P.logging,
        P.metrics, P.postgresNIO, P.serviceLifecycle,
    ],
    executableDependencies: ["CanopyStore"],
    exclude: ["Tools"], resources: [.copy("Core/Resources/catalog.json")])

// MARK: - The operator's CLI, the benchmark, and the tests

targets += [
    .executableTarget(
        name: "canopy",
        dependencies: [
            "CanopySamples", "CanopyDeployment", "CanopyServiceKit", "CanopyBus", "CanopyMessages", "CanopyCapture",
            "CanopyReplay", "CanopyImaging", "CanopyStore", "CanopyCare", "CanopyRemind", "CanopyIdentify", "CanopyImages", "CanopyAPI",
            P.asyncHTTPClient, P.grdb, P.logging, P.nioCore, P.nioHTTP1,
        ], path: "Services/Canopy", swiftSettings: swiftSettings),
    .executableTarget(
        name: "canopy-bench",
        dependencies: [
            "CanopySamples", "CanopyDeployment", "CanopyOutbound", "CanopyBus", "CanopyBroker", "CZeroMQ", "CanopyMessages",
            "CanopyImages", "CanopyCare", "CanopyIdentify", "CanopyRemind", "CanopyImaging", "CVips", "CanopyServiceKit",
            "CanopyWire", "CanopyAPI", "CanopyCapture", "CanopyReplay", "CanopyStore", "CanopyTesting", P.argumentParser, P.asyncHTTPClient,
            P.collections, P.grdb, P.histogram, P.hummingbird, P.jwtKit, P.logging, P.mallocInterposer,
        ], path: "Benchmarks/BusBenchmark", swiftSettings: swiftSettings),
    // A worker process the live tests start and kill with SIGKILL.
    .executableTarget(
        name: "canopy-test-worker", dependencies: ["CanopyTesting", "CanopyServiceKit"], path: "Tests/TestWorker",
        swiftSettings: swiftSettings),

    // MARK: - Tests
    // A suite that names an executable gets it built, for the tests that run it as a process
    // or ask it for --help.

    tests("CanopyMessagesTests", ["CanopyMessages", "CanopyWire", "CanopyBus", "CanopyTesting"], resources: [.copy("Fixtures")]),
    tests(
        "CanopyImagesTests",
        [
            "CanopyOutbound", "CanopyImages", "CanopyImaging", "CVips", "CanopyBus", "CanopyBroker", "CanopyStore", "CanopyTesting",
            "CanopyServiceKit", "canopy-images", P.nioCore, P.nioHTTP1, P.nioPosix,
        ]),
    tests(
        "CanopyIdentifyTests",
        [
            "CanopySamples", "CanopyIdentify", "CanopyImaging", "CVips", "CanopyImages", "CanopyCare", "CanopyBus",
            "CanopyBroker", "CanopyStore", "CanopyTesting", "CanopyServiceKit", "canopy-identify", P.hummingbird, P.multipartKit,
        ]),
    tests(
        "CanopyRemindTests",
        [
            "CanopyOutbound", "CanopyRemind", "CanopyCare", "CanopyBus", "CanopyBroker", "CanopyStore", "CanopyTesting", "CanopyServiceKit",
            "canopy-remind", P.crypto, P.hummingbird, P.hummingbirdHTTP2, P.nioSSL, P.x509,
        ]),
    tests(
        "CanopyAPITests",
        [
            "CanopySamples", "CanopyAPI", "CanopyCare", "CanopyRemind", "CanopyImages", "CanopyIdentify", "CanopyImaging",
            "CanopyBus", "CanopyBroker", "CanopyTesting", "CanopyServiceKit", "CanopyCapture", "CanopyReplay", "CanopyMessages",
            "canopy-api", "CanopyOutbound", P.asyncHTTPClient, P.crypto, P.grdb, P.hummingbird, P.jwtKit, P.nioCore, P.nioHTTP1, P.postgresNIO,
            P.yams,
        ]),
    tests(
        "CanopyCareTests",
        [
            "CanopyCare", "CanopyImages", "CVips", "CanopyBus", "CanopyBroker", "CanopyStore", "CanopyTesting", "CanopyServiceKit", "canopy-care",
        ]),
    tests(
        "EndToEndTests",
        [
            "CanopySamples", "CanopyServiceKit", "CanopyStore", "CanopyTesting", "CanopyCapture", "CanopyReplay", "CanopyImaging",
            "canopy", "canopy-broker", "canopy-images", "canopy-care", "canopy-identify", "canopy-remind", "canopy-api",
            P.asyncHTTPClient, P.crypto, P.grdb, P.nioCore, P.nioHTTP1,
        ]),
    tests(
        "DeploymentTests",
        [
            "CanopySamples", "CanopyDeployment", "CanopyServiceKit", "CanopyStore", "CanopyTesting", "CanopyImaging", "CanopyCapture", "CanopyBus",
            "CanopyMessages", "canopy", "canopy-broker",
            "canopy-images", "canopy-care", "canopy-identify", "canopy-remind", "canopy-api", P.grdb, P.yams,
        ]),
    tests(
        "CanopyCaptureTests",
        [
            "CanopyCapture", "CanopyReplay", "CanopyBroker", "CanopyBus", "CanopyWire", "CanopyMessages", "CanopyTesting",
            "CanopyServiceKit", "canopy", "canopy-broker",
        ]),
    tests("CanopyStoreTests", ["CanopyStore", "CanopyMessages", "CanopyServiceKit", "CanopyTesting", P.grdb, P.postgresNIO]),
    tests(
        "CanopyBusTests",
        [
            "CanopyBus", "CanopyBroker", "CanopyTesting", "CanopyServiceKit", "CZeroMQ", "canopy", "canopy-broker",
            "canopy-test-worker", P.asyncHTTPClient, P.inMemoryTracing, P.nioCore, P.tracing, P.serviceLifecycle,
        ]),
]

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
        .executable(name: "canopy-api", targets: ["canopy-api"]),
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
        .package(url: "https://github.com/ordo-one/malloc-interposer", from: "1.6.1"),
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
        // canopy-api's server is generated from docs/openapi.yaml.
        .package(url: "https://github.com/apple/swift-openapi-generator", from: "1.14.3"),
        .package(url: "https://github.com/apple/swift-openapi-runtime", from: "1.13.4"),
        .package(url: "https://github.com/hummingbird-project/swift-openapi-hummingbird", from: "2.1.0"),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.8.0"),
        // The deployment tests read docker-compose.yml.
        .package(url: "https://github.com/jpsim/Yams", from: "6.2.2"),
        // PostgreSQL, for stores that several replicas share.
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.2"),
        // Traces: spans through swift-distributed-tracing, exported over OTLP/HTTP by swift-otel
        // (its gRPC exporter left out).
        .package(url: "https://github.com/apple/swift-distributed-tracing", from: "1.2.0"),
        .package(url: "https://github.com/swift-otel/swift-otel", from: "1.6.0", traits: ["OTLPHTTP"]),
    ],
    targets: targets
)
