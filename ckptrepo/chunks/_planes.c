/*
 * Byte-plane kernels for ckptrepo.chunks.codecs: split elements into byte planes, join
 * planes back into elements, XOR one buffer into another, and the word-difference delta
 * (zigzag(a - b) per little-endian word, and its inverse).
 *
 * Layout (the codecs' BYTEGROUP/DELTA plane layout): for n = len(elements) / width,
 * plane k occupies planes[k*n : (k+1)*n] and holds byte k of every element. Trailing
 * bytes that do not fill an element are not touched; the caller handles them.
 *
 * All functions take buffer-protocol objects, check lengths, and release the GIL while
 * they run. numpy versions of the same operations in codecs.py are the reference and the
 * fallback when this module is not built; tests compare the two.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <stdlib.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* Split n elements into planes that start `stride` bytes apart (stride == n for a whole
   chunk; larger when a block of elements fills part of each plane). */
static void split_generic_at(const uint8_t *src, uint8_t *dst, Py_ssize_t stride, Py_ssize_t n, int width) {
    for (int k = 0; k < width; k++) {
        uint8_t *plane = dst + (Py_ssize_t)k * stride;
        const uint8_t *s = src + k;
        for (Py_ssize_t i = 0; i < n; i++) plane[i] = s[i * width];
    }
}

static void split4_at(const uint8_t *src, uint8_t *dst, Py_ssize_t stride, Py_ssize_t n) {
    uint8_t *p0 = dst, *p1 = dst + stride, *p2 = dst + 2 * stride, *p3 = dst + 3 * stride;
    Py_ssize_t i = 0;
#ifdef __SSE2__
    const __m128i lo = _mm_set1_epi32(0xff);
    for (; i + 16 <= n; i += 16) {
        __m128i w0 = _mm_loadu_si128((const __m128i *)(src + 4 * i));
        __m128i w1 = _mm_loadu_si128((const __m128i *)(src + 4 * i + 16));
        __m128i w2 = _mm_loadu_si128((const __m128i *)(src + 4 * i + 32));
        __m128i w3 = _mm_loadu_si128((const __m128i *)(src + 4 * i + 48));
        __m128i out[4];
        for (int k = 0; k < 4; k++) {
            __m128i a = _mm_and_si128(_mm_srli_epi32(w0, 8 * k), lo);
            __m128i b = _mm_and_si128(_mm_srli_epi32(w1, 8 * k), lo);
            __m128i c = _mm_and_si128(_mm_srli_epi32(w2, 8 * k), lo);
            __m128i d = _mm_and_si128(_mm_srli_epi32(w3, 8 * k), lo);
            out[k] = _mm_packus_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d));
        }
        _mm_storeu_si128((__m128i *)(p0 + i), out[0]);
        _mm_storeu_si128((__m128i *)(p1 + i), out[1]);
        _mm_storeu_si128((__m128i *)(p2 + i), out[2]);
        _mm_storeu_si128((__m128i *)(p3 + i), out[3]);
    }
#endif
    for (; i < n; i++) {
        p0[i] = src[4 * i];
        p1[i] = src[4 * i + 1];
        p2[i] = src[4 * i + 2];
        p3[i] = src[4 * i + 3];
    }
}

static void split2_at(const uint8_t *src, uint8_t *dst, Py_ssize_t stride, Py_ssize_t n) {
    uint8_t *p0 = dst, *p1 = dst + stride;
    Py_ssize_t i = 0;
#ifdef __SSE2__
    const __m128i lo = _mm_set1_epi16(0xff);
    for (; i + 16 <= n; i += 16) {
        __m128i w0 = _mm_loadu_si128((const __m128i *)(src + 2 * i));
        __m128i w1 = _mm_loadu_si128((const __m128i *)(src + 2 * i + 16));
        _mm_storeu_si128((__m128i *)(p0 + i), _mm_packus_epi16(_mm_and_si128(w0, lo), _mm_and_si128(w1, lo)));
        _mm_storeu_si128((__m128i *)(p1 + i), _mm_packus_epi16(_mm_srli_epi16(w0, 8), _mm_srli_epi16(w1, 8)));
    }
#endif
    for (; i < n; i++) {
        p0[i] = src[2 * i];
        p1[i] = src[2 * i + 1];
    }
}

static void split_at(const uint8_t *src, uint8_t *dst, Py_ssize_t stride, Py_ssize_t n, int width) {
    if (width == 4) split4_at(src, dst, stride, n);
    else if (width == 2) split2_at(src, dst, stride, n);
    else split_generic_at(src, dst, stride, n, width);
}

static void join_generic(const uint8_t *src, uint8_t *dst, Py_ssize_t n, int width) {
    for (int k = 0; k < width; k++) {
        const uint8_t *plane = src + (Py_ssize_t)k * n;
        uint8_t *d = dst + k;
        for (Py_ssize_t i = 0; i < n; i++) d[i * width] = plane[i];
    }
}

static void join4p(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3, uint8_t *dst,
                   Py_ssize_t n) {
    Py_ssize_t i = 0;
#ifdef __SSE2__
    for (; i + 16 <= n; i += 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(p0 + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(p1 + i));
        __m128i c = _mm_loadu_si128((const __m128i *)(p2 + i));
        __m128i d = _mm_loadu_si128((const __m128i *)(p3 + i));
        __m128i ab_lo = _mm_unpacklo_epi8(a, b), ab_hi = _mm_unpackhi_epi8(a, b);
        __m128i cd_lo = _mm_unpacklo_epi8(c, d), cd_hi = _mm_unpackhi_epi8(c, d);
        uint8_t *o = dst + 4 * i;
        _mm_storeu_si128((__m128i *)(o), _mm_unpacklo_epi16(ab_lo, cd_lo));
        _mm_storeu_si128((__m128i *)(o + 16), _mm_unpackhi_epi16(ab_lo, cd_lo));
        _mm_storeu_si128((__m128i *)(o + 32), _mm_unpacklo_epi16(ab_hi, cd_hi));
        _mm_storeu_si128((__m128i *)(o + 48), _mm_unpackhi_epi16(ab_hi, cd_hi));
    }
#endif
    for (; i < n; i++) {
        dst[4 * i] = p0[i];
        dst[4 * i + 1] = p1[i];
        dst[4 * i + 2] = p2[i];
        dst[4 * i + 3] = p3[i];
    }
}

static void join4(const uint8_t *src, uint8_t *dst, Py_ssize_t n) {
    join4p(src, src + n, src + 2 * n, src + 3 * n, dst, n);
}

