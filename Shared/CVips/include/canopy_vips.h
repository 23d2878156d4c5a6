#ifndef CANOPY_VIPS_H
#define CANOPY_VIPS_H
// A small C face on libvips for Swift, which cannot call C variadic functions.
// Images are opaque handles (a VipsImage underneath); every function that returns one
// returns a new reference the caller releases with canopy_vips_release. On failure a
// function returns NULL or -1 and canopy_vips_error tells why.

#include <stddef.h>

typedef struct canopy_image canopy_image;

/// Output formats.
enum canopy_format { CANOPY_JPEG = 0, CANOPY_WEBP = 1, CANOPY_PNG = 2, CANOPY_HEIF = 3 };

/// Starts libvips once per process: turns its operation cache off and lets only the JPEG,
/// PNG, WebP and HEIF loaders run (SVG, PDF, ImageMagick, TIFF, GIF and the rest are
/// blocked). Returns 0, or -1 when libvips cannot start. Safe to call again.
int canopy_vips_start(void);

/// Caps glibc's malloc arenas (it makes one per allocating thread, and libvips' worker
/// threads each keep theirs). Call before the threads start. 0 or -1.
int canopy_malloc_arenas(int arenas);

/// The libvips version, e.g. "8.14.1".
const char *canopy_vips_version(void);

/// Copies the last error into `buffer` and clears it.
void canopy_vips_error(char *buffer, size_t size);

/// Reads only the header: the size as shown (after EXIF orientation) and the loader's name.
/// 0 or -1.
int canopy_vips_header(const void *bytes, size_t length, int *width, int *height, char *loader, size_t loader_size);

/// Decodes, auto-rotated by EXIF orientation, in sRGB, shrinking on load by `shrink` (1, 2, 4
/// or 8): JPEG by DCT scaling, WebP by its own scaler; other formats decode at full size.
/// Streams (sequential access) unless a rotation needs random access. Truncated input fails
/// when the pixels are read.
canopy_image *canopy_vips_decode(const void *bytes, size_t length, int shrink);

/// Resizes (Lanczos 3, never enlarging when cropping): to exactly width x height, or, with
/// `crop`, to fill width x height and keep its centre.
canopy_image *canopy_vips_resize(canopy_image *image, int width, int height, int crop);

/// Renders the image into memory, so later operations on it do not decode again.
canopy_image *canopy_vips_in_memory(canopy_image *image);

int canopy_vips_width(const canopy_image *image);
int canopy_vips_height(const canopy_image *image);

/// Encodes with every piece of metadata stripped (EXIF, GPS, XMP, ICC: pixels are sRGB).
/// The buffer is released with canopy_vips_free. 0 or -1.
int canopy_vips_encode(canopy_image *image, enum canopy_format format, int quality, void **bytes, size_t *length);

/// 8-bit sRGB pixels, three bytes each, alpha flattened on white; released with canopy_vips_free.
int canopy_vips_rgb(canopy_image *image, void **bytes, size_t *length, int *width, int *height);

void canopy_vips_free(void *bytes);
void canopy_vips_release(canopy_image *image);

// Making test and benchmark images (not used on input from users).

/// A colourful pattern: a hue sweep across, darker downwards, with a few flat blocks.
canopy_image *canopy_vips_pattern(int width, int height);
/// An sRGB image of `width` x `height` 8-bit pixels, three bytes each (copied).
canopy_image *canopy_vips_from_rgb(const void *pixels, int width, int height);
/// Texture for photo-like test images: three fractal surfaces (1/f spectrum), signed 8-bit.
/// Slow (three FFTs): make it once.
canopy_image *canopy_vips_texture(int width, int height);
/// A photo-like picture: the pattern, the texture (shifted by `seed`) and sensor noise. At
/// 4000x3000 and quality 90 it encodes to 2.5 to 3 MB, as a phone's 12 MP photo does.
canopy_image *canopy_vips_photo(canopy_image *texture, int seed);
/// Sets the EXIF orientation tag (1-8) that a save keeps.
int canopy_vips_set_orientation(canopy_image *image, int orientation);
/// Sets a metadata string field, e.g. "exif-ifd3-GPSLatitude".
int canopy_vips_set_string(canopy_image *image, const char *field, const char *value);
/// Whether the image carries a metadata field.
int canopy_vips_has_field(const canopy_image *image, const char *field);
/// Opens bytes lazily (header and metadata only, no pixels), for inspecting output.
canopy_image *canopy_vips_open(const void *bytes, size_t length);
/// Converts to CMYK (for testing CMYK input).
canopy_image *canopy_vips_to_cmyk(canopy_image *image);
/// The image's interpretation name, e.g. "srgb" or "cmyk"; a static string.
const char *canopy_vips_interpretation(const canopy_image *image);
/// Encodes keeping metadata; `progressive` for interlaced JPEG. 0 or -1.
int canopy_vips_encode_keeping_metadata(canopy_image *image, enum canopy_format format, int quality, int progressive, void **bytes, size_t *length);

#endif
