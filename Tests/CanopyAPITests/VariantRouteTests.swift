import Testing

@testable import CanopyAPI

/// The edge's own variant route: which paths it takes, and when it answers WebP.
struct VariantRouteTests {
    @Test func itTakesOnlyTheVariantPath() {
        let id = String(repeating: "ab", count: 32)
        #expect(VariantRoute.match("/v1/photos/\(id)/variants/thumbnail")?.photoID == id)
        #expect(VariantRoute.match("/v1/photos/\(id)/variants/thumbnail")?.variant == "thumbnail")
        for other in [
            "/v1/photos/\(id)/palette", "/v1/photos/\(id)/variants/", "/v1/photos/\(id)/variants/thumbnail/x",
            "/v2/photos/\(id)/variants/thumbnail", "v1/photos/\(id)/variants/thumbnail", "/v1/plants/\(id)/variants/thumbnail",
        ] {
            #expect(VariantRoute.match(other[...]) == nil, "\(other)")
        }
    }

    @Test func webPOnlyWhenTheClientNamesItWithAQualityAboveZero() {
        #expect(VariantRoute.acceptsWebP("image/webp,image/*;q=0.8"))
        #expect(VariantRoute.acceptsWebP("image/avif, IMAGE/WEBP ; q=0.5"))
        #expect(!VariantRoute.acceptsWebP(nil))
        #expect(!VariantRoute.acceptsWebP("*/*"))
        #expect(!VariantRoute.acceptsWebP("image/*"))
        #expect(!VariantRoute.acceptsWebP("image/webp;q=0"))
        #expect(!VariantRoute.acceptsWebP("image/jpeg"))
    }
}
