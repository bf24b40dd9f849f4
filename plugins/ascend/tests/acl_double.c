/*
 * A stand-in for libascendcl, for tests on machines without an Ascend NPU.
 *
 * "NPU memory" is host memory handed out by aclrtMalloc and remembered as device memory; aclrtMemcpy
 * checks, as the real runtime would refuse, that the kind it is given matches where each pointer
 * lives (HOST_TO_DEVICE really goes from host memory to device memory...) and that destMax covers
 * the count, counting each kind. It proves the executor's bookkeeping (which side is device memory,
 * which device is current), not CANN: that takes an Ascend machine.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_ALLOC 1024

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct { uintptr_t base; size_t len; int dev; } allocs[MAX_ALLOC];
static int nallocs;
static __thread int current = -1;
static atomic_llong kinds[4], bad_kind, bad_device;

EXPORT int aclInit(const char *cfg) { return 0; }
EXPORT int aclrtGetDeviceCount(uint32_t *n) {
  const char *e = getenv("ACL_DOUBLE_DEVICES");
  *n = e ? (uint32_t)atoi(e) : 2;
  return 0;
}
EXPORT int aclrtSetDevice(int32_t d) {
  current = d;
  return 0;
}
EXPORT const char *aclGetRecentErrMsg(void) { return "acl stand-in: wrong memcpy kind or size"; }

static int device_of(const void *p, size_t n) { /* -1 host */
  int d = -1;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nallocs; i++)
    if ((uintptr_t)p >= allocs[i].base && (uintptr_t)p + n <= allocs[i].base + allocs[i].len) d = allocs[i].dev;
  pthread_mutex_unlock(&mu);
  return d;
}

EXPORT int aclrtMalloc(void **p, size_t n, int policy) {
  if (current < 0) return 107002; /* ACL_ERROR_RT_CONTEXT_NULL */
  *p = calloc(1, n ? n : 1);
  pthread_mutex_lock(&mu);
  if (nallocs < MAX_ALLOC) allocs[nallocs++] = (typeof(allocs[0])){(uintptr_t)*p, n, current};
  pthread_mutex_unlock(&mu);
  return *p ? 0 : 207001;
}
EXPORT int aclrtFree(void *p) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nallocs; i++)
    if (allocs[i].base == (uintptr_t)p) {
      allocs[i] = allocs[--nallocs];
      break;
    }
  pthread_mutex_unlock(&mu);
  free(p);
  return 0;
}
EXPORT int aclrtMallocHost(void **p, size_t n) {
  *p = malloc(n);
  return *p ? 0 : 207001;
}
EXPORT int aclrtFreeHost(void *p) {
  free(p);
  return 0;
}
EXPORT int aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, int kind) {
  if (count > destMax || kind < 0 || kind > 3) return 100000;
  int dd = device_of(dst, count), sd = device_of(src, count);
  int want = dd >= 0 ? (sd >= 0 ? 3 : 1) : (sd >= 0 ? 2 : 0);
  if (want != kind) {
    atomic_fetch_add(&bad_kind, 1);
    return 100000;
  }
  int dev = dd >= 0 ? dd : sd;
  if (dev >= 0 && dev != current) {
    atomic_fetch_add(&bad_device, 1);
    return 107002;
  }
  memmove(dst, src, count);
  atomic_fetch_add(&kinds[kind], 1);
  return 0;
}

EXPORT void acl_double_counters(long long out[6]) {
  for (int i = 0; i < 4; i++) out[i] = atomic_load(&kinds[i]);
  out[4] = atomic_load(&bad_kind);
  out[5] = atomic_load(&bad_device);
}
