/// Which pixels of a photo are the plant: everything that differs clearly from the background,
/// where the background is what the frame's border shows.
///
/// 1. **The background, modelled from the border.** Along each of the four edges, the median
///    of a thin band (a plant seldom fills the border) and then of 9 neighbouring positions (a
///    leaf reaching the border does not move a median), in log RGB (so a brighter or dimmer
///    light shifts every channel by the same amount). Inside the frame the background is the
///    four edges blended (a Coons patch: each pixel from the edges to its left and right, top
///    and bottom), so walls lit unevenly, a gradient or a table's edge are background too. Its
///    spread is the median absolute deviation of the band's pixels around that model.
/// 2. **Hysteresis.** A pixel further than 6 spreads from the background is surely plant; one
///    further than 3 is plant when it touches such a pixel through others like it (the
///    plant's darker edges and shadows join it, specks in the background do not).
/// 3. **Holes filled, edges cleaned.** Background enclosed by the plant is plant (a leaf's
///    highlight close to the wall's colour); an opening and a closing with a 3x3 square drop
///    single pixels and close one-pixel cracks.
/// 4. **A fallback.** When under 1% of the frame is found, the centre of the frame (half its
///    width and height) stands in for the plant, where phones put it.
struct PlantMask {
    let width: Int
    let height: Int
    /// One flag per pixel, row by row.
    var isPlant: [Bool]
    /// The background's log RGB at each pixel (three values a pixel, row by row): what white
    /// balance is measured against.
    let background: [Float]
    /// True when nothing stood out and the centre of the frame was taken instead.
    let isFallback: Bool

    static let certain: Float = 6
    static let possible: Float = 3

    /// The mask of an image given as log RGB (three values a pixel, row by row).
    init(logRGB pixels: [Float], width: Int, height: Int) {
        self.width = width
        self.height = height
        let band = max(2, width / 64)
        // Each edge's colour along it: positions × 3 channels.
        let top = Self.edge(pixels, width: width, count: width, band: band) { position, depth in depth * width + position }
        let bottom = Self.edge(pixels, width: width, count: width, band: band) { position, depth in (height - 1 - depth) * width + position }
        let left = Self.edge(pixels, width: width, count: height, band: band) { position, depth in position * width + depth }
        let right = Self.edge(pixels, width: width, count: height, band: band) { position, depth in position * width + width - 1 - depth }
        var background = [Float](repeating: 0, count: width * height * 3)
        for channel in 0..<3 {
            let corners = (
                topLeft: (top[channel] + left[channel]) / 2, topRight: (top[(width - 1) * 3 + channel] + right[channel]) / 2,
                bottomLeft: (bottom[channel] + left[(height - 1) * 3 + channel]) / 2,
                bottomRight: (bottom[(width - 1) * 3 + channel] + right[(height - 1) * 3 + channel]) / 2
            )
            for y in 0..<height {
                let v = height > 1 ? Float(y) / Float(height - 1) : 0
                for x in 0..<width {
                    let u = width > 1 ? Float(x) / Float(width - 1) : 0
                    let edges = (1 - v) * top[x * 3 + channel] + v * bottom[x * 3 + channel] + (1 - u) * left[y * 3 + channel] + u * right[y * 3 + channel]
                    let blend =
                        (1 - u) * (1 - v) * corners.topLeft + u * (1 - v) * corners.topRight + (1 - u) * v * corners.bottomLeft + u * v * corners.bottomRight
                    background[(y * width + x) * 3 + channel] = edges - blend
                }
            }
        }
        self.background = background
        var spread = [Float](repeating: 0, count: 3)
        for channel in 0..<3 {
            var deviations: [Float] = []
            for y in 0..<height {
                for x in 0..<width where y < band || y >= height - band || x < band || x >= width - band {
                    let index = (y * width + x) * 3 + channel
                    deviations.append(abs(pixels[index] - background[index]))
                }
            }
            spread[channel] = Self.median(deviations) * 1.4826 + 0.02
        }
        // How far each pixel is from the background, in spreads.
        var certain = [Bool](repeating: false, count: width * height)
        var possible = [Bool](repeating: false, count: width * height)
        for y in 0..<height {
            for x in 0..<width {
                let index = y * width + x
                var sum: Float = 0
                for channel in 0..<3 {
                    let difference = (pixels[index * 3 + channel] - background[index * 3 + channel]) / spread[channel]
                    sum += difference * difference
                }
                certain[index] = sum > Self.certain * Self.certain
                possible[index] = sum > Self.possible * Self.possible
            }
        }
        var mask = Self.grown(from: certain, within: possible, width: width, height: height)
        mask = Self.holesFilled(mask, width: width, height: height)
        mask = Self.dilated(Self.eroded(mask, width: width, height: height), width: width, height: height)
        mask = Self.eroded(Self.dilated(mask, width: width, height: height), width: width, height: height)
        if mask.lazy.filter({ $0 }).count * 100 < width * height {
            mask = [Bool](repeating: false, count: width * height)
            for y in (height / 4)..<(3 * height / 4) {
                for x in (width / 4)..<(3 * width / 4) { mask[y * width + x] = true }
            }
            isFallback = true
        } else {
            isFallback = false
        }
        isPlant = mask
    }