static void join2p(const uint8_t *p0, const uint8_t *p1, uint8_t *dst, Py_ssize_t n) {
    Py_ssize_t i = 0;
#ifdef __SSE2__
    for (; i + 16 <= n; i += 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(p0 + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(p1 + i));
        _mm_storeu_si128((__m128i *)(dst + 2 * i), _mm_unpacklo_epi8(a, b));
        _mm_storeu_si128((__m128i *)(dst + 2 * i + 16), _mm_unpackhi_epi8(a, b));
    }
#endif
    for (; i < n; i++) {
        dst[2 * i] = p0[i];
        dst[2 * i + 1] = p1[i];
    }
}

static void join2(const uint8_t *src, uint8_t *dst, Py_ssize_t n) { join2p(src, src + n, dst, n); }

static void join8(const uint8_t *src, uint8_t *dst, Py_ssize_t n) {
    /* Two width-4 joins of the low and high halves' planes would need a scratch buffer;
       the generic loop over 8 planes is simple and streams each plane once. */
    join_generic(src, dst, n, 8);
}

static void xor_bytes(uint8_t *dst, const uint8_t *src, Py_ssize_t len) {
    Py_ssize_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t a, b;
        memcpy(&a, dst + i, 8);
        memcpy(&b, src + i, 8);
        a ^= b;
        memcpy(dst + i, &a, 8);
    }
    for (; i < len; i++) dst[i] ^= src[i];
}

/* Word-difference delta over the first len / W little-endian words (W = 2, 4, 8; the
   caller handles trailing bytes): dst = zigzag(dst - src), the difference wrapping modulo
   2^(8W) and zigzag-mapped (0, -1, 1, -2, ... -> 0, 1, 2, 3, ...) so a small difference of
   either sign has high bytes of zero. unzigzag_add inverts it: dst = unzigzag(dst) + src. */
#define ZIGZAG_KERNELS(T, BITS)                                                          \
    static void zigzag_sub_##BITS(uint8_t *dst, const uint8_t *src, Py_ssize_t n) {     \
        for (Py_ssize_t i = 0; i < n; i++) {                                            \
            T a, b;                                                                     \
            memcpy(&a, dst + i * sizeof(T), sizeof(T));                                 \
            memcpy(&b, src + i * sizeof(T), sizeof(T));                                 \
            T d = (T)(a - b);                                                           \
            T z = (T)((T)(d << 1) ^ (T)(0 - (d >> (BITS - 1))));                        \
            memcpy(dst + i * sizeof(T), &z, sizeof(T));                                 \
        }                                                                               \
    }                                                                                   \
    static void unzigzag_add_##BITS(uint8_t *dst, const uint8_t *src, Py_ssize_t n) {   \
        for (Py_ssize_t i = 0; i < n; i++) {                                            \
            T z, b;                                                                     \
            memcpy(&z, dst + i * sizeof(T), sizeof(T));                                 \
            memcpy(&b, src + i * sizeof(T), sizeof(T));                                 \
            T d = (T)((T)(z >> 1) ^ (T)(0 - (z & 1)));                                  \
            T a = (T)(b + d);                                                           \
            memcpy(dst + i * sizeof(T), &a, sizeof(T));                                 \
        }                                                                               \
    }
ZIGZAG_KERNELS(uint16_t, 16)
ZIGZAG_KERNELS(uint32_t, 32)
ZIGZAG_KERNELS(uint64_t, 64)

/* zigzag(a - b) for n words of width W, split straight into planes (plane k at
   planes + k * n): the difference of a block goes through a small buffer that stays in
   the L1 cache, so the chunk is read once and the planes written once. */
#define ZIGZAG_BLOCK 2048
static void zigzag_split(const uint8_t *a, const uint8_t *b, uint8_t *planes, Py_ssize_t n, int width) {
    uint8_t block[ZIGZAG_BLOCK * 8];
    for (Py_ssize_t i0 = 0; i0 < n; i0 += ZIGZAG_BLOCK) {
        Py_ssize_t count = n - i0 < ZIGZAG_BLOCK ? n - i0 : ZIGZAG_BLOCK;
        memcpy(block, a + i0 * width, (size_t)(count * width));
        if (width == 2) zigzag_sub_16(block, b + i0 * width, count);
        else if (width == 4) zigzag_sub_32(block, b + i0 * width, count);
        else zigzag_sub_64(block, b + i0 * width, count);
        split_at(block, planes + i0, n, count, width);
    }
}

