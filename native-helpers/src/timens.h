/* timens: a file timestamp as nanoseconds since the epoch in an int64, the unit statdir and
   fileio give the walk and the checkpoint (stat(3type) struct timespec). */
#ifndef SBX_TIMENS_H
#define SBX_TIMENS_H

#include <stdint.h>
#include <time.h>

/* tv_sec x 10^9 + tv_nsec, or INT64_MIN when that is past int64 (before 1677-09-21 or after
   2262-04-11, which touch -d makes): the caller then gives the seconds and nanoseconds apart. */
static inline int64_t time_ns(const struct timespec *t) {
  int64_t ns;
  if (__builtin_mul_overflow((int64_t)t->tv_sec, (int64_t)1000000000, &ns) || __builtin_add_overflow(ns, (int64_t)t->tv_nsec, &ns) || ns == INT64_MIN)
    return INT64_MIN;
  return ns;
}

#endif
