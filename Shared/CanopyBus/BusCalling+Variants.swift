import CanopyIO
import CanopyMessages
import CanopyWire
import Foundation

extension BusCalling {
    /// A whole image variant: one call, or one call per piece when the variant is larger than
    /// one reply on the bus may be (see ``Images/GetVariant``). The pieces are checked to fit
    /// together: the same total size, each starting where the last ended.
    ///
    /// - Parameters:
    ///   - request: the variant; its `offset` is ignored (the whole variant is fetched).
    ///   - principal: the person whose photo it is.
    ///   - timeout: the deadline of each call.
    public func wholeVariant(_ request: Images.GetVariant.Request, principal: String, timeout: Duration? = nil) async throws -> Images.GetVariant.Reply {
        var request = request
        request.offset = 0
        var whole = try await call(Images.GetVariant.self, request, principal: principal, timeout: timeout)
        guard var next = whole.nextOffset else { return whole }
        var data = whole.data
        data.reserveCapacity(whole.totalBytes)
        while true {
            guard next == data.count, next < whole.totalBytes else {
                throw CanopyError(.internal, "the pieces of variant \(request.variant.rawValue) of \(request.sha256) do not fit together; try again")
            }
            request.offset = next
            let piece = try await call(Images.GetVariant.self, request, principal: principal, timeout: timeout)
            guard piece.offset == next, piece.totalBytes == whole.totalBytes, !piece.data.isEmpty else {
                throw CanopyError(.internal, "the pieces of variant \(request.variant.rawValue) of \(request.sha256) do not fit together; try again")
            }
            data.append(piece.data)
            guard let following = piece.nextOffset else { break }
            next = following
        }
        guard data.count == whole.totalBytes else {
            throw CanopyError(
                .internal, "variant \(request.variant.rawValue) of \(request.sha256) came to \(data.count) of \(whole.totalBytes) bytes; try again")
        }
        whole.data = data
        whole.nextOffset = nil
        return whole
    }
}
