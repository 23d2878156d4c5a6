import Foundation

/// Canopy's provisioned Grafana dashboards (`deploy/grafana/dashboards/*.json`) read as their
/// PromQL queries, and checked against real scrapes: every series a query names, and every
/// label it groups or filters by, must be one the services export.
public enum GrafanaDashboards {
    /// One panel target's query.
    public struct Query: Sendable, CustomStringConvertible {
        public var dashboard: String
        public var panel: String
        public var expression: String
        public var description: String { "\(dashboard) › \(panel): \(expression)" }

        public init(dashboard: String, panel: String, expression: String) {
            (self.dashboard, self.panel, self.expression) = (dashboard, panel, expression)
        }
    }

    /// Why the dashboards could not be read: no dashboard files, a file that is not a dashboard,
    /// or a panel with no usable query.
    public struct Invalid: Error, CustomStringConvertible {
        public let description: String
    }

    /// Every query of every dashboard in `directory`. Throws when a file is not JSON, has no
    /// uid or title, or a panel's target has no expression or names another data source than
    /// the provisioned Prometheus (`datasourceUID`).
    public static func queries(in directory: URL, datasourceUID: String) throws -> [Query] {
        var queries: [Query] = []
        let files = try FileManager.default.contentsOfDirectory(at: directory, includingPropertiesForKeys: nil).filter { $0.pathExtension == "json" }
        guard !files.isEmpty else { throw Invalid(description: "no dashboards in \(directory.path)") }
        for file in files.sorted(by: { $0.path < $1.path }) {
            guard let dashboard = try JSONSerialization.jsonObject(with: Data(contentsOf: file)) as? [String: Any],
                let uid = dashboard["uid"] as? String, !uid.isEmpty, let title = dashboard["title"] as? String,
                let panels = dashboard["panels"] as? [[String: Any]]
            else {
                throw Invalid(description: "\(file.lastPathComponent) is not a dashboard with a uid, a title and panels")
            }
            for panel in panels where panel["type"] as? String != "row" {
                let name = panel["title"] as? String ?? "untitled"
                let targets = panel["targets"] as? [[String: Any]] ?? []
                guard !targets.isEmpty else { throw Invalid(description: "\(title) › \(name) has no queries") }
                for target in targets {
                    let source = (target["datasource"] as? [String: Any])?["uid"] as? String
                    guard source == datasourceUID, let expression = target["expr"] as? String, !expression.isEmpty else {
                        throw Invalid(description: "\(title) › \(name): every target needs an expression on the data source \(datasourceUID)")
                    }
                    queries.append(Query(dashboard: title, panel: name, expression: expression))
                }
            }
        }
        return queries
    }

    /// What in `queries` no scrape has: series names, and labels a query groups (`by (…)`) or
    /// filters (`{label="…"}`) by that none of its series carries. Empty when all is there.
    public static func problems(_ queries: [Query], scrapes: [PrometheusText]) -> [String] {
        let samples = scrapes.flatMap(\.samples)
        var problems: [String] = []
        for query in queries {
            let names = Set(matches(#"\bcanopy_[a-z0-9_]+"#, in: query.expression))
            guard !names.isEmpty else {
                problems.append("\(query): names no Canopy series")
                continue
            }
            var labels: Set<String> = []
            for name in names {
                let found = samples.filter { $0.name == name }
                if found.isEmpty { problems.append("\(query): no service exports \(name)") }
                for sample in found { labels.formUnion(sample.labels.keys) }
            }
            var used = Set(
                matches(#"\bby \(([a-z_, ]+)\)"#, in: query.expression, group: 1).flatMap {
                    $0.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
                })
            used.formUnion(matches(#"[{,]\s*([a-z_]+)\s*(?:=|!=|=~|!~)"#, in: query.expression, group: 1))
            for label in used.subtracting(labels).sorted() {
                problems.append("\(query): no series it names has the label \(label)")
            }
        }
        return problems
    }

    static func matches(_ pattern: String, in text: String, group: Int = 0) -> [String] {
        guard let expression = try? NSRegularExpression(pattern: pattern) else { return [] }
        return expression.matches(in: text, range: NSRange(text.startIndex..., in: text)).compactMap { match in
            Range(match.range(at: group), in: text).map { String(text[$0]) }
        }
    }
}
