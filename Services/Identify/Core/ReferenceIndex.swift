import CanopyImaging

/// The nearest reference photos to a query without comparing against every one: a
/// vantage-point tree over ``PhotoFeatures/distance(to:)``, which is a metric.
///
/// Each node holds one photo (its vantage point) and the median distance from it to the
/// photos below; nearer ones go inside, the rest outside. A search keeps the best `k` found
/// so far and skips a side whenever the triangle inequality says nothing there can beat the
/// `k`-th best. Built once per reference generation, read by any number of tasks at once.
///
/// The distances it computes are ``PhotoFeatures/distance(to:)``'s, taken faster: each
/// photo's values are kept multiplied by their weights (values of weight 0 left out) in one
/// contiguous array, padded to whole SIMD lanes, so a distance is a plain L1 in 8-wide steps.
public struct ReferenceIndex: Sendable {
    private struct Node: Sendable {
        var item: Int32
        var radius: Float
        var inside: Int32
        var outside: Int32
    }

    /// The photos' features, in the order given (``Neighbour/item`` indexes into it).
    public let items: [PhotoFeatures]
    /// ``items``, weighted, ``lanes`` SIMD8 values each.
    private let points: [SIMD8<Float>]
    private var nodes: [Node] = []
    private var root: Int32 = -1

    /// A photo found near the query.
    public struct Neighbour: Sendable, Equatable {
        public var item: Int
        public var distance: Float
    }

    /// The values that count (weight above 0), and their weights.
    private static let kept: [(index: Int, weight: Float)] = FeatureModel.valueWeights.enumerated().filter { $0.element > 0 }.map { ($0.offset, $0.element) }
    private static let lanes = (kept.count + 7) / 8

    /// A photo's values as the index keeps them.
    private static func weighted(_ features: PhotoFeatures) -> [SIMD8<Float>] {
        var lanes = [SIMD8<Float>](repeating: .zero, count: Self.lanes)
        for (position, value) in kept.enumerated() { lanes[position / 8][position % 8] = features.values[value.index] * value.weight }
        return lanes
    }

    @inline(__always)
    private func distance(_ query: UnsafeBufferPointer<SIMD8<Float>>, _ item: Int) -> Float {
        points.withUnsafeBufferPointer { points in
            var sum = SIMD8<Float>.zero
            let base = item * Self.lanes
            for lane in 0..<Self.lanes {
                let difference = query[lane] - points[base + lane]
                sum += difference.replacing(with: -difference, where: difference .< 0)
            }
            return sum.sum()
        }
    }

    public init(_ items: [PhotoFeatures]) {
        self.items = items
        points = items.flatMap(Self.weighted)
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
        let point = Self.weighted(items[Int(vantage)])
        var distances = point.withUnsafeBufferPointer { point in order[rest].map { (item: $0, distance: distance(point, Int($0))) } }
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
        return Self.weighted(query).withUnsafeBufferPointer { nearest(to: $0, count: k) }
    }

    /// The `k` photos nearest `query` by comparing it with every photo.
    public func scanned(to query: PhotoFeatures, count k: Int) -> [Neighbour] {
        guard k > 0, !items.isEmpty else { return [] }
        var best: [Neighbour] = []
        best.reserveCapacity(k + 1)
        Self.weighted(query).withUnsafeBufferPointer { query in
            for item in items.indices { Self.keep(Neighbour(item: item, distance: distance(query, item)), in: &best, count: k) }
        }
        return best
    }

    private func nearest(to query: UnsafeBufferPointer<SIMD8<Float>>, count k: Int) -> [Neighbour] {
        var best: [Neighbour] = [] // sorted, at most k
        best.reserveCapacity(k + 1)
        var stack: [Int32] = [root]
        while let index = stack.popLast() {
            let node = nodes[Int(index)]
            let distance = distance(query, Int(node.item))
            Self.keep(Neighbour(item: Int(node.item), distance: distance), in: &best, count: k)
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

    /// Adds `found` to the sorted best `k` when it is nearer than the `k`-th.
    @inline(__always)
    private static func keep(_ found: Neighbour, in best: inout [Neighbour], count k: Int) {
        guard best.count < k || found.distance < best[k - 1].distance else { return }
        let position = best.firstIndex { $0.distance > found.distance } ?? best.count
        best.insert(found, at: position)
        if best.count > k { best.removeLast() }
    }
}