static int get_buffers(PyObject *src_obj, PyObject *dst_obj, Py_buffer *src, Py_buffer *dst) {
    if (PyObject_GetBuffer(src_obj, src, PyBUF_SIMPLE) < 0) return -1;
    if (PyObject_GetBuffer(dst_obj, dst, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(src);
        return -1;
    }
    return 0;
}

static PyObject *planes_split(PyObject *self, PyObject *args) {
    PyObject *src_obj, *dst_obj;
    int width;
    if (!PyArg_ParseTuple(args, "OiO:split", &src_obj, &width, &dst_obj)) return NULL;
    if (width < 1 || width > 255) return PyErr_Format(PyExc_ValueError, "width %d is out of range 1..255", width);
    Py_buffer src, dst;
    if (get_buffers(src_obj, dst_obj, &src, &dst) < 0) return NULL;
    Py_ssize_t n = src.len / width;
    if (dst.len != n * width) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return PyErr_Format(PyExc_ValueError, "planes buffer is %zd bytes, expected %zd", dst.len, n * width);
    }
    Py_BEGIN_ALLOW_THREADS
    split_at(src.buf, dst.buf, n, n, width);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

static PyObject *planes_join(PyObject *self, PyObject *args) {
    PyObject *src_obj, *dst_obj;
    int width;
    if (!PyArg_ParseTuple(args, "OiO:join", &src_obj, &width, &dst_obj)) return NULL;
    if (width < 1 || width > 255) return PyErr_Format(PyExc_ValueError, "width %d is out of range 1..255", width);
    Py_buffer src, dst;
    if (get_buffers(src_obj, dst_obj, &src, &dst) < 0) return NULL;
    Py_ssize_t n = src.len / width;
    if (src.len != n * width || dst.len < src.len) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return PyErr_Format(PyExc_ValueError, "planes of %zd bytes do not fit width %d and an output of %zd bytes",
                            src.len, width, dst.len);
    }
    Py_BEGIN_ALLOW_THREADS
    if (width == 4) join4(src.buf, dst.buf, n);
    else if (width == 2) join2(src.buf, dst.buf, n);
    else if (width == 8) join8(src.buf, dst.buf, n);
    else join_generic(src.buf, dst.buf, n, width);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

static PyObject *planes_xor_into(PyObject *self, PyObject *args) {
    PyObject *dst_obj, *src_obj;
    if (!PyArg_ParseTuple(args, "OO:xor_into", &dst_obj, &src_obj)) return NULL;
    Py_buffer src, dst;
    if (get_buffers(src_obj, dst_obj, &src, &dst) < 0) return NULL;
    if (src.len != dst.len) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return PyErr_Format(PyExc_ValueError, "xor of %zd bytes into %zd bytes", src.len, dst.len);
    }
    Py_BEGIN_ALLOW_THREADS
    xor_bytes(dst.buf, src.buf, dst.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

static PyObject *word_delta(PyObject *args, const char *fmt, int inverse) {
    PyObject *dst_obj, *src_obj;
    int width;
    if (!PyArg_ParseTuple(args, fmt, &dst_obj, &src_obj, &width)) return NULL;
    if (width != 2 && width != 4 && width != 8)
        return PyErr_Format(PyExc_ValueError, "word delta of width %d (2, 4 or 8)", width);
    Py_buffer src, dst;
    if (get_buffers(src_obj, dst_obj, &src, &dst) < 0) return NULL;
    if (src.len != dst.len) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return PyErr_Format(PyExc_ValueError, "word delta of %zd bytes against %zd bytes", dst.len, src.len);
    }
    Py_ssize_t n = dst.len / width;
    Py_BEGIN_ALLOW_THREADS
    if (width == 2) (inverse ? unzigzag_add_16 : zigzag_sub_16)(dst.buf, src.buf, n);
    else if (width == 4) (inverse ? unzigzag_add_32 : zigzag_sub_32)(dst.buf, src.buf, n);
    else (inverse ? unzigzag_add_64 : zigzag_sub_64)(dst.buf, src.buf, n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

static PyObject *planes_zigzag_split(PyObject *self, PyObject *args) {
    PyObject *a_obj, *b_obj, *planes_obj;
    int width;
    if (!PyArg_ParseTuple(args, "OOiO:zigzag_split", &a_obj, &b_obj, &width, &planes_obj)) return NULL;
    if (width != 2 && width != 4 && width != 8)
        return PyErr_Format(PyExc_ValueError, "word delta of width %d (2, 4 or 8)", width);
    Py_buffer a, b, planes;
    if (PyObject_GetBuffer(a_obj, &a, PyBUF_SIMPLE) < 0) return NULL;
    if (get_buffers(b_obj, planes_obj, &b, &planes) < 0) {
        PyBuffer_Release(&a);
        return NULL;
    }
    Py_ssize_t n = a.len / width;
    PyObject *result = NULL;
    if (b.len != a.len) {
        PyErr_Format(PyExc_ValueError, "word delta of %zd bytes against %zd bytes", a.len, b.len);
    } else if (planes.len != n * width) {
        PyErr_Format(PyExc_ValueError, "planes buffer is %zd bytes, expected %zd", planes.len, n * width);
    } else {
        Py_BEGIN_ALLOW_THREADS
        zigzag_split(a.buf, b.buf, planes.buf, n, width);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    PyBuffer_Release(&planes);
    return result;
}

static PyObject *planes_zigzag_sub(PyObject *self, PyObject *args) { return word_delta(args, "OOi:zigzag_sub", 0); }

static PyObject *planes_unzigzag_add(PyObject *self, PyObject *args) {
    return word_delta(args, "OOi:unzigzag_add", 1);
}

/* One pass of statistics over float32 (kind 0), float64 (kind 1) or bfloat16 (kind 2)
   elements, accumulated in double around a shift (the first element) so the variance
   does not cancel catastrophically. Eight independent accumulators per quantity keep
   the loop free of loop-carried dependencies (and let the compiler use SIMD lanes). */
static inline double load_elem(const uint8_t *p, Py_ssize_t i, int kind) {
    if (kind == 0) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return (double)f;
    }
    if (kind == 1) {
        double d;
        memcpy(&d, p + 8 * i, 8);
        return d;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    uint32_t w = (uint32_t)h << 16;
    float f;
    memcpy(&f, &w, 4);
    return (double)f;
}

/* The elements from i on, one at a time, added to the vector pass's totals; the results into out. */
static inline void moments_tail(const uint8_t *p, Py_ssize_t i, Py_ssize_t n, int kind, double shift, double S,
                                double Q, double L, double H, double *out) {
    for (; i < n; i++) {
        double x = load_elem(p, i, kind), a = x - shift;
        S += a;
        Q += a * a;
        L = x < L ? x : L;
        H = x > H ? x : H;
    }
    out[0] = S;
    out[1] = Q;
    out[2] = L;
    out[3] = H;
}

#define LANES 8

#define MOMENTS_FAST(NAME, KIND)                                                              \
    static void NAME(const uint8_t *p, Py_ssize_t n, double shift, double *out) {            \
        double s[LANES] = {0}, q[LANES] = {0}, lo[LANES], hi[LANES];                           \
        for (int j = 0; j < LANES; j++) {                                                      \
            lo[j] = INFINITY;                                                                  \
            hi[j] = -INFINITY;                                                                 \
        }                                                                                      \
        Py_ssize_t i = 0;                                                                      \
        for (; i + LANES <= n; i += LANES) {                                                   \
            double a[LANES];                                                                   \
            double x[LANES];                                                                   \
            for (int j = 0; j < LANES; j++) x[j] = load_elem(p, i + j, KIND);                  \
            for (int j = 0; j < LANES; j++) {                                                  \
                a[j] = x[j] - shift;                                                           \
                s[j] += a[j];                                                                  \
                q[j] += a[j] * a[j];                                                           \
                lo[j] = x[j] < lo[j] ? x[j] : lo[j];                                           \
                hi[j] = x[j] > hi[j] ? x[j] : hi[j];                                           \
            }                                                                                  \
        }                                                                                      \
        for (; i < n; i++) {                                                                   \
            double x = load_elem(p, i, KIND), a = x - shift;                                   \
            s[0] += a;                                                                         \
            q[0] += a * a;                                                                     \
            lo[0] = x < lo[0] ? x : lo[0];                                                     \
            hi[0] = x > hi[0] ? x : hi[0];                                                     \
        }                                                                                      \
        double S = 0, Q = 0, L = INFINITY, H = -INFINITY;                                      \
        for (int j = 0; j < LANES; j++) {                                                      \
            S += s[j];                                                                         \
            Q += q[j];                                                                         \
            L = lo[j] < L ? lo[j] : L;                                                         \
            H = hi[j] > H ? hi[j] : H;                                                         \
        }                                                                                      \
        out[0] = S;                                                                            \
        out[1] = Q;                                                                            \
        out[2] = L;                                                                            \
        out[3] = H;                                                                            \
    }

#ifdef __SSE2__
/* float32 and bfloat16 with SSE2: four floats at a time, widened to two pairs of doubles,
   into independent accumulators. */
typedef struct {
    __m128d s0, s1, q0, q1, lo0, lo1, hi0, hi1, sh;
} acc4;

static inline void acc4_init(acc4 *c, double shift) {
    c->s0 = c->s1 = c->q0 = c->q1 = _mm_setzero_pd();
    c->lo0 = c->lo1 = _mm_set1_pd(INFINITY);
    c->hi0 = c->hi1 = _mm_set1_pd(-INFINITY);
    c->sh = _mm_set1_pd(shift);
}

static inline void acc4_add(acc4 *c, __m128 f) {
    __m128d x = _mm_cvtps_pd(f), y = _mm_cvtps_pd(_mm_movehl_ps(f, f));
    __m128d a = _mm_sub_pd(x, c->sh), b = _mm_sub_pd(y, c->sh);
    c->s0 = _mm_add_pd(c->s0, a);
    c->s1 = _mm_add_pd(c->s1, b);
    c->q0 = _mm_add_pd(c->q0, _mm_mul_pd(a, a));
    c->q1 = _mm_add_pd(c->q1, _mm_mul_pd(b, b));
    c->lo0 = _mm_min_pd(c->lo0, x);
    c->lo1 = _mm_min_pd(c->lo1, y);
    c->hi0 = _mm_max_pd(c->hi0, x);
    c->hi1 = _mm_max_pd(c->hi1, y);
}

static inline void acc4_finish(acc4 *c, const uint8_t *p, Py_ssize_t i, Py_ssize_t n, int kind,
                               double shift, double *out) {
    double v[2], S, Q, L, H;
    _mm_storeu_pd(v, _mm_add_pd(c->s0, c->s1));
    S = v[0] + v[1];
    _mm_storeu_pd(v, _mm_add_pd(c->q0, c->q1));
    Q = v[0] + v[1];
    _mm_storeu_pd(v, _mm_min_pd(c->lo0, c->lo1));
    L = v[0] < v[1] ? v[0] : v[1];
    _mm_storeu_pd(v, _mm_max_pd(c->hi0, c->hi1));
    H = v[0] > v[1] ? v[0] : v[1];
    moments_tail(p, i, n, kind, shift, S, Q, L, H, out);
}

static void moments_f32(const uint8_t *p, Py_ssize_t n, double shift, double *out) {
    acc4 c;
    acc4_init(&c, shift);
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4) acc4_add(&c, _mm_loadu_ps((const float *)(p + 4 * i)));
    acc4_finish(&c, p, i, n, 0, shift, out);
}

static void moments_bf16(const uint8_t *p, Py_ssize_t n, double shift, double *out) {
    acc4 c;
    acc4_init(&c, shift);
    const __m128i zero = _mm_setzero_si128();
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(p + 2 * i));
        acc4_add(&c, _mm_castsi128_ps(_mm_unpacklo_epi16(zero, h)));
        acc4_add(&c, _mm_castsi128_ps(_mm_unpackhi_epi16(zero, h)));
    }
    acc4_finish(&c, p, i, n, 2, shift, out);
}
#else
MOMENTS_FAST(moments_f32, 0)
MOMENTS_FAST(moments_bf16, 2)
#endif
MOMENTS_FAST(moments_f64, 1)

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_AVX2_MOMENTS 1 /* and the AVX-512 pass */
/* The same pass with AVX2 and FMA, chosen at run time where the CPU has them. float64
   (``moments_avx2_f64``): 16 elements per iteration as four vectors of four doubles, each
   into its own accumulators (sum, sum of squares by fused multiply-add, min, max). float32
   and bfloat16 take ``moments_avx2_narrow``. */
#define AVX_STEP(X, S, Q, L, H)                                                                \
    do {                                                                                       \
        __m256d a_ = _mm256_sub_pd((X), sh);                                                   \
        S = _mm256_add_pd(S, a_);                                                              \
        Q = _mm256_fmadd_pd(a_, a_, Q);                                                        \
        L = _mm256_min_pd(L, (X));                                                             \
        H = _mm256_max_pd(H, (X));                                                             \
    } while (0)

/* float32 and bfloat16 with AVX2 (the AVX-512 narrow pass's design on 256-bit vectors): min
   and max on the float32 lanes, eight at a time, before widening (the conversion to double
   is exact and keeps the order: the same figures as widening first), so that the eight
   double accumulators, the two float ones and the shift fit the sixteen registers without
   spilling; the sums take the same lanes in the same order as the one AVX2 pass for every
   kind did before it, and a software prefetch runs ahead of the loads (the AVX-512 pass's distances).
   float32 on a Zen 3 (AVX2, no AVX-512), one thread over 64 MiB: 10.8 GB/s through that
   pass, 19.5 GB/s here; ``copy_moments`` 7.5 -> 10.4 GB/s, against 8.9 for
   numpy's copy of the same bytes. */
#define AVX2_AHEAD_F32 2048
#define AVX2_AHEAD_BF16 4096
#define AVX2_F8(F, SA, QA, SB, QB)                                                             \
    do {                                                                                       \
        __m256d a_ = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(F)), sh);             \
        __m256d b_ = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps((F), 1)), sh);         \
        SA = _mm256_add_pd(SA, a_);                                                            \
        QA = _mm256_fmadd_pd(a_, a_, QA);                                                      \
        SB = _mm256_add_pd(SB, b_);                                                            \
        QB = _mm256_fmadd_pd(b_, b_, QB);                                                      \
    } while (0)

