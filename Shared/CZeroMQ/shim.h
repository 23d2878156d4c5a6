#ifndef CANOPY_CZEROMQ_SHIM_H
#define CANOPY_CZEROMQ_SHIM_H
// libzmq's C API, plus eventfd, which the bus uses to wake a socket's owner thread
// from other threads without sharing the socket.
#include <zmq.h>
#include <sys/eventfd.h>
#endif
