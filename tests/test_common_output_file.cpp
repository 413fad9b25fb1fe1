// OutputFile and check_output_clashes (common/output_file.hpp): identity by device and inode
// whatever the spelling, the temporary made up front, commit / discard, symbolic links written
// through, the signal handler's registry.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/error.hpp"
#include "common/memory.hpp"
#include "common/output_file.hpp"

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
    CHECK(temp == d / "r.json.tmp-" + std::to_string(::getpid()));
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
  CHECK_THROWS_WITH_AS(OutputFile(d / "old.h5", false, "use --force to replace it"),
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