__attribute__((target("avx2,fma"))) static void moments_avx2_narrow(const uint8_t *p, Py_ssize_t n, int bf16,
                                                                    double shift, double *out) {
    const __m256d sh = _mm256_set1_pd(shift);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    __m256d q0 = s0, q1 = s0, q2 = s0, q3 = s0;
    __m256 lo = _mm256_set1_ps(INFINITY), hi = _mm256_set1_ps(-INFINITY);
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 f, g;
        if (bf16) {
            _mm_prefetch((const char *)(p + 2 * i + AVX2_AHEAD_BF16), _MM_HINT_T0);
            __m256i b = _mm256_loadu_si256((const __m256i *)(p + 2 * i));
            f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(b)), 16));
            g = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(b, 1)), 16));
        } else {
            _mm_prefetch((const char *)(p + 4 * i + AVX2_AHEAD_F32), _MM_HINT_T0);
            f = _mm256_loadu_ps((const float *)(p + 4 * i));
            g = _mm256_loadu_ps((const float *)(p + 4 * i + 32));
        }
        lo = _mm256_min_ps(lo, _mm256_min_ps(f, g));
        hi = _mm256_max_ps(hi, _mm256_max_ps(f, g));
        AVX2_F8(f, s0, q0, s1, q1);
        AVX2_F8(g, s2, q2, s3, q3);
    }
    double v[4], S, Q, L = INFINITY, H = -INFINITY;
    float w[8];
    _mm256_storeu_pd(v, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
    S = (v[0] + v[1]) + (v[2] + v[3]);
    _mm256_storeu_pd(v, _mm256_add_pd(_mm256_add_pd(q0, q1), _mm256_add_pd(q2, q3)));
    Q = (v[0] + v[1]) + (v[2] + v[3]);
    _mm256_storeu_ps(w, lo);
    for (int j = 0; j < 8; j++) L = (double)w[j] < L ? (double)w[j] : L;
    _mm256_storeu_ps(w, hi);
    for (int j = 0; j < 8; j++) H = (double)w[j] > H ? (double)w[j] : H;
    moments_tail(p, i, n, bf16 ? 2 : 0, shift, S, Q, L, H, out);
}

