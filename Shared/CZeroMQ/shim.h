#ifndef CANOPY_CZEROMQ_SHIM_H
#define CANOPY_CZEROMQ_SHIM_H
// libzmq's C API, plus eventfd, which the bus uses to wake a socket's owner thread
// from other threads without sharing the socket, and malloc_trim, with which the broker
// gives memory back after a burst.
#include <zmq.h>
#include <sys/eventfd.h>
#include <pthread.h>
#include <malloc.h>

// glibc declares this only under _GNU_SOURCE.
extern int pthread_setname_np(pthread_t thread, const char *name);

/// Names the calling thread (at most 15 bytes show), so top and perf tell the loops apart.
static inline void canopy_name_thread(const char *name) {
    pthread_setname_np(pthread_self(), name);
}
#endif
