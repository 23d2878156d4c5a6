import Foundation

/// The computation behind ``PhotoFeatures/compute(pixels:width:height:)``: the plant found,
/// then each block of descriptors from its pixels (``PhotoFeatures`` says what each means).
struct PlantDescriptors {
    private(set) var features = PhotoFeatures(values: [Float](repeating: 0, count: PhotoFeatures.count))

    /// log(v/255 + 0.01) for each 8-bit value: computed once, not per pixel.
    static let logTable: [Float] = (0..<256).map { Float(log(Double($0) / 255 + 0.01)) }

    init(pixels: [UInt8], width: Int, height: Int) {
        var logRGB = [Float](repeating: 0, count: pixels.count)
        for index in pixels.indices { logRGB[index] = Self.logTable[Int(pixels[index])] }
        let mask = PlantMask(logRGB: logRGB, width: width, height: height)

        // The plant's pixels, its centre, and its radius (95% of its pixels lie within).
        var plant: [Int] = []
        plant.reserveCapacity(width * height / 2)
        var (sumX, sumY): (Double, Double) = (0, 0)
        for index in 0..<(width * height) where mask.isPlant[index] {
            plant.append(index)
            sumX += Double(index % width)
            sumY += Double(index / width)
        }
        let centre = (x: Float(sumX / Double(plant.count)), y: Float(sumY / Double(plant.count)))
        var radii = plant.map { hypot(Float($0 % width) - centre.x, Float($0 / width) - centre.y) }
        radii.sort()
        let radius = max(4, radii[min(radii.count - 1, Int(0.95 * Float(radii.count - 1)))])

        colour(logRGB, mask: mask, plant: plant)
        shape(mask, plant: plant, centre: centre, radius: radius)
        pattern(pixels, mask: mask, centre: centre, radius: radius)
    }

    private mutating func set(_ block: PhotoFeatures.Block, _ values: [Float]) {
        precondition(values.count == block.count)
        let range = PhotoFeatures.Block.layout[block.rawValue]
        features.values.replaceSubrange(range, with: values)
    }

    // MARK: Colour

    private mutating func colour(_ logRGB: [Float], mask: PlantMask, plant: [Int]) {
        var chromaticity = [Float](), shade = [Float](), balancedRed = [Float](), balancedBlue = [Float]()
        chromaticity.reserveCapacity(plant.count)
        shade.reserveCapacity(plant.count)
        balancedRed.reserveCapacity(plant.count)
        balancedBlue.reserveCapacity(plant.count)
        for index in plant {
            let (r, g, b) = (logRGB[index * 3], logRGB[index * 3 + 1], logRGB[index * 3 + 2])
            chromaticity.append(r + b - 2 * g)
            shade.append((r + g + b) / 3)
            let (br, bg, bb) = (mask.background[index * 3], mask.background[index * 3 + 1], mask.background[index * 3 + 2])
            balancedRed.append((r - br) - (g - bg))
            balancedBlue.append((b - bb) - (g - bg))
        }
        let medianShade = PlantMask.median(shade)
        for index in shade.indices { shade[index] -= medianShade }
        set(.chromaticity, Self.histogram(chromaticity, from: -1.5, to: 1, bins: 24))
        set(.shading, Self.histogram(shade, from: -0.8, to: 0.4, bins: 10))
        set(.chromaticityShading, Self.histogram2D(chromaticity, from: -1.5, to: 1, bins: 10, shade, from: -0.6, to: 0.3, bins: 5))
        set(.balanced, Self.histogram2D(balancedRed, from: -1, to: 1, bins: 6, balancedBlue, from: -1, to: 1, bins: 6))
    }

    // MARK: Shape

