#include "canopy_vips.h"

#include <malloc.h>
#include <string.h>
#include <vips/vips.h>

struct canopy_image; // is a VipsImage

#define IMAGE(p) ((VipsImage *)(p))

static int started = -1;
static GOnce start_once = G_ONCE_INIT;

static gpointer start(gpointer unused) {
    (void)unused;
    if (VIPS_INIT("canopy")) return GINT_TO_POINTER(-1);
    vips_cache_set_max(0);
    vips_cache_set_max_mem(0);
    vips_cache_set_max_files(0);
    // Only the four photo formats may be decoded from input.
    vips_block_untrusted_set(TRUE);
    vips_operation_block_set("VipsForeignLoad", TRUE);
    vips_operation_block_set("VipsForeignLoadJpeg", FALSE);
    vips_operation_block_set("VipsForeignLoadPng", FALSE);
    vips_operation_block_set("VipsForeignLoadWebp", FALSE);
    vips_operation_block_set("VipsForeignLoadHeif", FALSE);
    return GINT_TO_POINTER(0);
}

int canopy_vips_start(void) {
    started = GPOINTER_TO_INT(g_once(&start_once, start, NULL));
    return started;
}

int canopy_malloc_arenas(int arenas) { return mallopt(M_ARENA_MAX, arenas) == 1 ? 0 : -1; }

const char *canopy_vips_version(void) { return vips_version_string(); }

void canopy_vips_error(char *buffer, size_t size) {
    const char *message = vips_error_buffer();
    g_strlcpy(buffer, message ? message : "", size);
    vips_error_clear();
}

static int orientation_of(VipsImage *image) {
    int orientation = 1;
    if (vips_image_get_typeof(image, VIPS_META_ORIENTATION)) vips_image_get_int(image, VIPS_META_ORIENTATION, &orientation);
    return orientation;
}

int canopy_vips_header(const void *bytes, size_t length, int *width, int *height, char *loader, size_t loader_size) {
    const char *name = vips_foreign_find_load_buffer(bytes, length);
    if (!name) return -1;
    VipsImage *image = vips_image_new_from_buffer(bytes, length, "", NULL);
    if (!image) return -1;
    // Orientations 5 to 8 turn the picture by 90 degrees: it is shown with sides swapped.
    int turned = orientation_of(image) >= 5;
    *width = turned ? vips_image_get_height(image) : vips_image_get_width(image);
    *height = turned ? vips_image_get_width(image) : vips_image_get_height(image);
    g_strlcpy(loader, name, loader_size);
    g_object_unref(image);
    return 0;
}

/// To 8-bit sRGB (or keeps greyscale), whatever came in (CMYK, 16-bit, Lab...).
static VipsImage *to_srgb(VipsImage *in) {
    VipsInterpretation interpretation = vips_image_guess_interpretation(in);
    VipsImage *out = NULL;
    if (interpretation == VIPS_INTERPRETATION_sRGB || interpretation == VIPS_INTERPRETATION_B_W) {
        if (in->BandFmt == VIPS_FORMAT_UCHAR) {
            g_object_ref(in);
            return in;
        }
        if (vips_cast_uchar(in, &out, NULL)) return NULL;
        return out;
    }
    if (vips_colourspace(in, &out, VIPS_INTERPRETATION_sRGB, NULL)) return NULL;
    return out;
}

static canopy_image *finish(VipsImage *image) {
    if (!image) return NULL;
    VipsImage *srgb = to_srgb(image);
    g_object_unref(image);
    return (canopy_image *)srgb;
}

canopy_image *canopy_vips_resize(canopy_image *image, int width, int height, int crop) {
    VipsImage *out = NULL;
    if (vips_thumbnail_image(IMAGE(image), &out, width,
                             "height", height,
                             "size", crop ? VIPS_SIZE_DOWN : VIPS_SIZE_FORCE,
                             "crop", crop ? VIPS_INTERESTING_CENTRE : VIPS_INTERESTING_NONE,
                             NULL))
        return NULL;
    return finish(out);
}

