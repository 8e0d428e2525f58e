// The reference drain (issue 36): what this machine can do for a durable, hashed drain of one
// pipe, as a yardstick for the supervisor's. stdin (raised to a 1 MiB pipe, as the supervisor's) ->
// FILE in reads of up to 1 MiB; SHA-256 of every byte on a second thread; sync_file_range(2) WRITE
// every 8 MiB and WAIT_BEFORE|WRITE|WAIT_AFTER about two windows back; fdatasync(2) at the end.
// Prints "<bytes> <sha256 hex>". Built by scripts/bench/drain.ts: cc -O2 -pthread ... -lcrypto.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define READ_BYTES (1 << 20)
#define SLOTS 16
#define WINDOW_BYTES (8ULL << 20)

static unsigned char *slot_buf[SLOTS];
static size_t slot_len[SLOTS];
/* Slots filled (by the reader) and hashed (by the hasher), counted from 0; len 0 ends. */
static uint64_t filled, hashed;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static unsigned char digest[32];

static void die_with(const char *what, int err) {
  fprintf(stderr, "reference-drain: %s: %s\n", what, strerror(err));
  exit(1);
}

static void die(const char *what) { die_with(what, errno); }

static void die_crypto(const char *what) {
  fprintf(stderr, "reference-drain: %s failed (OpenSSL)\n", what);
  exit(1);
}

static void *hasher(void *arg) {
  (void)arg;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  if (!ctx || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) die_crypto("EVP_DigestInit_ex");
  for (uint64_t n = 0;; n++) {
    pthread_mutex_lock(&lock);
    while (filled == n) pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);
    size_t len = slot_len[n % SLOTS];
    if (len == 0) break;
    if (!EVP_DigestUpdate(ctx, slot_buf[n % SLOTS], len)) die_crypto("EVP_DigestUpdate");
    pthread_mutex_lock(&lock);
    hashed = n + 1;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
  }
  if (!EVP_DigestFinal_ex(ctx, digest, NULL)) die_crypto("EVP_DigestFinal_ex");
  EVP_MD_CTX_free(ctx);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: reference-drain FILE < pipe\n");
    return 2;
  }
  int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) die("open");
  for (int i = 0; i < SLOTS; i++)
    if (!(slot_buf[i] = malloc(READ_BYTES))) die("malloc");
  // The supervisor raises its pipes to 1 MiB (drain.pipeBytes); a pipe bash made is 64 KiB. Best effort (EPERM past pipe-max-size).
  (void)fcntl(0, F_SETPIPE_SZ, READ_BYTES);
  pthread_t t;
  int err = pthread_create(&t, NULL, hasher, NULL);
  if (err) die_with("pthread_create", err);
  uint64_t total = 0, window_start = 0;
  for (uint64_t n = 0;; n++) {
    pthread_mutex_lock(&lock);
    while (n - hashed >= SLOTS) pthread_cond_wait(&changed, &lock); /* the slot is hashed */
    pthread_mutex_unlock(&lock);
    unsigned char *buf = slot_buf[n % SLOTS];
    ssize_t got = read(0, buf, READ_BYTES);
    if (got < 0 && errno == EINTR) {
      n--;
      continue;
    }
    if (got < 0) die("read");
    for (ssize_t off = 0; off < got;) {
      ssize_t w = write(fd, buf + off, (size_t)(got - off));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) die("write");
      off += w;
    }
    slot_len[n % SLOTS] = (size_t)got;
    pthread_mutex_lock(&lock);
    filled = n + 1;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    if (got == 0) break;
    total += (uint64_t)got;
    if (total - window_start >= WINDOW_BYTES) {
      if (sync_file_range(fd, (off64_t)window_start, (off64_t)(total - window_start), SYNC_FILE_RANGE_WRITE)) die("sync_file_range");
      if (window_start >= 2 * WINDOW_BYTES &&
          sync_file_range(fd, (off64_t)(window_start - 2 * WINDOW_BYTES), (off64_t)WINDOW_BYTES,
                          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER))
        die("sync_file_range");
      window_start = total;
    }
  }
  pthread_join(t, NULL);
  if (fdatasync(fd)) die("fdatasync");
  if (close(fd)) die("close");
  printf("%llu ", (unsigned long long)total);
  for (int i = 0; i < 32; i++) printf("%02x", digest[i]);
  printf("\n");
  return 0;
}
