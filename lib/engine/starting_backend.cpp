#include "engine/starting_backend.hpp"

#include <exception>
#include <future>
#include <mutex>
#include <system_error>
#include <utility>

#include "common/trace.hpp"
#include "engine/forwarding_backend.hpp"

namespace dynemb {
namespace {

class StartingBackend final : public ForwardingBackend {
 public:
  StartingBackend(std::string name, std::function<std::unique_ptr<Backend>()> make)
      : name_(std::move(name)) {
    try {
      making_ = std::async(std::launch::async, [make] {
        const TraceSpan span("backend start");
        return make();
      });
    } catch (const std::system_error&) {  // no thread to be had: made here, in turn
      take([&make] { return make(); });
    }
  }
  ~StartingBackend() override {
    if (making_.valid()) making_.wait();  // its thread ends before the backend goes
  }
  std::string name() const override { return name_; }

 protected:
  Backend& inner() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!made_ && !failed_) take([this] { return making_.get(); });
    if (failed_) std::rethrow_exception(failed_);
    return *made_;
  }

 private:
  template <class Make>
  void take(Make&& make) const {
    try {
      made_ = make();
    } catch (...) {
      failed_ = std::current_exception();
    }
  }
  std::string name_;
  mutable std::future<std::unique_ptr<Backend>> making_;
  mutable std::mutex mutex_;
  mutable std::unique_ptr<Backend> made_;
  mutable std::exception_ptr failed_;
};

}  // namespace

std::unique_ptr<Backend> make_starting_backend(std::string name,
                                               std::function<std::unique_ptr<Backend>()> make) {
  return std::make_unique<StartingBackend>(std::move(name), std::move(make));
}

}  // namespace dynemb