canopy_image *canopy_vips_decode(const void *bytes, size_t length, int shrink) {
    const char *loader = vips_foreign_find_load_buffer(bytes, length);
    if (!loader) return NULL;
    VipsImage *header = vips_image_new_from_buffer(bytes, length, "", NULL);
    if (!header) return NULL;
    int orientation = orientation_of(header);
    g_object_unref(header);
    // Sequential access streams the decode, unless a rotation needs the rows out of order.
    VipsAccess access = orientation > 1 ? VIPS_ACCESS_RANDOM : VIPS_ACCESS_SEQUENTIAL;
    VipsImage *image = NULL;
    if (shrink > 1 && strstr(loader, "Jpeg"))
        image = vips_image_new_from_buffer(bytes, length, "", "access", access, "fail_on", VIPS_FAIL_ON_TRUNCATED,
                                           "shrink", shrink, NULL);
    else if (shrink > 1 && strstr(loader, "Webp"))
        image = vips_image_new_from_buffer(bytes, length, "", "access", access, "fail_on", VIPS_FAIL_ON_TRUNCATED,
                                           "scale", 1.0 / shrink, NULL);
    else
        image = vips_image_new_from_buffer(bytes, length, "", "access", access, "fail_on", VIPS_FAIL_ON_TRUNCATED, NULL);
    if (!image) return NULL;
    VipsImage *rotated = NULL;
    int failed = vips_autorot(image, &rotated, NULL);
    g_object_unref(image);
    if (failed) return NULL;
    return finish(rotated);
}

canopy_image *canopy_vips_in_memory(canopy_image *image) {
    return (canopy_image *)vips_image_copy_memory(IMAGE(image));
}

int canopy_vips_width(const canopy_image *image) { return vips_image_get_width(IMAGE(image)); }
int canopy_vips_height(const canopy_image *image) { return vips_image_get_height(IMAGE(image)); }

static int save(VipsImage *image, enum canopy_format format, int quality, int strip, int progressive, void **bytes, size_t *length) {
    switch (format) {
    case CANOPY_JPEG:
        if (vips_image_hasalpha(image)) {
            // JPEG has no alpha: flatten on white, as a photo on a page.
            double white[3] = {255, 255, 255};
            VipsArrayDouble *background = vips_array_double_new(white, 3);
            VipsImage *flat = NULL;
            int failed = vips_flatten(image, &flat, "background", background, NULL);
            vips_area_unref(VIPS_AREA(background));
            if (failed) return -1;
            failed = vips_jpegsave_buffer(flat, bytes, length, "Q", quality, "strip", strip, "interlace", progressive,
                                          "optimize_coding", FALSE, NULL);
            g_object_unref(flat);
            return failed;
        }
        return vips_jpegsave_buffer(image, bytes, length, "Q", quality, "strip", strip, "interlace", progressive,
                                    "optimize_coding", FALSE, NULL);
    case CANOPY_WEBP:
        return vips_webpsave_buffer(image, bytes, length, "Q", quality, "strip", strip, NULL);
    case CANOPY_PNG:
        return vips_pngsave_buffer(image, bytes, length, "strip", strip, NULL);
    case CANOPY_HEIF:
        return vips_heifsave_buffer(image, bytes, length, "Q", quality, "strip", strip, NULL);
    }
    vips_error("canopy", "unknown output format %d", (int)format);
    return -1;
}

int canopy_vips_encode(canopy_image *image, enum canopy_format format, int quality, void **bytes, size_t *length) {
    // Savers' own "strip" is not enough everywhere (WebP kept EXIF in 8.14): the copy that is
    // saved carries no metadata at all.
    VipsImage *bare = NULL;
    if (vips_copy(IMAGE(image), &bare, NULL)) return -1;
    gchar **fields = vips_image_get_fields(bare);
    for (int i = 0; fields[i]; i++) vips_image_remove(bare, fields[i]);
    g_strfreev(fields);
    int failed = save(bare, format, quality, TRUE, FALSE, bytes, length);
    g_object_unref(bare);
    return failed;
}

