/*
 * Frame ids remembered across decodes.
 *
 * Why: a frame's id is an FNV-1a hash of its name, file and line (hashing.h), a byte at a
 * time, and it was the largest single cost of decoding an upload: every upload of an agent
 * names the same few hundred frames again.  Looking a frame up here reads its bytes eight at
 * a time and compares them with memcmp, several times cheaper; a frame not here is hashed as
 * before and kept.
 *
 * One table per thread (decoding runs on several threads without the GIL, so no lock), of
 * four-way buckets: a frame takes an empty way of its bucket or evicts one.  The table goes
 * with its thread.
 */
#include "frame_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hashing.h"

#define WAYS 4
#define BUCKETS 4096      /* of WAYS slots each, per thread: 16,384 frames, 1-2 MB */
#define SLOTS (BUCKETS * WAYS)
#define MAX_KEPT 4096 /* bytes of name and file; longer frames are hashed every time */

typedef struct {
    uint64_t key; /* 0: empty */
    int64_t line, id;
    uint32_t name_len, file_len, cap;
    uint8_t *bytes; /* the name, then the file; ``cap`` bytes allocated */
} Slot;

static pthread_key_t table_key;
static pthread_once_t table_once = PTHREAD_ONCE_INIT;
static int table_key_ok;

static void
free_table(void *p)
{
    Slot *slots = (Slot *)p;
    for (size_t i = 0; i < SLOTS; i++)
        free(slots[i].bytes);
    free(slots);
}

static void
make_key(void)
{
    table_key_ok = pthread_key_create(&table_key, free_table) == 0;
}

/* The thread's table, once made: read for every frame, it costs no call into pthread. */
static _Thread_local Slot *this_thread;

static Slot *
this_threads_table(void)
{
    if (this_thread)
        return this_thread;
    pthread_once(&table_once, make_key);
    if (!table_key_ok)
        return NULL;
    Slot *slots = (Slot *)pthread_getspecific(table_key);
    if (!slots) {
        slots = (Slot *)calloc(SLOTS, sizeof(Slot));
        if (slots && pthread_setspecific(table_key, slots) != 0) {
            free(slots);
            slots = NULL;
        }
    }
    this_thread = slots;
    return slots;
}

/* Eight bytes at a time: a lookup key, not an id (collisions only cost a miss). */
static inline uint64_t
mix_words(uint64_t h, const uint8_t *p, size_t n)
{
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * K_MUL;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t tail = 0;
    memcpy(&tail, p, n);
    return (h ^ tail ^ ((uint64_t)n << 56)) * K_MUL;
}

static inline int
same_frame(const Slot *s, uint64_t key, const uint8_t *name, size_t name_len,
           const uint8_t *file, size_t file_len, int64_t line)
{
    return s->key == key && s->line == line && s->name_len == name_len &&
           s->file_len == file_len && memcmp(s->bytes, name, name_len) == 0 &&
           memcmp(s->bytes + name_len, file, file_len) == 0;
}

int64_t
cached_frame_id(const uint8_t *name, size_t name_len, const uint8_t *file, size_t file_len,
                int64_t line)
{
    size_t size = name_len + file_len;
    Slot *slots = size <= MAX_KEPT ? this_threads_table() : NULL;
    if (!slots)
        return hash_frame_raw(name, name_len, file, file_len, line);
    uint64_t key = mix_words(GOLDEN ^ (uint64_t)name_len, name, name_len);
    key = fmix64(mix_words(key ^ (uint64_t)line, file, file_len)) | 1;
    Slot *bucket = &slots[(key & (BUCKETS - 1)) * WAYS];
    for (int i = 0; i < WAYS; i++)
        if (same_frame(&bucket[i], key, name, name_len, file, file_len, line))
            return bucket[i].id;
    int64_t id = hash_frame_raw(name, name_len, file, file_len, line);
    /* An empty way, else the one the key's high bits pick. */
    Slot *s = &bucket[(key >> 60) % WAYS];
    for (int i = 0; i < WAYS; i++)
        if (bucket[i].key == 0) {
            s = &bucket[i];
            break;
        }
    if (s->cap < size) {
        uint8_t *bytes = (uint8_t *)realloc(s->bytes, size);
        if (!bytes)
            return id; /* the slot keeps its old frame */
        s->bytes = bytes;
        s->cap = (uint32_t)size;
    }
    memcpy(s->bytes, name, name_len);
    memcpy(s->bytes + name_len, file, file_len);
    s->key = key;
    s->line = line;
    s->id = id;
    s->name_len = (uint32_t)name_len;
    s->file_len = (uint32_t)file_len;
    return id;
}
