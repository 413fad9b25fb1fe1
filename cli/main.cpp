#include <climits>
#include <cstdlib>
#include <new>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "commands.hpp"
#include "common/memory.hpp"

// The replaceable allocation functions, so that an allocation that fails records its size
// ("out of memory (a request for 12.00 GiB failed)", common/memory.hpp). Not under ASan, whose
// own operator new reports what it should. The matching operator delete of the library frees
// what malloc returned.
#if !defined(__SANITIZE_ADDRESS__)
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DYNEMB_NO_NEW_REPLACEMENT 1
#endif
#endif
#else
#define DYNEMB_NO_NEW_REPLACEMENT 1
#endif

#ifndef DYNEMB_NO_NEW_REPLACEMENT
namespace {
void* allocate(std::size_t n) {
  if (n == 0) n = 1;
  for (;;) {
    if (void* p = std::malloc(n)) return p;
    std::new_handler h = std::get_new_handler();
    if (!h) {
      dynemb::note_failed_allocation(n);
      throw std::bad_alloc();
    }
    h();
  }
}
}  // namespace

void* operator new(std::size_t n) {
  return allocate(n);
}
void* operator new[](std::size_t n) {
  return allocate(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
#endif

int main(int argc, char** argv) {
#if defined(__GLIBC__) && !defined(DYNEMB_NO_NEW_REPLACEMENT)
  // A replay allocates and frees a batch's large tensors again for every batch. glibc serves
  // blocks above its mmap threshold with mmap and unmaps them on free, so each batch faults
  // its memory in again, zero-filled by the kernel, on every thread that touches it. Served
  // from the heap and not trimmed, freed batch memory is reused instead: the peak is the same,
  // the page faults are paid once. (A short-lived process; what it keeps is returned at exit.)
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
  // One arena for every thread: a replay's rows are allocated on the thread that reads them and
  // freed on the one that checks them, and with an arena per thread each keeps its own freed
  // blocks (the peak grows by what sits free in the other arenas). The threads' allocations
  // are few and large (rows, chunk buffers), so sharing the arena's lock costs nothing.
  mallopt(M_ARENA_MAX, 1);
#endif
  return dynemb::cli::main_entry(argc, argv);
}
