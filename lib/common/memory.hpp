// Out of memory with a size: the CLI's operator new records the size of a request that failed
// (cli/main.cpp), so that "out of memory" can say how much was asked for and where.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dynemb {

// Called by an allocation function whose request of `bytes` failed (async-signal-safe, no
// allocation).
void note_failed_allocation(std::size_t bytes) noexcept;
// The size of the last failed request, 0 when none was recorded.
std::size_t last_failed_allocation() noexcept;

// "12.3 GiB", "512 B".
std::string human_bytes(double bytes);

// "out of memory (a request for 1.50 GiB failed)", or "out of memory" when the size is unknown.
std::string out_of_memory_text();

// Physical memory of this machine, in bytes (0 when unknown).
uint64_t physical_memory_bytes();
// What a job may use: physical memory, or less under a cgroup memory limit (memory.max);
// DYNEMB_MEMORY_LIMIT (bytes, or with a K/M/G/T suffix) overrides it. 0 when unknown. Not the
// address-space limit (ulimit -v): a job over that runs and reports out of memory where it
// happens.
uint64_t usable_memory_bytes();

// v resized to n elements that the caller is about to overwrite, all of them: a buffer that
// already holds n keeps its memory and its old values (nothing zeroed up to its size); one too
// small is replaced, not grown, so its old contents are not copied, and the new one has room
// for an eighth more, so that buffers handed from one piece to the next of about its size
// (a replay's units) stop growing after the first few.
template <class T>
void resize_to_overwrite(std::vector<T>& v, size_t n) {
  if (v.capacity() < n) {
    std::vector<T> fresh;
    fresh.reserve(n + n / 8);
    v.swap(fresh);
  }
  v.resize(n);
}

// "123", "4G", "512M", "1.5GiB" (K/M/G/T, binary): bytes; 0 when the text is not a size (nan,
// inf, 0, negative, past 2^63 bytes).
uint64_t parse_size(const std::string& text);

}  // namespace dynemb