int canopy_vips_rgb(canopy_image *image, void **bytes, size_t *length, int *width, int *height) {
    VipsImage *in = IMAGE(image);
    VipsImage *flat = NULL, *rgb = NULL;
    if (vips_image_hasalpha(in)) {
        double white[3] = {255, 255, 255};
        VipsArrayDouble *background = vips_array_double_new(white, 3);
        int failed = vips_flatten(in, &flat, "background", background, NULL);
        vips_area_unref(VIPS_AREA(background));
        if (failed) return -1;
    } else {
        g_object_ref(in);
        flat = in;
    }
    int failed = vips_image_get_bands(flat) < 3
        ? vips_colourspace(flat, &rgb, VIPS_INTERPRETATION_sRGB, NULL)
        : vips_extract_band(flat, &rgb, 0, "n", 3, NULL);
    g_object_unref(flat);
    if (failed) return -1;
    VipsImage *uchar = NULL;
    failed = vips_cast_uchar(rgb, &uchar, NULL);
    g_object_unref(rgb);
    if (failed) return -1;
    *bytes = vips_image_write_to_memory(uchar, length);
    *width = vips_image_get_width(uchar);
    *height = vips_image_get_height(uchar);
    g_object_unref(uchar);
    return *bytes ? 0 : -1;
}

void canopy_vips_free(void *bytes) { g_free(bytes); }
void canopy_vips_release(canopy_image *image) { if (image) g_object_unref(IMAGE(image)); }

// MARK: - Test and benchmark images

/// Ends a test-image pipeline: drops its intermediate images, then renders `result` into
/// memory, or drops it too when a step failed.
static canopy_image *settle(int failed, VipsImage *result, VipsImage **intermediates, size_t count) {
    for (size_t i = 0; i < count; i++) if (intermediates[i]) g_object_unref(intermediates[i]);
    if (failed || !result) {
        if (result) g_object_unref(result);
        return NULL;
    }
    VipsImage *memory = vips_image_copy_memory(result);
    g_object_unref(result);
    return (canopy_image *)memory;
}

#define SETTLE(failed, result, ...) \
    settle((failed), (result), (VipsImage *[]){__VA_ARGS__}, sizeof((VipsImage *[]){__VA_ARGS__}) / sizeof(VipsImage *))

canopy_image *canopy_vips_pattern(int width, int height) {
    // Hue sweeps across x, lightness falls along y: LCh(lightness, 60, hue) to sRGB.
    VipsImage *xy = NULL, *x = NULL, *y = NULL, *l = NULL, *c = NULL, *h = NULL, *lch = NULL, *tagged = NULL, *srgb = NULL;
    int failed = vips_xyz(&xy, width, height, NULL);
    failed = failed || vips_extract_band(xy, &x, 0, NULL) || vips_extract_band(xy, &y, 1, NULL);
    failed = failed || vips_linear1(y, &l, -70.0 / height, 90.0, NULL);
    failed = failed || vips_linear1(x, &c, 0.0, 60.0, NULL);
    failed = failed || vips_linear1(x, &h, 360.0 / width, 0.0, NULL);
    VipsImage *bands[3] = {l, c, h};
    failed = failed || vips_bandjoin(bands, &lch, 3, NULL);
    failed = failed || vips_copy(lch, &tagged, "interpretation", VIPS_INTERPRETATION_LCH, NULL);
    failed = failed || vips_colourspace(tagged, &srgb, VIPS_INTERPRETATION_sRGB, NULL);
    return SETTLE(failed, srgb, xy, x, y, l, c, h, lch, tagged);
}