    private mutating func shape(_ mask: PlantMask, plant: [Int], centre: (x: Float, y: Float), radius: Float) {
        let (width, height) = (mask.width, mask.height)
        // Coverage of ten rings out to 1.1 radii, and of 64 sectors of the ring 0.45–0.8.
        var ringAll = [Float](repeating: 0, count: 10), ringPlant = [Float](repeating: 0, count: 10)
        var sectorAll = [Float](repeating: 0, count: 64), sectorPlant = [Float](repeating: 0, count: 64)
        for y in 0..<height {
            for x in 0..<width {
                let (dx, dy) = (Float(x) - centre.x, Float(y) - centre.y)
                let r = (dx * dx + dy * dy).squareRoot() / radius
                let isPlant: Float = mask.isPlant[y * width + x] ? 1 : 0
                let ring = Int(r / 0.11)
                if ring < 10 {
                    ringAll[ring] += 1
                    ringPlant[ring] += isPlant
                }
                if r > 0.45 && r < 0.8 {
                    let sector = min(63, Int((atan2(dy, dx) + .pi) / (2 * .pi) * 64))
                    sectorAll[sector] += 1
                    sectorPlant[sector] += isPlant
                }
            }
        }
        let coverage = zip(ringPlant, ringAll).map { $1 > 0 ? $0 / $1 : 0 }
        let total = coverage.reduce(0, +)
        set(.radial, coverage.map { total > 0 ? $0 / total : 0 })
        set(.coverage, [total / 10 * 2])
        // The leaves: the strongest angular rhythm of 2 to 10 repeats.
        let sectors = zip(sectorPlant, sectorAll).map { $1 > 0 ? $0 / $1 : 0 }
        let mean = sectors.reduce(0, +) / 64
        var leaves = 2, strongest: Float = -1
        for repeats in 2...10 {
            var (re, im): (Float, Float) = (0, 0)
            for (index, value) in sectors.enumerated() {
                let angle = 2 * Float.pi * Float(repeats * index) / 64
                re += (value - mean) * cos(angle)
                im += (value - mean) * sin(angle)
            }
            let magnitude = re * re + im * im
            if magnitude > strongest { (leaves, strongest) = (repeats, magnitude) }
        }
        set(.leafCount, [Float(leaves) / 4])
        set(.perLeaf, coverage.map { $0 / Float(leaves) * 3 })
        set(.area, [Float(plant.count) / (.pi * radius * radius)])
    }

    // MARK: Pattern

    private mutating func pattern(_ pixels: [UInt8], mask: PlantMask, centre: (x: Float, y: Float), radius: Float) {
        let (width, height) = (mask.width, mask.height)
        let side = PhotoFeatures.patternSide
        let scale = radius / PhotoFeatures.patternRadius // source pixels per standard pixel
        var grey = [Float](repeating: 0, count: width * height)
        for index in grey.indices {
            let sum = Int(pixels[index * 3]) + Int(pixels[index * 3 + 1]) + Int(pixels[index * 3 + 2])
            grey[index] = Self.greyLog[sum]
        }
        // The plant, brought to the standard radius around its centre (bilinear).
        var standard = [Float](repeating: 0, count: side * side)
        var inside = [Bool](repeating: false, count: side * side)
        let isPlant = mask.isPlant.map { Float($0 ? 1 : 0) }
        let half = Float(side) / 2
        for y in 0..<side {
            for x in 0..<side {
                let sx = centre.x + (Float(x) - half) * scale, sy = centre.y + (Float(y) - half) * scale
                standard[y * side + x] = Self.bilinear(grey, width: width, height: height, x: sx, y: sy, clamped: true)
                let plant = Self.bilinear(isPlant, width: width, height: height, x: sx, y: sy, clamped: false)
                inside[y * side + x] = plant > 0.5
            }
        }
        // Away from the outline: two erosions (4-neighbours).
        for _ in 0..<2 {
            let before = inside
            for index in inside.indices where before[index] {
                PlantMask.forEachNeighbour(of: index, width: side, height: side) { if !before[$0] { inside[index] = false } }
                let (y, x) = index.quotientAndRemainder(dividingBy: side)
                if x == 0 || y == 0 || x == side - 1 || y == side - 1 { inside[index] = false }
            }
        }
        for (block, sigma) in [(PhotoFeatures.Block.patternFine, Float(1)), (.patternCoarse, 2.5)] {
            let blurred = Self.gaussian(standard, side: side, sigma: sigma)
            var angles: [Float] = [], weights: [Float] = []
            for y in 1..<(side - 1) {
                for x in 1..<(side - 1) where inside[y * side + x] {
                    let at = { (dx: Int, dy: Int) in blurred[(y + dy) * side + x + dx] }
                    // Sobel.
                    let gx = (at(1, -1) + 2 * at(1, 0) + at(1, 1)) - (at(-1, -1) + 2 * at(-1, 0) + at(-1, 1))
                    let gy = (at(-1, 1) + 2 * at(0, 1) + at(1, 1)) - (at(-1, -1) + 2 * at(0, -1) + at(1, -1))
                    let magnitude = (gx * gx + gy * gy).squareRoot()
                    guard magnitude > 0 else { continue }
                    // The gradient against the direction from the centre, folded to 0…π/2.
                    var angle = abs(atan2(gy, gx) - atan2(Float(y) - half, Float(x) - half)).truncatingRemainder(dividingBy: .pi)
                    angle = min(angle, .pi - angle)
                    angles.append(angle)
                    weights.append(magnitude)
                }
            }
            set(block, Self.histogram(angles, from: 0, to: .pi / 2, bins: 6, weights: weights))
        }
    }