    /// One edge's colour at each of its `count` positions (three values each): the median of
    /// the `band` pixels inward from it, then of the 9 positions around (ends repeated).
    static func edge(_ pixels: [Float], width: Int, count: Int, band: Int, pixel: (_ position: Int, _ depth: Int) -> Int) -> [Float] {
        var across = [Float](repeating: 0, count: count * 3)
        for position in 0..<count {
            for channel in 0..<3 { across[position * 3 + channel] = median((0..<band).map { pixels[pixel(position, $0) * 3 + channel] }) }
        }
        var along = across
        for position in 0..<count {
            for channel in 0..<3 {
                along[position * 3 + channel] = median((-4...4).map { across[min(count - 1, max(0, position + $0)) * 3 + channel] })
            }
        }
        return along
    }

    /// The pixels of `within` connected (4-neighbours) to a pixel of `seeds`.
    static func grown(from seeds: [Bool], within: [Bool], width: Int, height: Int) -> [Bool] {
        var grown = [Bool](repeating: false, count: seeds.count)
        var stack: [Int] = []
        for index in seeds.indices where seeds[index] && !grown[index] {
            grown[index] = true
            stack.append(index)
            while let next = stack.popLast() {
                forEachNeighbour(of: next, width: width, height: height) { neighbour in
                    if within[neighbour] && !grown[neighbour] {
                        grown[neighbour] = true
                        stack.append(neighbour)
                    }
                }
            }
        }
        return grown
    }

    /// The mask with every region of background that does not reach the frame's edge filled.
    static func holesFilled(_ mask: [Bool], width: Int, height: Int) -> [Bool] {
        var outside = [Bool](repeating: false, count: mask.count)
        for y in 0..<height {
            for x in 0..<width where (y == 0 || y == height - 1 || x == 0 || x == width - 1) && !mask[y * width + x] {
                outside[y * width + x] = true
            }
        }
        let background = mask.map { !$0 }
        let reached = grown(from: outside, within: background, width: width, height: height)
        return reached.map { !$0 }
    }

    /// Dilation with a 3x3 square (pixels beyond the frame count as background).
    static func dilated(_ mask: [Bool], width: Int, height: Int) -> [Bool] {
        var rows = mask
        for y in 0..<height {
            for x in 0..<width where !mask[y * width + x] {
                rows[y * width + x] = (y > 0 && mask[(y - 1) * width + x]) || (y < height - 1 && mask[(y + 1) * width + x])
            }
        }
        var out = rows
        for y in 0..<height {
            for x in 0..<width where !rows[y * width + x] {
                out[y * width + x] = (x > 0 && rows[y * width + x - 1]) || (x < width - 1 && rows[y * width + x + 1])
            }
        }
        return out
    }

    /// Erosion with a 3x3 square: the background dilated.
    static func eroded(_ mask: [Bool], width: Int, height: Int) -> [Bool] {
        dilated(mask.map { !$0 }, width: width, height: height).map { !$0 }
    }

    @inline(__always)
    static func forEachNeighbour(of index: Int, width: Int, height: Int, _ body: (Int) -> Void) {
        let (y, x) = index.quotientAndRemainder(dividingBy: width)
        if x > 0 { body(index - 1) }
        if x < width - 1 { body(index + 1) }
        if y > 0 { body(index - width) }
        if y < height - 1 { body(index + width) }
    }

    static func median(_ values: [Float]) -> Float {
        guard !values.isEmpty else { return 0 }
        let sorted = values.sorted()
        let middle = sorted.count / 2
        return sorted.count % 2 == 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2
    }
}
