/// The frames of one received message, wherever they are held: Swift arrays, or libzmq's
/// messages read in place (the broker's receive path, which copies into arrays only the
/// frames it keeps: correlation ids and bodies). The decoders (``WireMessage/init(frames:)``,
/// ``MajordomoMessage/claims(_:)``) read through it; they are `@inlinable`, so the code
/// that calls them (the broker's loop) gets them specialized for its frames, with no generic
/// dispatch per frame.
public protocol FrameList {
    /// How many frames the message has.
    var count: Int { get }
    /// Frame `index`'s size in bytes.
    func byteCount(_ index: Int) -> Int
    /// Calls `body` with frame `index`'s bytes, which are valid only inside `body`.
    func withFrame<R>(_ index: Int, _ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R
    /// Frame `index` as an array: the frame itself when it is one, else a copy.
    func array(_ index: Int) -> [UInt8]
}

extension FrameList {
    /// Whether frame `index` holds exactly `bytes`.
    @inlinable
    public func frame(_ index: Int, equals bytes: [UInt8]) -> Bool {
        withFrame(index) { frame in bytes.withUnsafeBytes { frame.elementsEqual($0) } }
    }

    /// Frames `range` as arrays (attachments; usually none).
    @inlinable
    public func arrays(_ range: Range<Int>) -> [[UInt8]] {
        range.isEmpty ? [] : range.map(array)
    }

    /// Every frame as an array (for the rare paths that keep a whole message).
    @inlinable
    public var arrays: [[UInt8]] { arrays(0..<count) }
}

extension Array: FrameList where Element == [UInt8] {
    @inlinable
    public func byteCount(_ index: Int) -> Int { self[index].count }
    @inlinable
    public func withFrame<R>(_ index: Int, _ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try self[index].withUnsafeBytes(body)
    }
    @inlinable
    public func array(_ index: Int) -> [UInt8] { self[index] }
}
