/* The ids of frames and stacks, as hotspan/model/hashing.py computes them: every C reader
 * (pprof.c, jfr.c) names what it reads with the ids the Python readers and the store use. */
#ifndef HOTSPAN_HASHING_H
#define HOTSPAN_HASHING_H

#include <stddef.h>
#include <stdint.h>

#define FNV_OFFSET 0xCBF29CE484222325ULL
#define FNV_PRIME 0x100000001B3ULL
#define GOLDEN 0x9E3779B97F4A7C15ULL
#define K_LEN 0xC2B2AE3D27D4EB4FULL
#define K_MUL 0x87C37B91114253D5ULL

/* MurmurHash3's 64-bit finalizer. */
static inline uint64_t
fmix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 33;
    return h;
}

static inline uint64_t
fnv_bytes(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * FNV_PRIME;
    return h;
}

/* A frame: its name, \0, its file name, \0, its line as 8 little-endian bytes. */
static inline int64_t
hash_frame_raw(const uint8_t *name, size_t name_len, const uint8_t *file, size_t file_len,
               int64_t line)
{
    uint64_t h = FNV_OFFSET;
    uint8_t zero = 0, le[8];
    uint64_t u = (uint64_t)line;
    h = fnv_bytes(h, name, name_len);
    h = fnv_bytes(h, &zero, 1);
    h = fnv_bytes(h, file, file_len);
    h = fnv_bytes(h, &zero, 1);
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(u >> (8 * i));
    h = fnv_bytes(h, le, 8);
    return (int64_t)fmix64(h);
}

/* A stack: its frame ids, root first. */
static inline int64_t
hash_stack_raw(const int64_t *ids, size_t n)
{
    uint64_t h = GOLDEN ^ ((uint64_t)n * K_LEN);
    for (size_t i = 0; i < n; i++) {
        h ^= fmix64((uint64_t)ids[i] + GOLDEN);
        h = ((h << 31) | (h >> 33)) * K_MUL;
    }
    return (int64_t)fmix64(h);
}

#endif
