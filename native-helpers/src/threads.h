/*
 * threads: one body run on up to `threads` threads at once, the calling thread among them (it
 * waits for the rest): statdir_many's and fileio_hash_many's pool. The body takes its items
 * itself (an atomic index in arg) until none is left. Header only; plain C, pthread(7).
 */
#ifndef SBX_THREADS_H
#define SBX_THREADS_H
#include <pthread.h>
#include <stddef.h>

/* body(arg) on min(threads, n, 16) threads: the caller's and as many more as pthread_create gives. */
static inline void run_on_threads(void *(*body)(void *), void *arg, size_t n, unsigned threads) {
  enum { MAX_THREADS = 16 };
  pthread_t tids[MAX_THREADS];
  unsigned started = 0;
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  while (started + 1 < threads && started + 1 < n && pthread_create(&tids[started], NULL, body, arg) == 0) started++;
  body(arg);
  for (unsigned t = 0; t < started; t++) pthread_join(tids[t], NULL);
}

#endif
