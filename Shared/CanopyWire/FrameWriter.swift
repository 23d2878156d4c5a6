/// Where an encoder puts a message's frames, one at a time and in order, so a message can go
/// to a socket without first being built as an array of arrays: fixed frames (version,
/// command, flags) are shared, integers and names are written from the stack, and bodies and
/// attachments are handed over as the arrays they are.
///
/// ``WireMessage/write(into:)`` writes through it; ``WireMessage/encoded`` is the same
/// encoding collected into arrays (what the golden fixtures pin). The writing is `@inlinable`,
/// so a writer in another module (the broker's, straight to its socket) gets it specialized:
/// no generic dispatch or runtime metadata per frame.
public protocol FrameWriter {
    /// What a write can fail with (`Never` when it cannot).
    associatedtype Failure: Error
    /// Writes a frame the caller holds as an array (a body, an attachment, a shared frame).
    /// `more` is false on the message's last frame.
    mutating func write(_ frame: [UInt8], more: Bool) throws(Failure)
    /// Writes a frame built for this message (an integer, a name, a header); the bytes are
    /// valid only during the call.
    mutating func write(bytes: UnsafeRawBufferPointer, more: Bool) throws(Failure)
}

extension FrameWriter {
    /// A big-endian 64-bit frame.
    @inlinable
    mutating func write(_ value: UInt64, more: Bool) throws(Failure) {
        try withUnsafeBytes(of: value.bigEndian) { (bytes) throws(Failure) in try write(bytes: bytes, more: more) }
    }

    /// A name's UTF-8 bytes as a frame.
    @inlinable
    mutating func write(_ text: String, more: Bool) throws(Failure) {
        let count = text.utf8.count
        try withUnsafeTemporaryAllocation(byteCount: count, alignment: 1) { (buffer) throws(Failure) in
            UnsafeMutableRawBufferPointer(buffer).copyBytes(from: text.utf8)
            try write(bytes: UnsafeRawBufferPointer(buffer), more: more)
        }
    }

    /// The body, then each attachment; the last of them ends the message.
    @inlinable
    mutating func write(body: [UInt8], attachments: [[UInt8]]) throws(Failure) {
        try write(body, more: !attachments.isEmpty)
        for index in attachments.indices {
            try write(attachments[index], more: index < attachments.count - 1)
        }
    }

    /// A request header's frame, built on the stack.
    @inlinable
    mutating func write(_ header: RequestHeader, more: Bool) throws(Failure) {
        let principal = header.principal.utf8
        let traceBytes = header.trace == nil ? 0 : TraceContext.byteCount
        try withUnsafeTemporaryAllocation(byteCount: 5 + traceBytes + principal.count, alignment: 1) { (buffer) throws(Failure) in
            withUnsafeBytes(of: header.timeoutMilliseconds.bigEndian) { buffer.copyMemory(from: $0) }
            buffer[4] = header.flags
            if let trace = header.trace {
                for (index, word) in [trace.traceHigh, trace.traceLow, trace.spanID].enumerated() {
                    withUnsafeBytes(of: word.bigEndian) { UnsafeMutableRawBufferPointer(rebasing: buffer[(5 + 8 * index)...]).copyMemory(from: $0) }
                }
                buffer[29] = trace.flags
            }
            UnsafeMutableRawBufferPointer(rebasing: buffer[(5 + traceBytes)...]).copyBytes(from: principal)
            try write(bytes: UnsafeRawBufferPointer(buffer), more: more)
        }
    }
}

/// Collects frames as arrays: what ``WireMessage/encoded`` returns.
struct ArrayFrameWriter: FrameWriter {
    typealias Failure = Never

    var frames: [[UInt8]] = []

    mutating func write(_ frame: [UInt8], more: Bool) {
        frames.append(frame)
    }

    mutating func write(bytes: UnsafeRawBufferPointer, more: Bool) {
        frames.append(Array(bytes))
    }
}

/// Counts a message's bytes without building it.
struct ByteCountingWriter: FrameWriter {
    typealias Failure = Never

    var bytes = 0

    mutating func write(_ frame: [UInt8], more: Bool) {
        bytes += frame.count
    }

    mutating func write(bytes: UnsafeRawBufferPointer, more: Bool) {
        self.bytes += bytes.count
    }
}