__attribute__((target("avx2,fma"))) static void moments_avx2_f64(const uint8_t *p, Py_ssize_t n, double shift,
                                                                 double *out) {
    const __m256d sh = _mm256_set1_pd(shift);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    __m256d q0 = s0, q1 = s0, q2 = s0, q3 = s0;
    __m256d l0 = _mm256_set1_pd(INFINITY), l1 = l0, l2 = l0, l3 = l0;
    __m256d h0 = _mm256_set1_pd(-INFINITY), h1 = h0, h2 = h0, h3 = h0;
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const double *d = (const double *)(p + 8 * i);
        __m256d x0 = _mm256_loadu_pd(d), x1 = _mm256_loadu_pd(d + 4);
        __m256d x2 = _mm256_loadu_pd(d + 8), x3 = _mm256_loadu_pd(d + 12);
        AVX_STEP(x0, s0, q0, l0, h0);
        AVX_STEP(x1, s1, q1, l1, h1);
        AVX_STEP(x2, s2, q2, l2, h2);
        AVX_STEP(x3, s3, q3, l3, h3);
    }
    double v[4], S = 0, Q = 0, L = INFINITY, H = -INFINITY;
    _mm256_storeu_pd(v, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
    S = (v[0] + v[1]) + (v[2] + v[3]);
    _mm256_storeu_pd(v, _mm256_add_pd(_mm256_add_pd(q0, q1), _mm256_add_pd(q2, q3)));
    Q = (v[0] + v[1]) + (v[2] + v[3]);
    _mm256_storeu_pd(v, _mm256_min_pd(_mm256_min_pd(l0, l1), _mm256_min_pd(l2, l3)));
    for (int j = 0; j < 4; j++) L = v[j] < L ? v[j] : L;
    _mm256_storeu_pd(v, _mm256_max_pd(_mm256_max_pd(h0, h1), _mm256_max_pd(h2, h3)));
    for (int j = 0; j < 4; j++) H = v[j] > H ? v[j] : H;
    moments_tail(p, i, n, 1, shift, S, Q, L, H, out);
}

/* The same pass with AVX-512 (F, DQ, BW, VL), chosen at run time where the CPU has it.
   32 registers hold every accumulator (the AVX2 float64 pass's sixteen spill to the stack, which
   puts a store and a reload on each accumulator's dependency chain). float32 and bfloat16:
   min and max are taken on the float32 lanes, sixteen at a time, before widening (the
   conversion to double is exact and keeps the order); each half of sixteen floats widens
   to eight doubles for the shifted sum and sum of squares, four vectors per iteration
   into their own accumulators. bfloat16 is widened by interleaving zero low halves: the
   lanes come out in a different order, which only the statistics' rounding could see.
   float64: four vectors of eight doubles per iteration, min and max in double. */
#define AVX512_STEP(X, S, Q)                                                                   \
    do {                                                                                       \
        __m512d a_ = _mm512_sub_pd((X), sh);                                                   \
        S = _mm512_add_pd(S, a_);                                                              \
        Q = _mm512_fmadd_pd(a_, a_, Q);                                                        \
    } while (0)

#define AVX512_TARGET __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl")))

/* Sixteen float32 lanes into min/max (float lanes) and two double accumulator pairs. */
#define AVX512_F16(F, S0, Q0, S1, Q1, L, H)                                                    \
    do {                                                                                       \
        L = _mm512_min_ps(L, (F));                                                             \
        H = _mm512_max_ps(H, (F));                                                             \
        __m512d lo_ = _mm512_cvtps_pd(_mm512_castps512_ps256(F));                              \
        __m512d hi_ = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(F), 1))); \
        AVX512_STEP(lo_, S0, Q0);                                                              \
        AVX512_STEP(hi_, S1, Q1);                                                              \
    } while (0)

/* float32 (bf16 == 0) or bfloat16 (bf16 == 1): 32 elements per iteration. Streaming from
   memory, this loop alone keeps too few cache lines in flight for one core's bandwidth
   (without help it read float32 at about 11 GB/s and bfloat16 at under 6 GB/s where the
   float64 loop reads 15); a software prefetch this many bytes ahead brings both to the
   float64 loop's rate. Chosen on a Xeon with AVX-512 over 117 MiB buffers in 4 MiB
   chunks: float32 was flat from 2 to 3 KiB and slower from 4 KiB, bfloat16 best from
   4 KiB. float64 reads more bytes per instruction and gained nothing from it. */
