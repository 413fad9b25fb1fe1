// BackendStartup (backend.hpp): a backend made on another thread while its caller goes on.
#include "engine/backend.hpp"

#include <exception>
#include <future>
#include <mutex>
#include <system_error>
#include <utility>

#include "common/trace.hpp"

namespace dynemb {

struct BackendStartup::State {
  std::future<std::unique_ptr<Backend>> making;
  std::mutex mutex;
  std::unique_ptr<Backend> made;
  Backend* borrowed = nullptr;
  std::exception_ptr failed;
  template <class Make>
  void take(Make&& make) {
    try {
      made = make();
    } catch (...) {
      failed = std::current_exception();
    }
  }
};

BackendStartup::BackendStartup(std::string name, std::function<std::unique_ptr<Backend>()> make)
    : name_(std::move(name)), state_(std::make_unique<State>()) {
  try {
    state_->making = std::async(std::launch::async, [make] {
      const TraceSpan span("backend start");
      return make();
    });
  } catch (const std::system_error&) {  // no thread to be had: made here, in turn
    state_->take([&make] { return make(); });
  }
}

BackendStartup::BackendStartup(std::unique_ptr<Backend> ready)
    : name_(ready->name()), state_(std::make_unique<State>()) {
  state_->made = std::move(ready);
}

BackendStartup::BackendStartup(Backend& ready)
    : name_(ready.name()), state_(std::make_unique<State>()) {
  state_->borrowed = &ready;
}

BackendStartup::~BackendStartup() {
  if (state_ && state_->making.valid()) state_->making.wait();  // its thread ends first
}

BackendStartup::BackendStartup(BackendStartup&&) noexcept = default;

Backend& BackendStartup::get() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->borrowed) return *state_->borrowed;
  if (!state_->made && !state_->failed) state_->take([this] { return state_->making.get(); });
  if (state_->failed) std::rethrow_exception(state_->failed);
  return *state_->made;
}

bool BackendStartup::failed() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->failed != nullptr;
}

bool BackendStartup::ready() const {
  using namespace std::chrono_literals;
  return state_->borrowed || !state_->making.valid() ||
         state_->making.wait_for(0s) == std::future_status::ready;
}

}  // namespace dynemb