canopy_image *canopy_vips_from_rgb(const void *pixels, int width, int height) {
    VipsImage *image = vips_image_new_from_memory_copy(pixels, (size_t)width * height * 3, width, height, 3, VIPS_FORMAT_UCHAR);
    if (!image) return NULL;
    VipsImage *tagged = NULL;
    int failed = vips_copy(image, &tagged, "interpretation", VIPS_INTERPRETATION_sRGB, NULL);
    return SETTLE(failed, tagged, image);
}

canopy_image *canopy_vips_texture(int width, int height) {
    // Three independent fractal surfaces (a 1/f spectrum, as natural scenes have), signed
    // 8-bit so 12 MP stay 36 MB.
    VipsImage *bands[3] = {NULL, NULL, NULL};
    VipsImage *joined = NULL, *scaled = NULL, *signed8 = NULL;
    int failed = 0;
    for (int i = 0; i < 3 && !failed; i++) failed = vips_fractsurf(&bands[i], width, height, 2.3, NULL);
    failed = failed || vips_bandjoin(bands, &joined, 3, NULL);
    failed = failed || vips_linear1(joined, &scaled, 0.25, 0.0, NULL);
    failed = failed || vips_cast(scaled, &signed8, VIPS_FORMAT_CHAR, NULL);
    return SETTLE(failed, signed8, bands[0], bands[1], bands[2], joined, scaled);
}

canopy_image *canopy_vips_photo(canopy_image *texture, int seed) {
    VipsImage *in = IMAGE(texture);
    int width = vips_image_get_width(in), height = vips_image_get_height(in);
    canopy_image *pattern = canopy_vips_pattern(width, height);
    if (!pattern) return NULL;
    VipsImage *wrapped = NULL, *noise = NULL, *textured = NULL, *noisy = NULL, *photo = NULL, *tagged = NULL;
    // The surfaces are periodic: wrapping them by a seed gives a seamless, different picture.
    int failed = vips_wrap(in, &wrapped, "x", (seed * 997) % width, "y", (seed * 577) % height, NULL);
    failed = failed || vips_gaussnoise(&noise, width, height, "sigma", 4.0, "mean", 0.0, NULL);
    failed = failed || vips_add(IMAGE(pattern), wrapped, &textured, NULL);
    failed = failed || vips_add(textured, noise, &noisy, NULL);
    failed = failed || vips_cast_uchar(noisy, &photo, NULL);
    failed = failed || vips_copy(photo, &tagged, "interpretation", VIPS_INTERPRETATION_sRGB, NULL);
    return SETTLE(failed, tagged, IMAGE(pattern), wrapped, noise, textured, noisy, photo);
}

int canopy_vips_set_orientation(canopy_image *image, int orientation) {
    vips_image_set_int(IMAGE(image), VIPS_META_ORIENTATION, orientation);
    return 0;
}

int canopy_vips_set_string(canopy_image *image, const char *field, const char *value) {
    vips_image_set_string(IMAGE(image), field, value);
    return 0;
}

int canopy_vips_has_field(const canopy_image *image, const char *field) {
    return vips_image_get_typeof(IMAGE(image), field) != 0;
}

canopy_image *canopy_vips_open(const void *bytes, size_t length) {
    return (canopy_image *)vips_image_new_from_buffer(bytes, length, "", NULL);
}

canopy_image *canopy_vips_to_cmyk(canopy_image *image) {
    VipsImage *out = NULL;
    if (vips_colourspace(IMAGE(image), &out, VIPS_INTERPRETATION_CMYK, NULL)) return NULL;
    return (canopy_image *)out;
}

const char *canopy_vips_interpretation(const canopy_image *image) {
    return vips_enum_nick(VIPS_TYPE_INTERPRETATION, vips_image_guess_interpretation(IMAGE(image)));
}

int canopy_vips_encode_keeping_metadata(canopy_image *image, enum canopy_format format, int quality, int progressive, void **bytes, size_t *length) {
    return save(IMAGE(image), format, quality, FALSE, progressive, bytes, length);
}