#define AVX512_AHEAD_F32 2048
#define AVX512_AHEAD_BF16 4096
static inline AVX512_TARGET __attribute__((always_inline)) void moments_avx512_narrow(
    const uint8_t *p, Py_ssize_t n, int bf16, double shift, double *out) {
    const __m512d sh = _mm512_set1_pd(shift);
    const __m512i zero = _mm512_setzero_si512();
    __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    __m512d q0 = s0, q1 = s0, q2 = s0, q3 = s0;
    __m512 l0 = _mm512_set1_ps(INFINITY), l1 = l0;
    __m512 h0 = _mm512_set1_ps(-INFINITY), h1 = h0;
    Py_ssize_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 f, g;
        if (bf16) {
            _mm_prefetch((const char *)(p + 2 * i + AVX512_AHEAD_BF16), _MM_HINT_T0);
        } else {
            _mm_prefetch((const char *)(p + 4 * i + AVX512_AHEAD_F32), _MM_HINT_T0);
            _mm_prefetch((const char *)(p + 4 * i + 64 + AVX512_AHEAD_F32), _MM_HINT_T0);
        }
        if (bf16) {
            __m512i b = _mm512_loadu_si512((const void *)(p + 2 * i));
            f = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, b));
            g = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, b));
        } else {
            f = _mm512_loadu_ps((const void *)(p + 4 * i));
            g = _mm512_loadu_ps((const void *)(p + 4 * i + 64));
        }
        AVX512_F16(f, s0, q0, s1, q1, l0, h0);
        AVX512_F16(g, s2, q2, s3, q3, l1, h1);
    }
    if (!bf16) {
        for (; i + 16 <= n; i += 16) {
            __m512 f = _mm512_loadu_ps((const void *)(p + 4 * i));
            AVX512_F16(f, s0, q0, s1, q1, l0, h0);
        }
    }
    double S = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(s0, s1), _mm512_add_pd(s2, s3)));
    double Q = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(q0, q1), _mm512_add_pd(q2, q3)));
    double L = (double)_mm512_reduce_min_ps(_mm512_min_ps(l0, l1));
    double H = (double)_mm512_reduce_max_ps(_mm512_max_ps(h0, h1));
    moments_tail(p, i, n, bf16 ? 2 : 0, shift, S, Q, L, H, out);
}

static inline AVX512_TARGET __attribute__((always_inline)) void moments_avx512_f64(
    const uint8_t *p, Py_ssize_t n, double shift, double *out) {
    const __m512d sh = _mm512_set1_pd(shift);
    __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    __m512d q0 = s0, q1 = s0, q2 = s0, q3 = s0;
    __m512d l0 = _mm512_set1_pd(INFINITY), l1 = l0, l2 = l0, l3 = l0;
    __m512d h0 = _mm512_set1_pd(-INFINITY), h1 = h0, h2 = h0, h3 = h0;
    Py_ssize_t i = 0;
    const double *d = (const double *)p;
    for (; i + 32 <= n; i += 32) {
        __m512d x0 = _mm512_loadu_pd(d + i), x1 = _mm512_loadu_pd(d + i + 8);
        __m512d x2 = _mm512_loadu_pd(d + i + 16), x3 = _mm512_loadu_pd(d + i + 24);
        AVX512_STEP(x0, s0, q0);
        AVX512_STEP(x1, s1, q1);
        AVX512_STEP(x2, s2, q2);
        AVX512_STEP(x3, s3, q3);
        l0 = _mm512_min_pd(l0, x0);
        l1 = _mm512_min_pd(l1, x1);
        l2 = _mm512_min_pd(l2, x2);
        l3 = _mm512_min_pd(l3, x3);
        h0 = _mm512_max_pd(h0, x0);
        h1 = _mm512_max_pd(h1, x1);
        h2 = _mm512_max_pd(h2, x2);
        h3 = _mm512_max_pd(h3, x3);
    }
    for (; i + 8 <= n; i += 8) {
        __m512d x0 = _mm512_loadu_pd(d + i);
        AVX512_STEP(x0, s0, q0);
        l0 = _mm512_min_pd(l0, x0);
        h0 = _mm512_max_pd(h0, x0);
    }
    double S = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(s0, s1), _mm512_add_pd(s2, s3)));
    double Q = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(q0, q1), _mm512_add_pd(q2, q3)));
    double L = _mm512_reduce_min_pd(_mm512_min_pd(_mm512_min_pd(l0, l1), _mm512_min_pd(l2, l3)));
    double H = _mm512_reduce_max_pd(_mm512_max_pd(_mm512_max_pd(h0, h1), _mm512_max_pd(h2, h3)));
    moments_tail(p, i, n, 1, shift, S, Q, L, H, out);
}

AVX512_TARGET static void moments_avx512(const uint8_t *p, Py_ssize_t n, int kind, double shift, double *out) {
    if (kind == 0) moments_avx512_narrow(p, n, 0, shift, out);
    else if (kind == 2) moments_avx512_narrow(p, n, 1, shift, out);
    else moments_avx512_f64(p, n, shift, out);
}

/* Which pass runs, decided once per process: AVX-512 where the CPU has F, DQ, BW and VL
   (unless CKPT_NO_AVX512 is set), else AVX2 + FMA (unless CKPT_NO_AVX2 is set, which also
   turns AVX-512 off), else the portable pass. */
enum { MOMENTS_PORTABLE = 0, MOMENTS_AVX2 = 1, MOMENTS_AVX512 = 2 };

static int moments_path(void) {
    static int path = -1;
    if (path < 0) {
        __builtin_cpu_init();
        int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && getenv("CKPT_NO_AVX2") == NULL;
        int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")
                     && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")
                     && getenv("CKPT_NO_AVX512") == NULL;
        path = avx512 ? MOMENTS_AVX512 : avx2 ? MOMENTS_AVX2 : MOMENTS_PORTABLE;
    }
    return path;
}
#endif

/* The pass moments runs here over n elements from p, around shift: out = (S, Q, L, H). */
static void moments_range(const uint8_t *p, Py_ssize_t n, int kind, double shift, double *out) {
#ifdef HAVE_AVX2_MOMENTS
    int path = moments_path();
    if (path == MOMENTS_AVX512) {
        moments_avx512(p, n, kind, shift, out);
        return;
    }
    if (path == MOMENTS_AVX2) {
        if (kind == 1) moments_avx2_f64(p, n, shift, out);
        else moments_avx2_narrow(p, n, kind == 2, shift, out);
        return;
    }
#endif
    if (kind == 0) moments_f32(p, n, shift, out);
    else if (kind == 1) moments_f64(p, n, shift, out);
    else moments_bf16(p, n, shift, out);
}

/* The shift of a pass over elements starting at p: the first element if finite, else 0. */
static double moments_shift(const uint8_t *p, Py_ssize_t n, int kind) {
    if (n <= 0) return 0.0;
    double first = load_elem(p, 0, kind);
    return isfinite(first) ? first : 0.0;
}

/* When a pass's sums are not finite (non-finite elements, or an overflow of the sum of
   squares): count NaN and ±Inf and accumulate the finite elements only, one at a time. */
