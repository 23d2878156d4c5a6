import CanopyImaging

/// The nearest reference photos to a query without comparing against every one: a
/// vantage-point tree over ``PhotoFeatures/distance(to:)``, which is a metric.
///
/// Each node holds one photo (its vantage point) and the median distance from it to the
/// photos below; nearer ones go inside, the rest outside. A search keeps the best `k` found
/// so far and skips a side whenever the triangle inequality says nothing there can beat the
/// `k`-th best. Built once per reference generation, read by any number of tasks at once.
public struct ReferenceIndex: Sendable {
    private struct Node: Sendable {
        var item: Int32
        var radius: Float
        var inside: Int32
        var outside: Int32
    }

    /// The photos' features, in the order given (``Neighbour/item`` indexes into it).
    public let items: [PhotoFeatures]
    private var nodes: [Node] = []
    private var root: Int32 = -1

    /// A photo found near the query.
    public struct Neighbour: Sendable, Equatable {
        public var item: Int
        public var distance: Float
    }

    public init(_ items: [PhotoFeatures]) {
        self.items = items
        nodes.reserveCapacity(items.count)
        var order = Array(0..<Int32(items.count))
        var generator = SplitMix(seed: 0x5EED)
        root = build(&order, 0..<order.count, &generator)
    }

    /// Builds the subtree over `order[range]`; returns its node, or -1 when empty.
    private mutating func build(_ order: inout [Int32], _ range: Range<Int>, _ generator: inout SplitMix) -> Int32 {
        guard !range.isEmpty else { return -1 }
        // A random vantage point keeps the tree balanced whatever order the photos came in.
        order.swapAt(range.lowerBound, range.lowerBound + Int(generator.next() % UInt64(range.count)))
        let vantage = order[range.lowerBound]
        let node = Int32(nodes.count)
        nodes.append(Node(item: vantage, radius: 0, inside: -1, outside: -1))
        let rest = (range.lowerBound + 1)..<range.upperBound
        guard !rest.isEmpty else { return node }
        let point = items[Int(vantage)]
        var distances = order[rest].map { (item: $0, distance: point.distance(to: items[Int($0)])) }
        let middle = distances.count / 2
        distances.sort { $0.distance < $1.distance }
        for (offset, entry) in distances.enumerated() { order[rest.lowerBound + offset] = entry.item }
        nodes[Int(node)].radius = distances[middle].distance
        let inside = build(&order, rest.lowerBound..<(rest.lowerBound + middle), &generator)
        let outside = build(&order, (rest.lowerBound + middle)..<rest.upperBound, &generator)
        nodes[Int(node)].inside = inside
        nodes[Int(node)].outside = outside
        return node
    }

    /// The `k` photos nearest `query`, nearest first.
    public func nearest(to query: PhotoFeatures, count k: Int) -> [Neighbour] {
        guard k > 0, root >= 0 else { return [] }
        var best: [Neighbour] = [] // sorted, at most k
        best.reserveCapacity(k + 1)
        var stack: [Int32] = [root]
        while let index = stack.popLast() {
            let node = nodes[Int(index)]
            let distance = query.distance(to: items[Int(node.item)])
            let worst = best.count == k ? best[k - 1].distance : .infinity
            if distance < worst {
                let position = best.firstIndex { $0.distance > distance } ?? best.count
                best.insert(Neighbour(item: Int(node.item), distance: distance), at: position)
                if best.count > k { best.removeLast() }
            }
            let tau = best.count == k ? best[k - 1].distance : .infinity
            // Visit the side the query is on last (popped first); the other only when a photo
            // there could be nearer than the k-th best.
            if distance < node.radius {
                if node.outside >= 0, distance + tau >= node.radius { stack.append(node.outside) }
                if node.inside >= 0 { stack.append(node.inside) }
            } else {
                if node.inside >= 0, distance - tau <= node.radius { stack.append(node.inside) }
                if node.outside >= 0 { stack.append(node.outside) }
            }
        }
        return best
    }
}
