/*
 * tent/cpu_relax.h: the pause hint for short bounded spins (a waiter polling a counter that
 * another thread is about to finish), so the spinning core yields its pipeline to a sibling
 * hyper-thread and does not flood the memory bus. Header-only.
 */
#ifndef TENT_CPU_RELAX_H
#define TENT_CPU_RELAX_H

static inline void tent_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

#endif /* TENT_CPU_RELAX_H */
