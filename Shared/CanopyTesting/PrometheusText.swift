import Foundation

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// A scrape of Prometheus text (exposition format 0.0.4) read back into samples, so tests
/// check series by name and labels, in any label order, as Prometheus reads them.
public struct PrometheusText: Sendable {
    /// One sample: a series and its value.
    public struct Sample: Sendable, Equatable {
        public var name: String
        public var labels: [String: String]
        public var value: Double
    }

    /// A line that is not a comment, a blank or a sample.
    public struct ParseError: Error, CustomStringConvertible {
        public let description: String
    }

    /// Every sample, in the order written.
    public let samples: [Sample]
    /// The declared type of each metric family (`counter`, `gauge`, `histogram`, …).
    public let types: [String: String]

    /// Reads `text`; throws on the first line that is not valid exposition format.
    public init(_ text: String) throws {
        var samples: [Sample] = []
        var types: [String: String] = [:]
        for line in text.split(separator: "\n", omittingEmptySubsequences: true) {
            if line.hasPrefix("# TYPE ") {
                let parts = line.split(separator: " ")
                guard parts.count == 4 else { throw ParseError(description: "a TYPE line needs a name and a type: \(line)") }
                types[String(parts[2])] = String(parts[3])
                continue
            }
            if line.hasPrefix("#") { continue }
            samples.append(try Self.sample(line))
        }
        self.samples = samples
        self.types = types
    }

    private static func sample(_ line: Substring) throws -> Sample {
        let nameEnd = line.firstIndex { $0 == "{" || $0 == " " } ?? line.endIndex
        let name = String(line[..<nameEnd])
        guard !name.isEmpty, name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "_" || $0 == ":") }) else {
            throw ParseError(description: "not a metric name: \(line)")
        }
        var labels: [String: String] = [:]
        var rest = line[nameEnd...]
        if rest.first == "{" {
            guard let close = rest.lastIndex(of: "}") else { throw ParseError(description: "labels are not closed: \(line)") }
            var body = rest[rest.index(after: rest.startIndex)..<close]
            while !body.isEmpty {
                guard let equals = body.firstIndex(of: "="), body[body.index(after: equals)...].first == "\"" else {
                    throw ParseError(description: "a label is not name=\"value\": \(line)")
                }
                let key = String(body[..<equals])
                var index = body.index(equals, offsetBy: 2)
                var value = ""
                while index < body.endIndex, body[index] != "\"" {
                    if body[index] == "\\", body.index(after: index) < body.endIndex {
                        index = body.index(after: index)
                        value.append(body[index] == "n" ? "\n" : body[index])
                    } else {
                        value.append(body[index])
                    }
                    index = body.index(after: index)
                }
                guard index < body.endIndex else { throw ParseError(description: "a label value is not closed: \(line)") }
                labels[key] = value
                body = body[body.index(after: index)...]
                if body.first == "," { body = body.dropFirst() }
            }
            rest = rest[rest.index(after: close)...]
        }
        let fields = rest.split(separator: " ")
        guard let first = fields.first, let value = Double(first) ?? (first == "+Inf" ? .infinity : first == "-Inf" ? -.infinity : nil) else {
            throw ParseError(description: "no value: \(line)")
        }
        return Sample(name: name, labels: labels, value: value)
    }

    /// The value of the series `name` whose labels include `labels`, summed over the series
    /// that match (so leaving a label out adds up across it); `nil` when none matches.
    public func value(_ name: String, _ labels: [String: String] = [:]) -> Double? {
        let matching = samples.filter { sample in
            sample.name == name && labels.allSatisfy { sample.labels[$0.key] == $0.value }
        }
        return matching.isEmpty ? nil : matching.reduce(0) { $0 + $1.value }
    }

    /// How much the series grew since `earlier` (a missing series counts as 0). Every
    /// executable has one registry per process, and tests of one process run side by side,
    /// so tests compare growth, which other tests can only add to.
    public func growth(since earlier: PrometheusText, _ name: String, _ labels: [String: String] = [:]) -> Double {
        (value(name, labels) ?? 0) - (earlier.value(name, labels) ?? 0)
    }

    /// Whether any series of `name` was written.
    public func has(_ name: String) -> Bool {
        samples.contains { $0.name == name }
    }
}

/// Plain HTTP GETs of an operating listener, as Prometheus and health checks make them.
public enum OperatingProbe {
    /// `GET http://127.0.0.1:port/path`: the status and the body as text.
    public static func get(_ port: Int, _ path: String) async throws -> (status: Int, body: String) {
        let (data, response) = try await URLSession.shared.data(from: URL(string: "http://127.0.0.1:\(port)\(path)")!)
        return ((response as? HTTPURLResponse)?.statusCode ?? 0, String(decoding: data, as: UTF8.self))
    }

    /// `/metrics` read back as samples.
    public static func metrics(_ port: Int) async throws -> PrometheusText {
        let (status, body) = try await get(port, "/metrics")
        guard status == 200 else { throw PrometheusText.ParseError(description: "/metrics answered \(status)") }
        return try PrometheusText(body)
    }

    /// `/metrics` scraped until `condition` holds (series refreshed once a second need a
    /// moment), or the last scrape when it never does within `limit`.
    public static func metrics(_ port: Int, until condition: (PrometheusText) -> Bool, within limit: Duration = .seconds(10)) async throws -> PrometheusText {
        var scrape = try await metrics(port)
        _ = try await eventually(within: limit, every: .milliseconds(100)) {
            scrape = try await metrics(port)
            return condition(scrape)
        }
        return scrape
    }

    /// Asks `/health` until its status is `status`; false when it never is within `limit`.
    public static func waitForHealth(_ port: Int, status: Int, within limit: Duration = .seconds(30)) async throws -> Bool {
        try await eventually(within: limit, every: .milliseconds(50)) { (try? await get(port, "/health").status) == status }
    }
}