static void moments_nonfinite(const uint8_t *p, Py_ssize_t n, int kind, double shift, double *out,
                              Py_ssize_t *finite, Py_ssize_t *nan, Py_ssize_t *inf) {
    double S = 0, Q = 0, L = INFINITY, H = -INFINITY;
    *finite = *nan = *inf = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double x = load_elem(p, i, kind);
        if (isnan(x)) {
            (*nan)++;
            continue;
        }
        if (isinf(x)) {
            (*inf)++;
            continue;
        }
        double a = x - shift;
        S += a;
        Q += a * a;
        L = x < L ? x : L;
        H = x > H ? x : H;
        (*finite)++;
    }
    out[0] = S;
    out[1] = Q;
    out[2] = L;
    out[3] = H;
}

static PyObject *planes_moments(PyObject *self, PyObject *args) {
    PyObject *obj;
    int kind;
    if (!PyArg_ParseTuple(args, "Oi:moments", &obj, &kind)) return NULL;
    if (kind < 0 || kind > 2) return PyErr_Format(PyExc_ValueError, "kind %d is not 0 (f32), 1 (f64) or 2 (bf16)", kind);
    Py_buffer buf;
    if (PyObject_GetBuffer(obj, &buf, PyBUF_SIMPLE) < 0) return NULL;
    int size = kind == 0 ? 4 : kind == 1 ? 8 : 2;
    Py_ssize_t n = buf.len / size;
    const uint8_t *p = buf.buf;
    double shift = 0, out[4] = {0, 0, INFINITY, -INFINITY};
    Py_ssize_t finite = n, nan = 0, inf = 0;
    Py_BEGIN_ALLOW_THREADS
    shift = moments_shift(p, n, kind);
    if (n > 0) moments_range(p, n, kind, shift, out);
    if (!isfinite(out[0]) || !isfinite(out[1])) moments_nonfinite(p, n, kind, shift, out, &finite, &nan, &inf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return Py_BuildValue("(nddddddnn)", finite, shift, out[0], out[1], out[2], out[3], 0.0, nan, inf);
}

/* copy_moments(src, dst, kind): copy src into dst (same length) and return moments(src, kind)'s
   tuple, in one pass over memory. Block by block (COPY_BLOCK bytes, a whole number of
   elements of every kind): the block's moments from src, which brings it into L1, then its
   copy from there, with non-temporal stores where dst is 16-byte aligned (the destination's
   lines are not read first, and do not evict the cache). The sums are those of moments()
   up to rounding: they are added block by block, around the same shift. */
#define COPY_BLOCK 16384

static void copy_block(uint8_t *dst, const uint8_t *src, Py_ssize_t len) {
#ifdef __SSE2__
    if (((uintptr_t)dst & 15) == 0) {
        Py_ssize_t i = 0;
        for (; i + 64 <= len; i += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
            __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
            _mm_stream_si128((__m128i *)(dst + i), a);
            _mm_stream_si128((__m128i *)(dst + i + 16), b);
            _mm_stream_si128((__m128i *)(dst + i + 32), c);
            _mm_stream_si128((__m128i *)(dst + i + 48), d);
        }
        if (i < len) memcpy(dst + i, src + i, (size_t)(len - i));
        return;
    }
#endif
    memcpy(dst, src, (size_t)len);
}

/* The pass of copy_moments over one buffer pair (n elements of kind; len bytes in all); out as
   moments' figures. Runs without the GIL. */
static void copy_moments_pass(const uint8_t *p, uint8_t *q, Py_ssize_t len, int kind, double *shift_out,
                              double *out, Py_ssize_t *finite, Py_ssize_t *nan, Py_ssize_t *inf) {
    int size = kind == 0 ? 4 : kind == 1 ? 8 : 2;
    Py_ssize_t n = len / size, whole = n * size;
    double shift = moments_shift(p, n, kind);
    out[0] = out[1] = 0;
    out[2] = INFINITY;
    out[3] = -INFINITY;
    *finite = n;
    *nan = *inf = 0;
    for (Py_ssize_t off = 0; off < whole; off += COPY_BLOCK) {
        Py_ssize_t blen = whole - off < COPY_BLOCK ? whole - off : COPY_BLOCK;
        double part[4] = {0, 0, INFINITY, -INFINITY};
        moments_range(p + off, blen / size, kind, shift, part);
        out[0] += part[0];
        out[1] += part[1];
        out[2] = part[2] < out[2] ? part[2] : out[2];
        out[3] = part[3] > out[3] ? part[3] : out[3];
        copy_block(q + off, p + off, blen);
    }
    if (whole < len) memcpy(q + whole, p + whole, (size_t)(len - whole));
    if (!isfinite(out[0]) || !isfinite(out[1])) moments_nonfinite(q, n, kind, shift, out, finite, nan, inf);
    *shift_out = shift;
}

/* copy_moments_many(pairs): copy_moments of each (src, dst, kind) of a list, in order, in one
   call: the GIL is released once for them all (a thread that copies a commit's chunks in one
   call does not hand the GIL back and forth with the other copying thread at every chunk). */
static PyObject *planes_copy_moments_many(PyObject *self, PyObject *args) {
    PyObject *list_obj;
    if (!PyArg_ParseTuple(args, "O:copy_moments_many", &list_obj)) return NULL;
    PyObject *seq = PySequence_Fast(list_obj, "copy_moments_many takes a sequence of (src, dst, kind)");
    if (seq == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq), got = 0;
    Py_buffer *bufs = PyMem_Calloc(count > 0 ? 2 * count : 1, sizeof(Py_buffer));
    int *kinds = PyMem_Calloc(count > 0 ? count : 1, sizeof(int));
    double *figures = PyMem_Calloc(count > 0 ? 5 * count : 1, sizeof(double));
    Py_ssize_t *counts = PyMem_Calloc(count > 0 ? 3 * count : 1, sizeof(Py_ssize_t));
    PyObject *result = NULL;
    if (bufs == NULL || kinds == NULL || figures == NULL || counts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < count; got++) {
        PyObject *src_obj, *dst_obj;
        int kind;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, got), "OOi:copy_moments_many item", &src_obj, &dst_obj,
                              &kind))
            goto done;
        if (kind < 0 || kind > 2) {
            PyErr_Format(PyExc_ValueError, "item %zd: kind %d is not 0 (f32), 1 (f64) or 2 (bf16)", got, kind);
            goto done;
        }
        if (get_buffers(src_obj, dst_obj, &bufs[2 * got], &bufs[2 * got + 1]) < 0) goto done;
        kinds[got] = kind;
        if (bufs[2 * got].len != bufs[2 * got + 1].len) {
            PyErr_Format(PyExc_ValueError, "item %zd: dst is %zd bytes, src %zd", got, bufs[2 * got + 1].len,
                         bufs[2 * got].len);
            got++;
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        copy_moments_pass(bufs[2 * i].buf, bufs[2 * i + 1].buf, bufs[2 * i].len, kinds[i], &figures[5 * i],
                          &figures[5 * i + 1], &counts[3 * i], &counts[3 * i + 1], &counts[3 * i + 2]);
    }
