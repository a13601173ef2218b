#pragma once
// Fault injection for `geotrain local`: SIGUSR1 cuts this worker off from the
// other regions (the emulated links drop everything both ways) until
// SIGUSR2; SIGRTMIN queued with a value sets its emulated WAN uplink to that
// many kbit/s. No LibTorch: geotrain-worker installs the handlers and starts
// the watching thread before it loads its training library.

#include "worker/transport/transport.h"

namespace geo::app {

// Installs handlers for the fault signals (SIGUSR1, SIGUSR2, SIGRTMIN) that
// pass them to watchFaultSignals's thread through a pipe, and blocks them in
// the calling thread, which every thread it starts inherits. A handler, not
// only a mask: threads that libraries start when they are loaded (OpenBLAS's
// pthreads build starts its pool then) may have the signals unblocked, and
// their default action would end the process (a partition once killed a
// worker that way). Call it first thing in main, before any thread of ours.
void prepareFaultSignals();

// Takes the fault signals and tells `transport`, outside any handler:
// SIGUSR1 / SIGUSR2 start and end an emulated partition; SIGRTMIN, queued
// with a value, sets the emulated uplink to that many kbit/s (0: unlimited).
// Its thread unblocks them, so that one that arrives while every other
// thread of ours blocks them (the usual case) interrupts only its read. It
// lives until the process exits, so `transport` must too. Does nothing
// without prepareFaultSignals().
void watchFaultSignals(transport::Transport* transport);

}  // namespace geo::app
