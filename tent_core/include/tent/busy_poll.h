/*
 * tent/busy_poll.h: adaptive busy polling, the policy (pure, header-only, no system calls).
 *
 * A thread about to wait for bytes it expects soon (the answer of a small request, the next
 * small request on a server connection) may poll the socket first instead of sleeping in the
 * kernel: waking a sleeping thread costs tens of microseconds on small VMs, as long as a 64 KiB
 * request itself. Polling wins when the bytes come within the poll and the core it holds is not
 * needed elsewhere; it loses when they come later (the budget is burnt, then the thread sleeps
 * anyway) and, worse, on a busy host, where the polling thread holds a core that other threads
 * (perhaps the very peer it waits for) need: then everything, its own answers included, comes
 * later than if it had slept. Neither a fixed poll nor none is right everywhere, so each waiter
 * (a connection) learns from its own outcomes, like adaptive spin mutexes and the kernel's
 * halt-poll governors, and compares the two ways of waiting directly:
 *
 *  - a poll *hits* when the bytes came within its budget and the thread kept its core the whole
 *    time; it *misses* when they came later, or when the poll lost its core (a gap of at least
 *    TENT_BUSY_POLL_LOST_NS between two looks at the socket: another thread was waiting for
 *    this core, so polling here competes with real work; such a miss weighs twice). `score` is
 *    the hit rate of the recent polls (an exponential average over about 8);
 *  - `poll_ns` and `sleep_ns` average the whole cycle of waits that polled and of waits that
 *    slept: from the start of the exchange the wait belongs to (a client's send of its request,
 *    a server's receipt of the previous request) until the thread had its bytes (each sample
 *    capped at 4x the cap, so one preemption of milliseconds does not decide alone). A sleeping
 *    wait pays the wake-up; a polling one pays whatever its polling costs the peer, which the
 *    poller's own hit rate cannot see (measured from the send on, a cycle also catches a peer
 *    that ran on the sender's core inside its send). Polling goes on while the score is at least one half
 *    and polled waits are at least a fifth shorter than slept ones (a core is held only for a
 *    clear gain; noise favours sleeping); while polling, one wait in TENT_BUSY_POLL_SLEEP_EVERY
 *    sleeps to keep `sleep_ns` current;
 *  - sleeping, it probes: every `probe_gap`-th wait polls and counts half in `poll_ns`; when
 *    that brings polled cycles a fifth under slept ones (and the probe hit), polling comes back,
 *    else the gap doubles (up to TENT_BUSY_POLL_PROBE_MAX waits, so a busy host pays at most one
 *    budget every 256 waits). Polling that stops again within TENT_BUSY_POLL_STREAK polls
 *    doubles the gap too (no flapping between a lucky probe and its unlucky followers); after a
 *    longer stretch the gap starts again at TENT_BUSY_POLL_PROBE_MIN;
 *  - the budget follows the waits that hit: an answer in the last half of the budget doubles it,
 *    one in the first eighth shrinks it by 1/16 (it settles between 2x and 8x the typical wait,
 *    so a miss burns little), never below TENT_BUSY_POLL_MIN_NS nor above the cap; a miss on a
 *    core nobody else wanted that ended within twice the cap (the bytes came after the budget
 *    but about within the cap; the wake-up came on top) doubles it: a longer poll would have
 *    caught them.
 *
 * Use: b = tent_busy_poll_begin(&st) before a wait (ns to poll, 0: sleep at once); poll up to b
 * noting whether the core was lost; then tent_busy_poll_end(&st, b, waited_ns, cycle_ns, lost)
 * with the time from the start of the wait until the thread had its bytes (poll and sleep
 * together) and the whole cycle (see above; at least waited_ns).
 * `adaptive` 0 is a fixed poll of the cap every time; cap 0 never polls.
 * Not thread-safe: one state per waiter (the executors keep one per connection).
 */
#ifndef TENT_BUSY_POLL_H
#define TENT_BUSY_POLL_H

#include <stdint.h>

#define TENT_BUSY_POLL_SCORE_ONE 1024u  /* score of a waiter whose every poll hit */
#define TENT_BUSY_POLL_SCORE_POLL 512u  /* poll while the score is at least this (half the polls hit) */
#define TENT_BUSY_POLL_PROBE_MIN 8u     /* sleeping: the first probe after this many waits */
#define TENT_BUSY_POLL_PROBE_MAX 256u   /* ... the gap doubling after each failed probe up to this */
#define TENT_BUSY_POLL_SLEEP_EVERY 16u  /* polling: one wait in this many sleeps (measures sleep_ns) */
#define TENT_BUSY_POLL_STREAK 64u       /* polling that lasted this many polls was no fluke */
#define TENT_BUSY_POLL_MIN_NS 4000u     /* the budget never shrinks below this */
#define TENT_BUSY_POLL_LOST_NS 10000u   /* a gap this long while polling: the core was taken from us */

typedef struct tent_busy_poll {
  uint32_t cap_ns;      /* the configured poll (busy_poll_us): the budget's ceiling; 0: never poll */
  uint32_t budget_ns;   /* what the next poll gets */
  uint32_t score;       /* recent hit rate, 0..TENT_BUSY_POLL_SCORE_ONE */
  uint32_t probe_gap;   /* sleeping: one wait in this many probes */
  uint32_t until_probe; /* sleeping: waits left before the next probe */
  uint32_t until_sleep; /* polling: waits left before the next one that sleeps */
  uint32_t poll_ns;     /* average wait that polled (0: none yet) */
  uint32_t sleep_ns;    /* average wait that slept (0: none yet) */
  uint32_t streak;      /* polls since polling (re)started */
  uint32_t adaptive;    /* 0: poll the cap every time */
  /* outcomes, for counters and tests */
  uint64_t waits, polls, hits, lost;
} tent_busy_poll_t;

