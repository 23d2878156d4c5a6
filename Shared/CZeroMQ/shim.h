#ifndef CANOPY_CZEROMQ_SHIM_H
#define CANOPY_CZEROMQ_SHIM_H
// libzmq's C API, plus eventfd, which the bus uses to wake a socket's owner thread
// from other threads without sharing the socket, and malloc_trim, with which the broker
// gives memory back after a burst.
#include <zmq.h>
#include <sys/eventfd.h>
#include <pthread.h>
#include <malloc.h>
#include <string.h>
#include <sys/prctl.h>

// glibc declares this only under _GNU_SOURCE.
extern int pthread_setname_np(pthread_t thread, const char *name);

/// Names the calling thread (at most 15 bytes show), so top and perf tell the loops apart.
static inline void canopy_name_thread(const char *name) {
    pthread_setname_np(pthread_self(), name);
}

/// Whether the calling thread is named `name` (one prctl, no allocation: safe inside an
/// allocator's hook, where canopy-bench counts one thread's allocations).
static inline int canopy_thread_is_named(const char *name) {
    char own[16] = {0};
    if (prctl(PR_GET_NAME, own, 0, 0, 0) != 0) return 0;
    return strncmp(own, name, 15) == 0;
}
#endif
