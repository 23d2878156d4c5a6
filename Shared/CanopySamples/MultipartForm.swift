/// A `multipart/form-data` body (RFC 7578), as apps upload photos: each part a name, an
/// optional content type (a part with one is sent as a file), and bytes.
public enum MultipartForm {
    /// One part: its field name, its content type when it is a file (then named `<name>.jpg`), and
    /// its bytes.
    public struct Part: Sendable {
        public var name: String
        public var type: String?
        public var bytes: [UInt8]

        public init(name: String, type: String? = nil, bytes: [UInt8]) {
            self.name = name
            self.type = type
            self.bytes = bytes
        }
    }

    /// The body, parts separated by `boundary` (the request's
    /// `Content-Type: multipart/form-data; boundary=…`).
    public static func encode(_ parts: [Part], boundary: String) -> [UInt8] {
        var body: [UInt8] = []
        for part in parts {
            body += Array(
                "--\(boundary)\r\nContent-Disposition: form-data; name=\"\(part.name)\"\(part.type == nil ? "" : "; filename=\"\(part.name).jpg\"")\r\n".utf8)
            if let type = part.type { body += Array("Content-Type: \(type)\r\n".utf8) }
            body += Array("\r\n".utf8) + part.bytes + Array("\r\n".utf8)
        }
        return body + Array("--\(boundary)--\r\n".utf8)
    }
}