#ifdef __SSE2__
    _mm_sfence(); /* the streamed stores are globally visible before this returns */
#endif
    Py_END_ALLOW_THREADS
    result = PyList_New(count);
    if (result == NULL) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        double *f = &figures[5 * i];
        Py_ssize_t *c = &counts[3 * i];
        PyObject *item = Py_BuildValue("(nddddddnn)", c[0], f[0], f[1], f[2], f[3], f[4], 0.0, c[1], c[2]);
        if (item == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, item);
    }
done:
    if (bufs != NULL) {
        for (Py_ssize_t i = 0; i < got; i++) {
            PyBuffer_Release(&bufs[2 * i]);
            PyBuffer_Release(&bufs[2 * i + 1]);
        }
    }
    PyMem_Free(bufs);
    PyMem_Free(kinds);
    PyMem_Free(figures);
    PyMem_Free(counts);
    Py_DECREF(seq);
    return result;
}

static PyObject *planes_copy_moments(PyObject *self, PyObject *args) {
    PyObject *src_obj, *dst_obj;
    int kind;
    if (!PyArg_ParseTuple(args, "OOi:copy_moments", &src_obj, &dst_obj, &kind)) return NULL;
    PyObject *item = Py_BuildValue("[(OOi)]", src_obj, dst_obj, kind);
    if (item == NULL) return NULL;
    PyObject *call = Py_BuildValue("(N)", item); /* takes item's reference */
    if (call == NULL) return NULL;
    PyObject *many = planes_copy_moments_many(self, call);
    Py_DECREF(call);
    if (many == NULL) return NULL;
    PyObject *one = PyList_GET_ITEM(many, 0);
    Py_INCREF(one);
    Py_DECREF(many);
    return one;
}

static PyObject *planes_moments_kernel(PyObject *self, PyObject *noargs) {
#ifdef HAVE_AVX2_MOMENTS
    int path = moments_path();
    return PyUnicode_FromString(path == MOMENTS_AVX512 ? "avx512" : path == MOMENTS_AVX2 ? "avx2" : "portable");
#else
    return PyUnicode_FromString("portable");
#endif
}

/* join_list(planes, elements): like join, with each plane its own buffer (no gathering copy). */
static PyObject *planes_join_list(PyObject *self, PyObject *args) {
    PyObject *seq_obj, *dst_obj;
    if (!PyArg_ParseTuple(args, "OO:join_list", &seq_obj, &dst_obj)) return NULL;
    PyObject *seq = PySequence_Fast(seq_obj, "planes must be a sequence of buffers");
    if (seq == NULL) return NULL;
    Py_ssize_t width = PySequence_Fast_GET_SIZE(seq);
    if (width < 1 || width > 255) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "%zd planes is out of range 1..255", width);
    }
    Py_buffer bufs[255], dst;
    Py_ssize_t got = 0, n = -1;
    PyObject *result = NULL;
    for (; got < width; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &bufs[got], PyBUF_SIMPLE) < 0) goto done;
        if (n < 0) n = bufs[got].len;
        if (bufs[got].len != n) {
            PyErr_Format(PyExc_ValueError, "plane %zd is %zd bytes, plane 0 is %zd", got, bufs[got].len, n);
            got++;
            goto done;
        }
    }
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_WRITABLE) < 0) goto done;
    if (dst.len < n * width) {
        PyErr_Format(PyExc_ValueError, "output of %zd bytes is shorter than %zd", dst.len, n * width);
        PyBuffer_Release(&dst);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    uint8_t *out = dst.buf;
    if (width == 4) {
        join4p(bufs[0].buf, bufs[1].buf, bufs[2].buf, bufs[3].buf, out, n);
    } else if (width == 2) {
        join2p(bufs[0].buf, bufs[1].buf, out, n);
    } else {
        for (Py_ssize_t k = 0; k < width; k++) {
            const uint8_t *plane = bufs[k].buf;
            uint8_t *d = out + k;
            for (Py_ssize_t i = 0; i < n; i++) d[i * width] = plane[i];
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&dst);
    Py_INCREF(Py_None);
    result = Py_None;
done:
    for (Py_ssize_t k = 0; k < got; k++) PyBuffer_Release(&bufs[k]);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"join_list", planes_join_list, METH_VARARGS,
     "join_list(planes, elements): interleave equal-length plane buffers into elements."},
    {"moments", planes_moments, METH_VARARGS,
     "moments(buffer, kind) -> (finite, shift, sum(x-shift), sum((x-shift)**2), min, max, 0.0, nan, inf) "
     "over the finite elements; "
     "kind 0 float32, 1 float64, 2 bfloat16."},
    {"copy_moments", planes_copy_moments, METH_VARARGS,
     "copy_moments(src, dst, kind) -> moments(src, kind)'s tuple, up to rounding; copies src into dst "
     "(equal lengths) in the same pass."},
    {"copy_moments_many", planes_copy_moments_many, METH_VARARGS,
     "copy_moments_many([(src, dst, kind), ...]) -> [copy_moments(src, dst, kind), ...], the GIL released once."},
    {"moments_kernel", planes_moments_kernel, METH_NOARGS,
     "moments_kernel() -> 'avx512', 'avx2' or 'portable': the pass moments runs in this process."},
    {"split", planes_split, METH_VARARGS,
     "split(elements, width, planes): write byte k of each element to plane k of planes."},
    {"join", planes_join, METH_VARARGS,
     "join(planes, width, elements): inverse of split; writes len(planes) bytes of elements."},
    {"xor_into", planes_xor_into, METH_VARARGS, "xor_into(dst, src): dst ^= src, equal lengths."},
    {"zigzag_sub", planes_zigzag_sub, METH_VARARGS,
     "zigzag_sub(dst, src, width): dst = zigzag(dst - src) per width-byte word (2, 4, 8); tail bytes untouched."},
    {"zigzag_split", planes_zigzag_split, METH_VARARGS,
     "zigzag_split(a, b, width, planes): the planes of zigzag(a - b) per width-byte word; tail bytes untouched."},
    {"unzigzag_add", planes_unzigzag_add, METH_VARARGS,
     "unzigzag_add(dst, src, width): dst = unzigzag(dst) + src per width-byte word; inverse of zigzag_sub."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_planes", NULL, -1, methods};

PyMODINIT_FUNC PyInit__planes(void) { return PyModule_Create(&module); }
