// OutputFile and check_output_clashes (common/output_file.hpp): identity by device and inode
// whatever the spelling, the temporary made up front, commit / discard, symbolic links written
// through, the signal handler's registry.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/error.hpp"
#include "common/memory.hpp"
#include "common/output_file.hpp"
#include "common/signals.hpp"

using namespace dynemb;

namespace {

struct ScratchDir {
  std::string path;
  ScratchDir() {
    char tmpl[] = "/tmp/test_output_file.XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~ScratchDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

void put(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string get(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

std::string clash_message(const std::vector<NamedPath>& in, const std::vector<NamedPath>& out) {
  try {
    check_output_clashes(in, out);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("an output is compared with the inputs by identity, not by spelling") {
  ScratchDir d;
  put(d / "in.h5", "input");
  REQUIRE(::symlink("in.h5", (d / "link.h5").c_str()) == 0);
  REQUIRE(::link((d / "in.h5").c_str(), (d / "hard.h5").c_str()) == 0);
  const std::vector<NamedPath> in{{"capture", d / "in.h5"}};
  for (const std::string& spelling :
       {d / "in.h5", d.path + "/./in.h5", d.path + "//in.h5", d / "link.h5", d / "hard.h5"}) {
    CAPTURE(spelling);
    const std::string m = clash_message(in, {{"--json", spelling}});
    CHECK(m.find("(--json) is the same file as the input " + d / "in.h5" + " (capture)") !=
          std::string::npos);
  }
  CHECK(clash_message(in, {{"--json", d / "other.json"}}) == "");
  // A missing input is left to its own open to report.
  CHECK(clash_message({{"capture", d / "missing.h5"}}, {{"-o", d / "x.h5"}}) == "");
}

TEST_CASE("two outputs on one file clash, existing or not") {
  ScratchDir d;
  CHECK(clash_message({}, {{"--json", d / "r"}, {"--junit", d.path + "/./r"}})
            .find("(--junit) is the same file as the output " + d / "r" + " (--json)") !=
        std::string::npos);
  REQUIRE(::symlink("r", (d / "rl").c_str()) == 0);  // dangling: resolved by name
  CHECK(clash_message({}, {{"--json", d / "r"}, {"--junit", d / "rl"}}) != "");
  CHECK(clash_message({}, {{"--json", d / "a"}, {"--junit", d / "b"}}) == "");
}

TEST_CASE("the temporary exists from the start; commit renames, destruction removes") {
  ScratchDir d;
  std::string temp;
  {
    OutputFile out(d / "r.json");
    temp = out.temp_path();
    // "<target>.tmp-<pid>-<8 random base-32 digits>"
    const std::string prefix = d / "r.json.tmp-" + std::to_string(::getpid()) + "-";
    CHECK(temp.rfind(prefix, 0) == 0);
    CHECK(temp.size() == prefix.size() + 8);
    CHECK(exists(temp));
    out.write("{}\n");
    CHECK_FALSE(exists(d / "r.json"));
  }  // not committed
  CHECK_FALSE(exists(temp));
  CHECK_FALSE(exists(d / "r.json"));
  {
    OutputFile out(d / "r.json");
    out.write("done\n");
    out.commit();
    CHECK(out.committed());
  }
  CHECK(get(d / "r.json") == "done\n");
  CHECK_FALSE(exists(temp));
}

TEST_CASE("an existing output needs overwrite; directories and pipes are refused") {
  ScratchDir d;
  put(d / "old.h5", "old");
  CHECK_THROWS_WITH_AS(OutputFile(d / "old.h5", Existing::refuse),
                       (d / "old.h5" + " exists (use --force to replace it)").c_str(), UsageError);
  CHECK(get(d / "old.h5") == "old");
  CHECK_THROWS_AS(OutputFile(d.path), Error);
  REQUIRE(::mkfifo((d / "fifo").c_str(), 0644) == 0);
  CHECK_THROWS_AS(OutputFile(d / "fifo"), Error);
  CHECK_THROWS_WITH_AS(OutputFile(d / "nodir/r.json"),
                       (d / "nodir/r.json" + ": cannot write there: directory " + d.path +
                        "/nodir: No such file or directory")
                           .c_str(),
                       Error);
}

TEST_CASE("a symbolic link is written through and kept") {
  ScratchDir d;
  ::mkdir((d / "sub").c_str(), 0755);
  put(d / "sub/real.json", "old");
  REQUIRE(::symlink("sub/real.json", (d / "link.json").c_str()) == 0);
  {
    OutputFile out(d / "link.json");
    CHECK(out.resolved() == d / "sub/real.json");
    CHECK(out.temp_path().rfind(d / "sub/real.json.tmp-", 0) == 0);  // same directory
    out.write("new");
    out.commit();
  }
  struct stat st;
  REQUIRE(::lstat((d / "link.json").c_str(), &st) == 0);
  CHECK(S_ISLNK(st.st_mode));
  CHECK(get(d / "sub/real.json") == "new");
}

TEST_CASE("the signal handler's registry removes live temporaries only") {
  ScratchDir d;
  OutputFile live(d / "a.h5");
  {
    OutputFile done(d / "b.h5");
    done.commit();
  }
  remove_registered_temps();
  CHECK_FALSE(exists(live.temp_path()));
  CHECK(exists(d / "b.h5"));
}

TEST_CASE("a temporary is never a name planted ahead of time, and two never share a name") {
  ScratchDir d;
  put(d / "victim", "precious");
  // The name a temporary had before (predictable from the pid), planted as a link to a victim.
  const std::string pid = std::to_string(::getpid());
  REQUIRE(::symlink((d / "victim").c_str(), (d / "out.json.tmp-" + pid).c_str()) == 0);
  {
    OutputFile a(d / "out.json");
    OutputFile b(d / "out.json");
    CHECK(a.temp_path() != b.temp_path());
    a.write("report");
    a.commit();
  }
  CHECK(get(d / "victim") == "precious");
  CHECK(get(d / "out.json") == "report");
  struct stat st;
  REQUIRE(::lstat((d / "out.json.tmp-" + pid).c_str(), &st) == 0);
  CHECK(S_ISLNK(st.st_mode));  // left as it was, not followed, not removed
}

TEST_CASE("libhdf5 and others open the temporary through the descriptor") {
  ScratchDir d;
  OutputFile out(d / "c.h5");
  const std::string p = out.open_path();
  CHECK(p.rfind("/proc/self/fd/", 0) == 0);
  // Whatever is put at the temporary's name meanwhile, the open path is the file made first.
  struct stat a, b;
  REQUIRE(::stat(p.c_str(), &a) == 0);
  REQUIRE(::stat(out.temp_path().c_str(), &b) == 0);
  CHECK(a.st_ino == b.st_ino);
  REQUIRE(::unlink(out.temp_path().c_str()) == 0);
  put(out.temp_path(), "swapped in");
  std::ofstream(p, std::ios::binary) << "through the descriptor";
  CHECK(get(out.temp_path()) == "swapped in");
}

TEST_CASE("a read-only output is replaced only with --force (Existing::replace)") {
  ScratchDir d;
  put(d / "r.json", "old");
  REQUIRE(::chmod((d / "r.json").c_str(), 0444) == 0);
  CHECK_THROWS_WITH_AS(
      OutputFile(d / "r.json"),
      (d / "r.json" + " exists and is read-only (mode 0444); use --force to replace it").c_str(),
      UsageError);
  CHECK(get(d / "r.json") == "old");
  {
    OutputFile out(d / "r.json", Existing::replace);
    out.write("new");
    out.commit();
  }
  CHECK(get(d / "r.json") == "new");
  struct stat st;
  REQUIRE(::stat((d / "r.json").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0444);  // the mode it had
  // A writable one is replaced without --force, as reports are run after run.
  put(d / "w.json", "old");
  {
    OutputFile out(d / "w.json");
    out.write("new");
    out.commit();
  }
  CHECK(get(d / "w.json") == "new");
}

TEST_CASE("without --force, a file that appears while the output is written is kept") {
  ScratchDir d;
  OutputFile out(d / "c.h5", Existing::refuse);
  out.write("ours");
  put(d / "c.h5", "theirs");  // another process, between the check and the rename
  CHECK_THROWS_AS(out.commit(), UsageError);
  CHECK(get(d / "c.h5") == "theirs");
  out.discard();
  CHECK_FALSE(exists(out.temp_path()));
  // With --force it is replaced.
  OutputFile forced(d / "c.h5", Existing::replace);
  forced.write("ours");
  forced.commit();
  CHECK(get(d / "c.h5") == "ours");
}

TEST_CASE("an output name of up to 255 bytes gets a temporary beside it") {
  ScratchDir d;
  for (size_t len : {200, 240, 246, 250, 255}) {
    CAPTURE(len);
    const std::string name = std::string(len - 5, 'n') + ".json";
    {
      OutputFile out(d / name);
      CHECK(out.temp_path().size() - d.path.size() - 1 <= 255);
      CHECK(out.temp_path().find(".tmp-") != std::string::npos);
      out.write("x");
      out.commit();
    }
    CHECK(get(d / name) == "x");
  }
}

TEST_CASE("commit_outputs renames every output, skipping discarded ones") {
  ScratchDir d;
  OutputFile a(d / "a.json"), b(d / "b.xml"), c(d / "c.h5");
  a.write("a");
  b.write("b");
  c.discard();  // trouble kept it from being complete
  commit_outputs({&a, nullptr, &b, &c}, 0);
  CHECK(get(d / "a.json") == "a");
  CHECK(get(d / "b.xml") == "b");
  CHECK_FALSE(exists(d / "c.h5"));
  CHECK_FALSE(exists(c.temp_path()));
}

namespace {
// Runs `body` in a child process with the exit handlers installed; its exit status, or
// 1000 + the signal that ended it.
template <class F>
int in_child(F body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(STDERR_FILENO);  // the handlers' one line is not this test's output
    // As a command starts: default dispositions (doctest's own handlers, and a SIGHUP ignored
    // by whatever started the test, would otherwise be kept, as they are meant to be).
    for (int s = 1; s < NSIG; ++s)
      if (s != SIGKILL && s != SIGSTOP) ::signal(s, SIG_DFL);
    install_exit_signal_handlers();
    body();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
}
}  // namespace

TEST_CASE("every ending signal removes the temporaries and exits 128 + N") {
  ScratchDir d;
  for (int sig : {SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGALRM, SIGXCPU, SIGVTALRM, SIGPROF,
                  SIGRTMIN + 3}) {
    CAPTURE(sig);
    const int rc = in_child([&] {
      OutputFile out(d / "o.h5");
      out.write(std::string(1 << 16, 'x'));
      ::raise(sig);
      ::_exit(99);  // not reached
    });
    CHECK(rc == 128 + sig);
    CHECK(std::system(("test -z \"$(ls -A '" + d.path + "')\"").c_str()) == 0);
  }
  // SIGPIPE is ignored (a write to a closed pipe fails with EPIPE instead).
  CHECK(in_child([] { ::raise(SIGPIPE); }) == 0);
  // SIGQUIT removes the temporaries, then takes its default action (a core dump).
  CHECK(in_child([&] {
          OutputFile out(d / "q.h5");
          ::raise(SIGQUIT);
        }) == 1000 + SIGQUIT);
  CHECK_FALSE(exists(d / "q.h5"));
  CHECK(std::system(("test -z \"$(ls -A '" + d.path + "')\"").c_str()) == 0);
}

TEST_CASE("a signal while outputs are committed waits; after, the run ends as it would have") {
  ScratchDir d;
  // A signal in the middle of the commit: every output is renamed, and the run's own status
  // (here 1: mismatches found) is the exit status, not 128 + N.
  CHECK(in_child([&] {
          OutputFile a(d / "a.json"), b(d / "b.xml");
          a.write("a");
          b.write("b");
          {
            DeferSignals hold;  // as commit_outputs holds them
            ::raise(SIGTERM);
            commit_outputs({&a, &b}, 1);
          }
          ::_exit(1);
        }) == 1);
  CHECK(get(d / "a.json") == "a");
  CHECK(get(d / "b.xml") == "b");
  // A signal after the commit: the run is complete; it exits with the run's status.
  CHECK(in_child([&] {
          OutputFile a(d / "c.json");
          a.write("c");
          commit_outputs({&a}, 0);
          ::raise(SIGINT);
          ::_exit(5);  // not reached: the handler exits with the run's status
        }) == 0);
  CHECK(get(d / "c.json") == "c");
  // A signal held while a commit fails is acted on when the hold ends: 128 + N, nothing left.
  CHECK(in_child([&] {
          OutputFile a(d / "e.json", Existing::refuse);
          a.write("e");
          put(d / "e.json", "theirs");
          DeferSignals hold;
          ::raise(SIGHUP);
          try {
            commit_outputs({&a}, 0);
          } catch (const Error&) {
          }
        }) == 128 + SIGHUP);
  CHECK(get(d / "e.json") == "theirs");
  CHECK(std::system(("test -z \"$(ls -A '" + d.path + "' | grep tmp-)\"").c_str()) == 0);
}

TEST_CASE("out of memory text and sizes") {
  CHECK(human_bytes(512) == "512 B");
  CHECK(human_bytes(1.5 * 1024 * 1024 * 1024) == "1.50 GiB");
  note_failed_allocation(size_t(3) << 30);
  CHECK(out_of_memory_text() == "out of memory (a request for 3.00 GiB failed)");
  note_failed_allocation(0);
  CHECK(out_of_memory_text() == "out of memory");
}

TEST_CASE("resize_to_overwrite: memory kept where it fits, replaced with room where not") {
  std::vector<float> v(100, 7.0f);
  const float* p = v.data();
  resize_to_overwrite(v, 60);  // fits: same memory, old values left (the caller overwrites)
  CHECK(v.size() == 60);
  CHECK(v.data() == p);
  CHECK(v[59] == 7.0f);
  resize_to_overwrite(v, 100);  // back within the capacity: still the same memory
  CHECK(v.data() == p);
  resize_to_overwrite(v, 800);  // too small: a new buffer with an eighth more room
  CHECK(v.size() == 800);
  CHECK(v.capacity() >= 900);
  p = v.data();
  resize_to_overwrite(v, 880);  // a piece a little larger fits the room
  CHECK(v.data() == p);
}
