/*
 * tent/config_kv.h: reading the "key=value;key=value" string that create() receives
 * (see executor_abi.h). Header-only.
 */
#ifndef TENT_CONFIG_KV_H
#define TENT_CONFIG_KV_H

#include <stddef.h>
#include <string.h>

/* The next entry at *cursor: copies its key and value (NUL-terminated) and returns 1, or
 * returns 0 at the end. Blanks before a key are skipped; entries without '=' and entries too
 * long for the buffers are passed over rather than truncated into a wrong value. */
static inline int tent_config_next(const char **cursor, char *key, size_t keylen, char *val, size_t vallen) {
  const char *p = *cursor;
  while (p && *p) {
    const char *end = strchr(p, ';');
    const char *stop = end ? end : p + strlen(p);
    const char *entry = p;
    p = end ? end + 1 : stop;
    while (entry < stop && *entry == ' ') entry++;
    const char *eq = memchr(entry, '=', (size_t)(stop - entry));
    if (!eq || eq == entry) continue;
    size_t kn = (size_t)(eq - entry), vn = (size_t)(stop - eq - 1);
    if (kn >= keylen || vn >= vallen) continue;
    memcpy(key, entry, kn);
    key[kn] = 0;
    memcpy(val, eq + 1, vn);
    val[vn] = 0;
    *cursor = p;
    return 1;
  }
  *cursor = p;
  return 0;
}

#endif