    /// log(mean of R, G, B / 255 + 0.01) for each sum of the three.
    static let greyLog: [Float] = (0...765).map { Float(log(Double($0) / 765 + 0.01)) }

    static func bilinear(_ image: [Float], width: Int, height: Int, x: Float, y: Float, clamped: Bool) -> Float {
        let (x0, y0) = (Int(x.rounded(.down)), Int(y.rounded(.down)))
        let (fx, fy) = (x - Float(x0), y - Float(y0))
        func at(_ px: Int, _ py: Int) -> Float {
            if clamped { return image[min(height - 1, max(0, py)) * width + min(width - 1, max(0, px))] }
            return px >= 0 && py >= 0 && px < width && py < height ? image[py * width + px] : 0
        }
        return (at(x0, y0) * (1 - fx) + at(x0 + 1, y0) * fx) * (1 - fy) + (at(x0, y0 + 1) * (1 - fx) + at(x0 + 1, y0 + 1) * fx) * fy
    }

    /// A separable Gaussian blur (kernel to 4 sigma; edges repeat).
    static func gaussian(_ image: [Float], side: Int, sigma: Float) -> [Float] {
        let reach = Int((4 * sigma).rounded())
        var kernel = (-reach...reach).map { exp(-Float($0 * $0) / (2 * sigma * sigma)) }
        let sum = kernel.reduce(0, +)
        kernel = kernel.map { $0 / sum }
        var rows = [Float](repeating: 0, count: image.count), out = rows
        for y in 0..<side {
            for x in 0..<side {
                var value: Float = 0
                for (offset, weight) in kernel.enumerated() { value += weight * image[y * side + min(side - 1, max(0, x + offset - reach))] }
                rows[y * side + x] = value
            }
        }
        for y in 0..<side {
            for x in 0..<side {
                var value: Float = 0
                for (offset, weight) in kernel.enumerated() { value += weight * rows[min(side - 1, max(0, y + offset - reach)) * side + x] }
                out[y * side + x] = value
            }
        }
        return out
    }

    /// A histogram with each value shared between its two nearest bins (so a value near a
    /// bin's edge does not jump), values beyond the range in the end bins; sums to 1 (or is
    /// all 0 without values).
    static func histogram(_ values: [Float], from low: Float, to high: Float, bins: Int, weights: [Float]? = nil) -> [Float] {
        var histogram = [Float](repeating: 0, count: bins)
        var total: Float = 0
        for (index, value) in values.enumerated() {
            let weight = weights?[index] ?? 1
            let position = (min(high, max(low, value)) - low) / (high - low) * Float(bins) - 0.5
            let lower = Int(position.rounded(.down))
            let fraction = position - Float(lower)
            histogram[min(bins - 1, max(0, lower))] += weight * (1 - fraction)
            histogram[min(bins - 1, max(0, lower + 1))] += weight * fraction
            total += weight
        }
        return total > 0 ? histogram.map { $0 / total } : histogram
    }

    /// A joint histogram of two values per pixel (the first's bins by the second's); sums to 1.
    static func histogram2D(
        _ first: [Float], from low1: Float, to high1: Float, bins bins1: Int,
        _ second: [Float], from low2: Float, to high2: Float, bins bins2: Int
    ) -> [Float] {
        var histogram = [Float](repeating: 0, count: bins1 * bins2)
        for (a, b) in zip(first, second) {
            let i = min(bins1 - 1, max(0, Int((a - low1) / (high1 - low1) * Float(bins1))))
            let j = min(bins2 - 1, max(0, Int((b - low2) / (high2 - low2) * Float(bins2))))
            histogram[i * bins2 + j] += 1
        }
        let total = Float(first.count)
        return total > 0 ? histogram.map { $0 / total } : histogram
    }
}
