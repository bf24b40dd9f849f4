/*
 * A stand-in for libcudart, for tests on machines without a GPU.
 *
 * It exports the CUDA runtime calls the nvlink executor resolves, with their signatures, over
 * host memory: cudaMemcpyAsync only records the copy on its stream, cudaEventRecord marks how far
 * the stream got, and cudaEventSynchronize performs the stream's copies up to that mark. A gate
 * (cudart_double_hold) keeps copies "in flight" as long as a test wants, so it can check that
 * the executor's teardown waits for them. cudaStreamWaitEvent queues a wait: the stream's later copies
 * run only after the waited stream's copies up to the event's record (performed first, as a GPU would
 * order them). It proves the executor's ordering, not CUDA: that takes scripts/gpu_check.sh on a GPU
 * machine.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_COPIES 4096

struct stream;

typedef struct copy {
  void *dst;
  const void *src;
  size_t n;
  struct stream *wait_stream; /* a wait entry: the other stream up to wait_upto first */
  size_t wait_upto;
} copy_t;

typedef struct stream {
  copy_t copies[MAX_COPIES];
  size_t issued, done; /* copies[done..issued) are in flight */
} stream_t;

typedef struct event {
  stream_t *stream;
  size_t upto;
} event_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int hold;
static atomic_llong n_issued, n_done;

EXPORT void cudart_double_hold(int on) {
  pthread_mutex_lock(&mu);
  hold = on;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

EXPORT long long cudart_double_issued(void) { return atomic_load(&n_issued); }
EXPORT long long cudart_double_done(void) { return atomic_load(&n_done); }

EXPORT int cudaSetDevice(int dev) { return 0; }

EXPORT int cudaStreamCreateWithFlags(void **s, unsigned flags) {
  *s = calloc(1, sizeof(stream_t));
  return *s ? 0 : 2; /* cudaErrorMemoryAllocation */
}

EXPORT int cudaStreamDestroy(void *s) {
  free(s);
  return 0;
}

EXPORT int cudaEventCreateWithFlags(void **e, unsigned flags) {
  *e = calloc(1, sizeof(event_t));
  return *e ? 0 : 2;
}

EXPORT int cudaEventDestroy(void *e) {
  free(e);
  return 0;
}

EXPORT int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *s) {
  stream_t *st = s;
  pthread_mutex_lock(&mu);
  if (st->issued - st->done >= MAX_COPIES) {
    pthread_mutex_unlock(&mu);
    return 2;
  }
  st->copies[st->issued % MAX_COPIES] = (copy_t){dst, src, n, NULL, 0};
  st->issued++;
  pthread_mutex_unlock(&mu);
  atomic_fetch_add(&n_issued, 1);
  return 0;
}

EXPORT int cudaEventRecord(void *e, void *s) {
  event_t *ev = e;
  pthread_mutex_lock(&mu);
  ev->stream = s;
  ev->upto = ((stream_t *)s)->issued;
  pthread_mutex_unlock(&mu);
  return 0;
}

static void perform(stream_t *st, size_t upto) { /* mu held */
  while (st && st->done < upto) {
    copy_t c = st->copies[st->done % MAX_COPIES];
    st->done++;
    if (c.wait_stream) {
      perform(c.wait_stream, c.wait_upto);
      continue;
    }
    memcpy(c.dst, c.src, c.n);
    atomic_fetch_add(&n_done, 1);
  }
}

EXPORT int cudaEventSynchronize(void *e) {
  event_t *ev = e;
  pthread_mutex_lock(&mu);
  while (hold) pthread_cond_wait(&cv, &mu);
  perform(ev->stream, ev->upto);
  pthread_mutex_unlock(&mu);
  return 0;
}

EXPORT int cudaEventQuery(void *e) {
  event_t *ev = e;
  pthread_mutex_lock(&mu);
  int done = !ev->stream || ev->stream->done >= ev->upto;
  pthread_mutex_unlock(&mu);
  return done ? 0 : 600; /* cudaErrorNotReady */
}

EXPORT int cudaStreamWaitEvent(void *s, void *e, unsigned flags) {
  stream_t *st = s;
  event_t *ev = e;
  pthread_mutex_lock(&mu);
  if (st->issued - st->done >= MAX_COPIES) {
    pthread_mutex_unlock(&mu);
    return 2;
  }
  st->copies[st->issued % MAX_COPIES] = (copy_t){NULL, NULL, 0, ev->stream, ev->upto};
  st->issued++;
  pthread_mutex_unlock(&mu);
  return 0;
}

/* test helpers: a "user" stream whose copies run only when something waits for them */
EXPORT void *cudart_double_stream(void) {
  void *s = NULL;
  cudaStreamCreateWithFlags(&s, 0);
  return s;
}

EXPORT void *cudart_double_event(void) {
  void *e = NULL;
  cudaEventCreateWithFlags(&e, 0);
  return e;
}

EXPORT const char *cudaGetErrorString(int e) { return e ? "cudart stand-in error" : "no error"; }