static inline void tent_busy_poll_init(tent_busy_poll_t *st, uint32_t cap_ns, int adaptive) {
  *st = (tent_busy_poll_t){0};
  st->cap_ns = cap_ns;
  st->budget_ns = cap_ns;
  st->score = TENT_BUSY_POLL_SCORE_ONE; /* start polling: the first outcomes decide */
  st->probe_gap = TENT_BUSY_POLL_PROBE_MIN;
  st->until_probe = TENT_BUSY_POLL_PROBE_MIN;
  st->until_sleep = TENT_BUSY_POLL_SLEEP_EVERY;
  st->adaptive = adaptive != 0;
}

/* Polling is the better way to wait, as far as the recent outcomes tell. */
static inline int tent_busy_poll_polling(const tent_busy_poll_t *st) {
  return st->score >= TENT_BUSY_POLL_SCORE_POLL &&
         (!st->sleep_ns || !st->poll_ns || (uint64_t)st->poll_ns * 5 <= (uint64_t)st->sleep_ns * 4);
}

/* Nanoseconds to poll before this wait sleeps (0: sleep at once). */
static inline uint32_t tent_busy_poll_begin(tent_busy_poll_t *st) {
  st->waits++;
  if (!st->cap_ns) return 0;
  if (!st->adaptive) return st->budget_ns;
  if (tent_busy_poll_polling(st)) {
    if (--st->until_sleep > 0) return st->budget_ns;
    st->until_sleep = TENT_BUSY_POLL_SLEEP_EVERY;
    return 0; /* sleep once: how long a sleeping wait takes now */
  }
  if (--st->until_probe > 0) return 0;
  st->until_probe = st->probe_gap; /* a probe; its outcome sets the next gap */
  return st->budget_ns;
}

static inline uint32_t tent_busy_poll_avg_(uint32_t avg, uint64_t sample, unsigned shift) {
  if (!avg) return (uint32_t)sample;
  return (uint32_t)((int64_t)avg + (((int64_t)sample - (int64_t)avg) >> shift));
}

/* The outcome of a wait that polled `polled_ns` (what begin returned; 0: it slept at once): the
 * thread had its bytes `waited_ns` after the wait began, `cycle_ns` after its exchange began;
 * `lost`: the poll lost its core. */
static inline void tent_busy_poll_end(tent_busy_poll_t *st, uint32_t polled_ns, uint64_t waited_ns, uint64_t cycle_ns,
                                      int lost) {
  if (!st->cap_ns) return;
  if (cycle_ns < waited_ns) cycle_ns = waited_ns;
  uint64_t sample = cycle_ns < 4ull * st->cap_ns ? cycle_ns : 4ull * st->cap_ns;
  if (!polled_ns) {
    if (st->adaptive) st->sleep_ns = tent_busy_poll_avg_(st->sleep_ns, sample ? sample : 1, 2);
    return;
  }
  st->polls++;
  int hit = waited_ns <= polled_ns && !lost;
  st->hits += (uint64_t)hit;
  st->lost += (uint64_t)(lost != 0);
  if (!st->adaptive) return;
  int probing = !tent_busy_poll_polling(st);
  st->score -= st->score / (lost ? 4 : 8); /* a lost core weighs twice: polling took a core others needed */
  if (hit) st->score += TENT_BUSY_POLL_SCORE_ONE / 8;
  uint32_t cyc = (uint32_t)(sample ? sample : 1);
  if (probing) {
    st->poll_ns = tent_busy_poll_avg_(st->poll_ns, cyc, 1);
    if (hit && st->score < TENT_BUSY_POLL_SCORE_POLL + TENT_BUSY_POLL_SCORE_ONE / 8)
      st->score = TENT_BUSY_POLL_SCORE_POLL + TENT_BUSY_POLL_SCORE_ONE / 8; /* a hit earns another look */
    if (hit && tent_busy_poll_polling(st)) {
      st->streak = 0;
      st->until_sleep = TENT_BUSY_POLL_SLEEP_EVERY;
    } else {
      if (st->probe_gap < TENT_BUSY_POLL_PROBE_MAX) st->probe_gap *= 2;
      st->until_probe = st->probe_gap;
      if (!hit) st->score = st->score < TENT_BUSY_POLL_SCORE_POLL ? st->score : TENT_BUSY_POLL_SCORE_POLL - 1;
    }
  } else {
    st->streak++;
    st->poll_ns = tent_busy_poll_avg_(st->poll_ns, cyc, 3);
    if (!tent_busy_poll_polling(st)) { /* polling stops */
      if (st->streak >= TENT_BUSY_POLL_STREAK) st->probe_gap = TENT_BUSY_POLL_PROBE_MIN;
      else if (st->probe_gap < TENT_BUSY_POLL_PROBE_MAX) st->probe_gap *= 2;
      st->until_probe = st->probe_gap;
    }
  }
  uint64_t b = st->budget_ns;
  if (hit && waited_ns > b / 2) b *= 2;
  else if (hit && waited_ns < b / 8) b -= b / 16;
  else if (!hit && !lost && waited_ns <= 2ull * st->cap_ns) b *= 2; /* the wake-up came on top */
  if (b < TENT_BUSY_POLL_MIN_NS) b = TENT_BUSY_POLL_MIN_NS;
  if (b > st->cap_ns) b = st->cap_ns;
  st->budget_ns = (uint32_t)b;
}

#endif /* TENT_BUSY_POLL_H */
